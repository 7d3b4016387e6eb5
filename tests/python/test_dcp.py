"""torch.distributed.checkpoint folders from Python: ckpt.load(DIR) gives what torch's
dcp_to_torch_save saves, and safe_open(DIR).get_slice(name)[a:b] reads only the chunks that meet
the slice (a tensor-parallel rank's part). The folders are made by torch in this session
(tests/interop/dcp_make.py: torchrun with 4 ranks on the CPU, and one process)."""

import os
import shutil

import pytest
import torch

import ckpt

pytestmark = pytest.mark.skipif(int(torch.__version__.split(".")[0]) < 2,
                                reason="DCP folders are made by torch 2.x")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    import dcp_make
    return dcp_make.make_folders(str(tmp_path_factory.mktemp("dcp")))


def same(a, b, path="root"):
    assert type(a) is type(b) or (isinstance(a, dict) and isinstance(b, dict)), (path, a, b)
    if isinstance(b, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), path
    elif isinstance(b, dict):
        assert list(a) == list(b), path
        for k in b:
            same(a[k], b[k], f"{path}.{k}")
    elif isinstance(b, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}.{i}")
    else:
        assert a == b, path


@pytest.mark.parametrize("name", ["dtensor", "fsdp", "single"])
@pytest.mark.parametrize("mmap", [False, True])
def test_load_equals_dcp_to_torch_save(dirs, name, mmap):
    want = torch.load(dirs[name] + ".pt", weights_only=False)
    same(ckpt.load(dirs[name], mmap=mmap), want)


def test_open_reports_the_folder(dirs):
    c = ckpt.open(dirs["dtensor"])
    assert c.format == "torch-dcp"
    assert c.properties["data_files"] == "4"


def test_get_slice_reads_only_the_chunks_it_needs(dirs, tmp_path):
    d = tmp_path / "d"
    shutil.copytree(dirs["dtensor"], d)
    want = torch.load(dirs["dtensor"] + ".pt", weights_only=False)["model"]
    with ckpt.safe_open(str(d), framework="pt") as f:
        # model.rows is Shard(0) over 4 ranks: rows 0-3 are rank 0's, in __0_0.distcp only.
        # Damage every other data file in place: a slice of rank 0's rows never reads them.
        for r in (1, 2, 3):
            p = d / f"__{r}_0.distcp"
            os.chmod(p, 0o644)
            with open(p, "r+b") as fh:
                fh.write(b"\0" * os.path.getsize(p))
        assert torch.equal(f.get_slice("model.rows")[0:4], want["rows"][0:4])
        assert torch.equal(f.get_slice("model.rows")[1:3, 2:5], want["rows"][1:3, 2:5])
        assert torch.equal(f.get_slice("model.rows")[2], want["rows"][2])
        # Rows of other ranks come from the damaged files: they differ.
        assert not torch.equal(f.get_slice("model.rows")[4:8], want["rows"][4:8])


@pytest.mark.parametrize("key", ["rows", "uneven", "cols", "cube", "repl", "half", "plain"])
def test_get_slice_equals_indexing(dirs, key):
    want = torch.load(dirs["dtensor"] + ".pt", weights_only=False)["model"][key]
    with ckpt.safe_open(dirs["dtensor"], framework="pt") as f:
        s = f.get_slice(f"model.{key}")
        assert s.get_shape() == list(want.shape)
        for idx in [slice(None), slice(1, 3), (slice(None), slice(1, 2)), -1, (0, slice(0, 2)),
                    slice(None, None, 2)]:
            assert torch.equal(s[idx], want[idx]), idx
        assert torch.equal(f.get_tensor(f"model.{key}"), want)


def test_convert_streams_within_memory_budget(dirs, tmp_path):
    """Checkpoint.convert(memory_budget=) of a folder: the same state as dcp_to_torch_save, with
    a budget below every tensor (each is then held alone); a budget of 0 is refused."""
    from safetensors.torch import load_file

    want = {k: v for k, v in torch.load(dirs["dtensor"] + ".pt", weights_only=False)["model"]
            .items() if isinstance(v, torch.Tensor)}
    c = ckpt.open(dirs["dtensor"])
    out = tmp_path / "out.safetensors"
    report = c.convert(str(out), memory_budget=64)
    assert report["format"] == "safetensors"
    got = load_file(str(out))
    for k, t in want.items():
        assert torch.equal(got["model." + k], t), k
    with pytest.raises(ckpt.InvalidArgumentError, match="memory_budget"):
        c.convert(str(tmp_path / "zero.safetensors"), memory_budget=0)




@pytest.mark.parametrize("target", ["dcp", "sharded"])
def test_convert_progress_raising_after_the_commit_is_marked(dirs, tmp_path, target):
    """Checkpoint.convert from a DCP folder to a folder target (DCP) or a shard set: a progress
    callable that raises at done == total raises after the output was committed, marked
    ckpt_committed, and the output is whole."""
    src = dirs["dtensor"]

    def at_end(done, total):
        if done >= total:
            raise KeyError("stop")

    if target == "dcp":
        out, kw = tmp_path / "done", {"format": "dcp"}
    else:
        out, kw = tmp_path / "done.safetensors", {"max_shard_size": 1024}
    with pytest.raises(KeyError) as e:
        ckpt.open(src).convert(str(out), progress=at_end, **kw)
    assert e.value.ckpt_committed is True
    index = list(tmp_path.glob("*.index.json"))
    if target == "sharded":
        assert len(index) == 1 and len(list(tmp_path.glob("done*.safetensors"))) > 1
    got, want = ckpt.load(str(index[0] if index else out)), ckpt.load(src)
    if target == "sharded":  # safetensors keeps the flattened names
        flat = {}

        def walk(v, name):
            if isinstance(v, dict):
                for k, x in v.items():
                    walk(x, f"{name}.{k}" if name else str(k))
            elif isinstance(v, torch.Tensor):
                flat[name] = v

        walk(want, "")
        assert sorted(got) == sorted(flat)
        got, want = {k: got[k] for k in flat}, flat
    same(got, want)
