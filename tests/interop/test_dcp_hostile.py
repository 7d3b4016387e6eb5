"""Hostile torch.distributed.checkpoint folders: a `.metadata` whose chunks overlap, leave holes,
fall outside their tensor or point past a data file's end, unknown storage layouts, code in the
pickle, data files outside the folder. Each is refused with a typed error naming the data file
(or .metadata) and the key, and nothing in the pickle is ever run.

The folders start as a real one-process torch save; the metadata is changed through torch's own
classes and written back with pickle, as torch writes it.
"""

import os
import pickle
import shutil

import pytest
import torch

pytestmark = pytest.mark.skipif(int(torch.__version__.split(".")[0]) < 2,
                                reason="DCP folders are made by torch 2.x")

CORRUPT, UNSUPPORTED, TRUNCATED, NOT_FOUND = "corrupt", "unsupported", "truncated", "not_found"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    import torch.distributed.checkpoint as dcp

    d = tmp_path_factory.mktemp("dcp_hostile") / "base"
    g = torch.Generator().manual_seed(1)
    dcp.save({"w": torch.randn(8, 4, generator=g), "b": torch.randn(4, generator=g), "n": 3},
             checkpoint_id=str(d), no_dist=True)
    return d


def variant(base, tmp_path, change):
    d = tmp_path / "v"
    shutil.copytree(base, d)
    with open(d / ".metadata", "rb") as f:
        md = pickle.load(f)
    change(md, d)
    with open(d / ".metadata", "wb") as f:
        pickle.dump(md, f)
    return d


def refused(ckpt, d, code, *words):
    r = ckpt.run("ls", d)
    assert r.returncode != 0, r.stdout
    assert f"[{code}]" in r.stderr or code in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)
    return r.stderr


def chunks(md, key):
    return md.state_dict_metadata[key].chunks


def test_hole(ckpt, base, tmp_path):
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    def change(md, d):
        md.state_dict_metadata["w"].chunks = [ChunkStorageMetadata(torch.Size([0, 0]),
                                                                   torch.Size([4, 4]))]
    refused(ckpt, variant(base, tmp_path, change), CORRUPT, "w", "hole")


def test_overlap(ckpt, base, tmp_path):
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    def change(md, d):
        c = chunks(md, "w")
        c.append(ChunkStorageMetadata(torch.Size([2, 0]), torch.Size([2, 4])))
    refused(ckpt, variant(base, tmp_path, change), CORRUPT, "w", "overlaps")


def test_outside(ckpt, base, tmp_path):
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    def change(md, d):
        md.state_dict_metadata["w"].chunks = [ChunkStorageMetadata(torch.Size([0, 0]),
                                                                   torch.Size([9, 4]))]
    refused(ckpt, variant(base, tmp_path, change), CORRUPT, "w", "outside", "__0_0.distcp")


def test_wrong_rank(ckpt, base, tmp_path):
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    def change(md, d):
        md.state_dict_metadata["w"].chunks = [ChunkStorageMetadata(torch.Size([0]),
                                                                   torch.Size([8]))]
    refused(ckpt, variant(base, tmp_path, change), CORRUPT, "w", "dimensions")


def test_item_past_the_end(ckpt, base, tmp_path):
    def change(md, d):
        for k, v in md.storage_data.items():
            if k.fqn == "b":
                v.offset = os.path.getsize(d / "__0_0.distcp") - 10
    refused(ckpt, variant(base, tmp_path, change), TRUNCATED, "b", "__0_0.distcp",
            "passes the end")


def test_missing_data_file(ckpt, base, tmp_path):
    def change(md, d):
        for v in md.storage_data.values():
            v.relative_path = "__7_0.distcp"
    refused(ckpt, variant(base, tmp_path, change), NOT_FOUND, "__7_0.distcp")


def test_data_file_outside_the_folder(ckpt, base, tmp_path):
    def change(md, d):
        for v in md.storage_data.values():
            v.relative_path = "../../etc/passwd"
    refused(ckpt, variant(base, tmp_path, change), CORRUPT, "plain file name")


def test_transforms_are_an_unknown_layout(ckpt, base, tmp_path):
    def change(md, d):
        for v in md.storage_data.values():
            v.transform_descriptors = ["zstd"]
    refused(ckpt, variant(base, tmp_path, change), UNSUPPORTED, "transforms")


def test_safetensors_serialised_items_are_read_and_checked_against_their_blob(ckpt, tmp_path):
    """torch's FileSystemWriter(serialization_format=SAFETENSORS) writes one safetensors blob per
    file that every tensor item of the file points at (torch's own FileSystemReader cannot read
    it back): each chunk is found in the blob by name; a blob that lacks it is refused by name,
    not misread."""
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file
    try:
        from torch.distributed.checkpoint.filesystem import SerializationFormat
    except ImportError:
        pytest.skip("this torch has no SerializationFormat")
    d = tmp_path / "st"
    w = torch.arange(32, dtype=torch.float32).reshape(8, 4)
    writer = dcp.FileSystemWriter(str(d), serialization_format=SerializationFormat.SAFETENSORS)
    flag = torch.tensor([True])  # an item of 1 byte: shorter than a zip's magic number
    dcp.save({"w": w, "flag": flag, "n": 3}, storage_writer=writer, no_dist=True)
    ckpt.ok("convert", d, tmp_path / "out.safetensors")
    got = load_file(str(tmp_path / "out.safetensors"))
    assert torch.equal(got["w"], w) and torch.equal(got["flag"], flag)
    data = d / "__0_0.distcp"
    raw = data.read_bytes()
    assert raw.count(b'"w":{"dtype"') == 1
    data.write_bytes(raw.replace(b'"w":{"dtype"', b'"v":{"dtype"'))
    refused(ckpt, d, CORRUPT, "w", "__0_0.distcp", "not in the safetensors blob")


def test_unknown_storage_metadata_class(ckpt, base, tmp_path):
    def change(md, d):
        md.state_dict_metadata["b"] = {"not": "a storage metadata"}
    refused(ckpt, variant(base, tmp_path, change), UNSUPPORTED, "b")


def test_chunk_of_another_dtype(ckpt, base, tmp_path):
    def change(md, d):
        md.state_dict_metadata["w"].properties.dtype = torch.float64
    refused(ckpt, variant(base, tmp_path, change), CORRUPT, "w", "float64")


class Boom:
    """Pickles as a call of os.system: a reader that runs code would create the marker."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_code_in_the_metadata_is_never_run(ckpt, base, tmp_path):
    marker = tmp_path / "ran"

    def change(md, d):
        md.storage_meta = Boom(marker)
        md.planner_data["w"] = ("w",)
    d = variant(base, tmp_path, change)
    ckpt.ok("ls", d)
    assert not marker.exists()

    def change2(md, d):
        md.state_dict_metadata["w"] = Boom(marker)
    d2 = tmp_path / "v2"
    shutil.copytree(base, d2)
    with open(d2 / ".metadata", "rb") as f:
        md = pickle.load(f)
    change2(md, d2)
    with open(d2 / ".metadata", "wb") as f:
        pickle.dump(md, f)
    refused(ckpt, d2, UNSUPPORTED, "w")
    assert not marker.exists()


def test_not_a_pickle(ckpt, base, tmp_path):
    d = tmp_path / "v"
    shutil.copytree(base, d)
    (d / ".metadata").write_bytes(b"\x80\x04garbage")
    r = ckpt.run("ls", d)
    assert r.returncode != 0 and ".metadata" in r.stderr


def _moved_outside(d, name, tmp_path):
    """Moves d/name out of the folder and leaves a symbolic link to it in its place."""
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    os.replace(d / name, outside / name)
    os.symlink(outside / name, d / name)


def test_data_file_linked_outside_the_folder(ckpt, base, tmp_path):
    """A data file that is a symbolic link out of the folder is refused, as a shard index's
    shards and ONNX external data are."""
    d = variant(base, tmp_path, lambda md, d: None)
    _moved_outside(d, "__0_0.distcp", tmp_path)
    refused(ckpt, d, CORRUPT, "__0_0.distcp", "resolves outside")


def test_metadata_linked_outside_the_folder(ckpt, base, tmp_path):
    d = variant(base, tmp_path, lambda md, d: None)
    _moved_outside(d, ".metadata", tmp_path)
    refused(ckpt, d, CORRUPT, ".metadata", "resolves outside")


def test_items_sharing_bytes(ckpt, base, tmp_path):
    """Many entries whose items are the same bytes of one data file would each load a copy of
    them (a folder of a few megabytes loading gigabytes): refused at open."""
    from torch.distributed.checkpoint.metadata import MetadataIndex

    def change(md, d):
        (key, info), = [(k, v) for k, v in md.storage_data.items() if k.fqn == "w"]
        for i in range(200):
            md.state_dict_metadata[f"w{i}"] = md.state_dict_metadata["w"]
            md.storage_data[MetadataIndex(f"w{i}", key.offset)] = info
    refused(ckpt, variant(base, tmp_path, change), CORRUPT, "__0_0.distcp", "share bytes")


def test_huge_metadata_is_refused_before_it_is_read(ckpt, base, tmp_path):
    """A sparse 3 GiB `.metadata` is refused by its size (Limits::max_metadata_bytes), naming it,
    without a byte of it in memory: the command runs with 512 MiB of address space to spare."""
    import resource
    import subprocess

    d = variant(base, tmp_path, lambda md, d: None)
    os.truncate(d / ".metadata", 3 << 30)

    def small():  # ASan reserves terabytes of shadow address space: no cap under it
        if "asan" not in ckpt.path:
            resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    r = subprocess.run([ckpt.path, "ls", str(d)], capture_output=True, text=True,
                       preexec_fn=small, timeout=60)
    assert r.returncode == 7, r.stderr
    assert ".metadata" in r.stderr and "max_metadata_bytes" in r.stderr, r.stderr


def test_thousands_of_data_files_under_a_low_open_file_limit(ckpt, tmp_path):
    """4096 data files written and read back with the process limited to 1024 open files (soft
    and hard, as `ulimit -n 1024` sets them): the writer writes them a group at a time, the
    reader keeps a bounded cache of open files."""
    import resource
    import subprocess

    from safetensors.torch import load_file

    g = torch.Generator().manual_seed(3)
    sd = {"w": torch.randn(4096, 3, generator=g), "b": torch.randn(5000, generator=g)}
    src = tmp_path / "src.pt"
    torch.save(sd, src)

    def low():
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    def run(*args):
        r = subprocess.run([ckpt.path, *map(str, args)], capture_output=True, text=True,
                           preexec_fn=low, timeout=600)
        assert r.returncode == 0, r.stderr
        return r
    out = tmp_path / "many"
    run("convert", src, out, "--to", "dcp", "--dcp-files", "4096")
    assert len(list(out.glob("*.distcp"))) == 4096
    back = tmp_path / "back.safetensors"
    run("convert", out, back, "--to", "safetensors")
    got = load_file(back)
    assert set(got) == set(sd)
    for k, v in sd.items():
        assert torch.equal(got[k], v), k
