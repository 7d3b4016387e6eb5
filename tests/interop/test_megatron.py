"""Megatron-core `torch_dist` checkpoints, written by megatron-core itself in this session
(megatron_make.py: megatron.core.dist_checkpointing.save under `torchrun --nproc-per-node 2`,
gloo on the CPU, in the megatron venv that scripts/install-peers.sh layers on the peers):

  hand  ShardedTensors split along dim 0 and 1, replicated, stacked (prepend_axis_num), in
        bfloat16 too; ShardedObjects; plain values (common.pt)
  gpt   a GPTModel with tensor parallelism 2 (the local layer spec) on the CPU

A folder is DCP's `.metadata` + `__<rank>_<n>.distcp`, plus `metadata.json` (the backends) and
`common.pt` (torch.save of the state that is not sharded). ckpt must give every global tensor
equal to megatron's own dist_checkpointing.load_plain_tensors, common.pt's state under `common`
equal to load_common_state_dict, and each ShardedObject under its unique key as the list
megatron stored (what dist_checkpointing.load unwraps), through ls, load, info, and convert to
safetensors and pt.
"""

import os
import shutil

import pytest
import torch

import megatron_make  # tests/interop: the folders and the comparison

pytestmark = pytest.mark.skipif(int(torch.__version__.split(".")[0]) < 2,
                                reason="megatron-core runs on torch 2.x")

NOT_FOUND = 2


@pytest.fixture(scope="session")
def megatron(tmp_path_factory):
    python, why = megatron_make.venv_python()
    if not python:
        pytest.skip(f"megatron-core cannot be installed here: {why}")
    folders, errors = megatron_make.make(str(tmp_path_factory.mktemp("megatron")), python)
    return folders, errors


def folder(megatron, name):
    folders, errors = megatron
    if name == "hand":  # the hand-made state dict must save: that is the format under test
        assert not errors.get(name), errors.get(name)
    elif errors.get(name):
        pytest.skip(f"megatron-core could not make the {name} folder on the CPU: "
                    f"{errors[name].strip().splitlines()[-1]}")
    return folders[name]


def reference(megatron, name):
    return torch.load(folder(megatron, name) + ".ref.pt", weights_only=True)


def tensors_in(value, prefix):
    """{name: tensor} of the tensors inside a value, named as ckpt names them."""
    if isinstance(value, torch.Tensor):
        return {prefix: value}
    items = value.items() if isinstance(value, dict) else (
        enumerate(value) if isinstance(value, (list, tuple)) else ())
    out = {}
    for k, v in items:
        out.update(tensors_in(v, f"{prefix}.{k}"))
    return out


def expected_tensors(ref):
    """Every tensor ckpt lists: the global tensors, then common.pt's under `common.`."""
    out = dict(ref["tensors"])
    out.update(tensors_in(ref["common"], "common"))
    for key, obj in ref["objects"].items():
        out.update(tensors_in([obj], key))
    return out


NAMES = ["hand", "gpt"]


@pytest.mark.parametrize("name", NAMES)
def test_ls_names_shapes_dtypes(ckpt, megatron, name):
    ref = expected_tensors(reference(megatron, name))
    got = {t["name"]: t for t in ckpt.json("ls", folder(megatron, name), "--json")["tensors"]}
    assert sorted(got) == sorted(ref)
    for k, t in ref.items():
        assert got[k]["shape"] == list(t.shape), k
        assert got[k]["dtype"] == str(t.dtype).replace("torch.", ""), k


def test_hand_folder_holds_what_was_saved(megatron):
    """The reference is megatron's own reading; it must hold what megatron_make.py saved."""
    ref = reference(megatron, "hand")
    assert sorted(ref["tensors"]) == ["hand.cols", "hand.half", "hand.repl", "hand.rows",
                                      "hand.stack"]
    assert ref["tensors"]["hand.stack"].shape == (2, 3, 5)
    assert ref["tensors"]["hand.cols"].shape == (3, 8)
    assert ref["common"]["step"] == 12 and ref["common"]["name"] == "run-a"
    assert ref["objects"]["hand.per_rank/shard_1_2"] == {"rank": 1, "lrs": [0.1, 0.01]}
    d = folder(megatron, "hand")
    assert {".metadata", "common.pt", "metadata.json"} <= set(os.listdir(d))


@pytest.mark.parametrize("name", NAMES)
def test_convert_to_safetensors_equals_megatrons_load(ckpt, megatron, name, tmp_path):
    from safetensors.torch import load_file

    ref = expected_tensors(reference(megatron, name))
    out = tmp_path / "out.safetensors"
    ckpt.ok("convert", folder(megatron, name), out)
    got = load_file(str(out))
    assert sorted(got) == sorted(ref)
    for k, t in ref.items():
        assert got[k].dtype == t.dtype and torch.equal(got[k], t), k


@pytest.mark.parametrize("weights_only", [True, False])
@pytest.mark.parametrize("name", NAMES)
def test_convert_to_pt_keeps_tensors_objects_and_common(ckpt, megatron, name, weights_only,
                                                        tmp_path):
    ref = reference(megatron, name)
    out = tmp_path / "out.pt"
    ckpt.ok("convert", folder(megatron, name), out)
    got = torch.load(str(out), weights_only=weights_only)
    want = {**ref["tensors"], "common": ref["common"],
            **{k: [v] for k, v in ref["objects"].items()}}
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert megatron_make.same(v, got[k]), k


def test_info_names_the_backends(ckpt, megatron):
    info = ckpt.json("info", folder(megatron, "hand"), "--json")
    assert info["format"] == "torch-dcp"
    assert info["properties"]["megatron_sharded_backend"] == "torch_dist 1"
    assert info["properties"]["megatron_common_backend"].startswith("torch")


@pytest.mark.parametrize("mode", ["eager", "mmap", "stream"])
def test_load_modes(ckpt, megatron, mode):
    r = ckpt.run("load", folder(megatron, "hand"), "--mode", mode)
    assert r.returncode == 0, r.stderr


def test_missing_common_pt_is_refused_naming_it(ckpt, megatron, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(folder(megatron, "hand"), d)
    os.remove(d / "common.pt")
    r = ckpt.run("ls", d)
    assert r.returncode == NOT_FOUND, r.stderr
    assert "common.pt" in r.stderr


def test_missing_data_file_is_refused_naming_it(ckpt, megatron, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(folder(megatron, "hand"), d)
    data = sorted(f for f in os.listdir(d) if f.endswith(".distcp"))
    os.remove(d / data[-1])
    r = ckpt.run("ls", d)
    assert r.returncode == NOT_FOUND, r.stderr
    assert data[-1] in r.stderr


def test_another_tools_metadata_json_leaves_common_pt_alone(ckpt, megatron, tmp_path):
    """Only Megatron's metadata.json (a sharded_backend) brings common.pt in."""
    d = tmp_path / "m"
    shutil.copytree(folder(megatron, "hand"), d)
    (d / "metadata.json").write_text('{"producer": "someone else"}')
    names = [t["name"] for t in ckpt.json("ls", d, "--json")["tensors"]]
    assert "hand.rows" in names and not any(n.startswith("common.") for n in names)


def test_reshaped_flattened_range_tensors_are_refused_naming_them(ckpt, megatron, tmp_path):
    """Megatron-core before 0.14 saved a ShardedTensor with a flattened_range (its distributed
    optimizer's state) reshaped to [fragments per dimension..., local numel] and put the real
    shape in Metadata.mcore_data ({key: {"nd_reformulated_orig_global_shape": shape}}, as
    megatron-core 0.13.1 writes it; 0.16 refuses flattened_range, so this folder is megatron's
    with that attribute added). ckpt does not assemble them: refused, naming the key."""
    import pickle

    from torch.distributed.checkpoint import FileSystemReader

    d = tmp_path / "m"
    shutil.copytree(folder(megatron, "hand"), d)
    md = FileSystemReader(str(d)).read_metadata()
    md.mcore_data = {"hand.rows": {"nd_reformulated_orig_global_shape": (6, 4)}}
    with open(d / ".metadata", "wb") as f:
        pickle.dump(md, f)
    r = ckpt.run("ls", d)
    assert r.returncode == 6, r.stderr  # unsupported
    assert "hand.rows" in r.stderr and "mcore_data" in r.stderr
