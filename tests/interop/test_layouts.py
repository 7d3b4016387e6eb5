"""Training layouts beyond the plain DCP folder, written by torch itself in this session
(layouts_make.py: `torchrun --nproc-per-node 2` on the CPU, gloo, a small Llama sharded by FSDP2
plus DTensors placed by hand):

  st          FileSystemWriter(serialization_format=SAFETENSORS): each .distcp holds a
              safetensors blob that every tensor item of the file points at
  ranklocal   dcp.save(use_collectives=False): one __<rank>.metadata per rank
  hf_dist     HuggingFaceStorageWriter(save_distributed=True): shard-<rank>-model-*.safetensors
  hf_cons     the same with enable_consolidation=True (hf_cons/sharded, and the consolidated
              model folder torch writes beside it)
  verl        torch.save(model.state_dict()) of the FSDP2 DTensors per rank, as verl's FSDP
              checkpoint manager names them: model_world_size_2_rank_<rank>.pt

Every tensor ckpt reads must equal the full tensor torch had (DTensor.full_tensor()), through
ls, load, convert to safetensors and pt, and an HF folder that from_pretrained loads with the
original model's logits.
"""

import json
import os
import shutil

import pytest
import torch

pytestmark = pytest.mark.skipif(int(torch.__version__.split(".")[0]) < 2,
                                reason="the layouts are made by torch 2.x")

DCP_LAYOUTS = ["st", "ranklocal", "hf_dist", "hf_cons/sharded", "hf_cons", "verl"]


@pytest.fixture(scope="session")
def layouts(tmp_path_factory):
    try:
        import torch.distributed.checkpoint  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        pytest.skip("torch.distributed or transformers is not available")
    import layouts_make

    return layouts_make.make_layouts(str(tmp_path_factory.mktemp("layouts")))


def folder(layouts, name):
    return os.path.join(os.path.dirname(layouts["st"]), name)


def reference(layouts, name):
    """The full tensors the layout holds, as rank 0 saved them (torch.save)."""
    return torch.load(folder(layouts, name.split("/")[0] + ".ref.pt"), weights_only=True)


@pytest.mark.parametrize("name", DCP_LAYOUTS)
def test_ls_names_shapes_dtypes(ckpt, layouts, name):
    ref = reference(layouts, name)
    got = {t["name"]: t for t in ckpt.json("ls", folder(layouts, name), "--json")["tensors"]}
    assert sorted(got) == sorted(ref)
    for k, t in ref.items():
        assert got[k]["shape"] == list(t.shape), k
        assert got[k]["dtype"] == str(t.dtype).replace("torch.", ""), k


@pytest.mark.parametrize("name", DCP_LAYOUTS)
def test_convert_to_safetensors_equals_the_full_tensors(ckpt, layouts, name, tmp_path):
    from safetensors.torch import load_file

    ref = reference(layouts, name)
    out = tmp_path / "out.safetensors"
    ckpt.ok("convert", folder(layouts, name), out)
    got = load_file(str(out))
    assert sorted(got) == sorted(ref)
    for k, t in ref.items():
        assert got[k].dtype == t.dtype and torch.equal(got[k], t), k


@pytest.mark.parametrize("name", ["st", "ranklocal"])
def test_convert_to_pt_keeps_the_tree_and_values(ckpt, layouts, name, tmp_path):
    """The nested state dict, non-tensor values (bytes items) included, as dcp_to_torch_save
    rebuilds it; torch's own loader cannot read the safetensors items (see
    test_torch_cannot_load_safetensors_items) so the tree is held against what was saved."""
    out = tmp_path / "out.pt"
    ckpt.ok("convert", folder(layouts, name), out)
    got = torch.load(str(out), weights_only=True)
    assert got["extra"] == {"step": 12, "name": "run-a", "lrs": [0.1, 0.01]}
    ref = reference(layouts, name)
    for k, t in ref.items():
        top, rest = k.split(".", 1)
        assert torch.equal(got[top][rest], t), k


@pytest.mark.parametrize("mode", ["eager", "mmap", "stream"])
def test_load_modes(ckpt, layouts, mode):
    for name in ("st", "ranklocal", "hf_dist", "verl"):
        r = ckpt.run("load", folder(layouts, name), "--mode", mode)
        assert r.returncode == 0, (name, r.stderr)


def test_torch_cannot_load_safetensors_items(layouts):
    """torch 2.15's FileSystemReader slices each item at its offset and length and torch.loads
    it: every tensor item of a SAFETENSORS file points at the blob's header, so dcp.load fails.
    ckpt reads the folder (the tests above) by finding each tensor in the blob by name."""
    import torch.distributed.checkpoint as dcp

    ref = reference(layouts, "st")
    sd = {"model": {k[6:]: torch.empty_like(v) for k, v in ref.items() if k.startswith("model.")}}
    with pytest.raises(BaseException) as e:  # CheckpointException is a BaseException
        dcp.load(sd, checkpoint_id=folder(layouts, "st"), no_dist=True)
    assert "torch.load" in str(e.value) and "Weights only load failed" in str(e.value)


def test_rank_local_with_a_missing_rank_is_refused_naming_it(ckpt, layouts, tmp_path):
    d = tmp_path / "ranklocal"
    shutil.copytree(folder(layouts, "ranklocal"), d)
    os.rename(d / "__1.metadata", d / "__2.metadata")
    r = ckpt.run("ls", d)
    assert r.returncode != 0
    assert "__1.metadata" in r.stderr


def test_hf_shards_with_a_missing_shard_is_refused(ckpt, layouts, tmp_path):
    # Shard(0) tensors lose their first rows with shard 1: the chunks leave a hole.
    d = tmp_path / "hf"
    shutil.copytree(folder(layouts, "hf_dist"), d)
    os.remove(d / "shard-00001-model-00001-of-00001.safetensors")
    r = ckpt.run("ls", d)
    assert r.returncode != 0, r.stdout


@pytest.mark.parametrize("name", ["hf_dist", "hf_cons/sharded", "ranklocal", "st", "verl"])
def test_converts_to_an_hf_folder_that_from_pretrained_loads(ckpt, layouts, name, tmp_path):
    import transformers

    src = folder(layouts, name)
    out = tmp_path / "serve"
    out.mkdir()
    if name != "verl":  # verl's folder has it in huggingface/, which convert copies from
        shutil.copy(os.path.join(layouts["model"], "config.json"), out / "config.json")
    # The nested layouts hold the model under "model." (the state dict's key) and the hand-placed
    # tensors beside it; the flat ones hold the hand-placed tensors under "hand.".
    args = ["--drop", "hand.*", "--drop", "extra.*"]
    if name in ("ranklocal", "st"):
        args += ["--strip-prefix", "model."]  # renames run before keep/drop
    r = ckpt.ok("convert", src, f"{out}/", "--to", "safetensors", "--max-shard-size", "100KB",
                *args)
    if name == "verl":
        assert "copied from" in r.stdout and "huggingface" in r.stdout
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    ids = torch.tensor([[1, 5, 9, 200, 17, 3]])
    want = transformers.AutoModelForCausalLM.from_pretrained(layouts["model"]).eval()
    got = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    with torch.no_grad():
        assert torch.equal(got(ids).logits, want(ids).logits)


def test_verl_rank_file_alone_lists_its_shard(ckpt, layouts):
    """One rank's file is that rank's shards (DTensor._local_tensor), as torch.load gives them."""
    path = os.path.join(folder(layouts, "verl"), "model_world_size_2_rank_1.pt")
    want = torch.load(path, weights_only=False)
    got = {t["name"]: t for t in ckpt.json("ls", path, "--json")["tensors"]}
    assert set(want) <= set(got)  # and the mesh's rank map, a tensor in each DTensor's spec
    for k, v in want.items():
        assert got[k]["shape"] == list(v.to_local().shape), k


def test_verl_with_a_missing_rank_is_refused_naming_it(ckpt, layouts, tmp_path):
    d = tmp_path / "verl"
    shutil.copytree(folder(layouts, "verl"), d)
    os.remove(d / "model_world_size_2_rank_1.pt")
    r = ckpt.run("ls", d)
    assert r.returncode == 2, r.stderr
    assert "model_world_size_2_rank_1.pt" in r.stderr


@pytest.mark.parametrize("weights_only", [True, False])
def test_verl_rank_file_alone_converts_to_a_pt_of_its_shards(ckpt, layouts, tmp_path,
                                                             weights_only):
    """Converted alone, one rank's file is its shards: each DTensor is written as the plain
    tensor of its _local_tensor (a DTensor rebuilt around the shard would have the shard's size
    under the global spec), which torch.load reads with or without weights_only."""
    path = os.path.join(folder(layouts, "verl"), "model_world_size_2_rank_1.pt")
    want = {k: v.to_local() for k, v in torch.load(path, weights_only=False).items()}
    out = tmp_path / "rank1.pt"
    r = ckpt.ok("convert", path, out)
    got = torch.load(str(out), weights_only=weights_only)
    assert sorted(got) == sorted(want)
    # The report counts what was written: the mesh's tensor inside each DTensor's spec is not.
    nbytes = sum(v.numel() * v.element_size() for v in want.values())
    assert f"{len(want)} tensors (" in r.stdout and f"{nbytes / 1024:.1f} KiB of data" in r.stdout, \
        r.stdout
    for k, v in want.items():
        assert type(got[k]) is torch.Tensor, (k, type(got[k]))
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
