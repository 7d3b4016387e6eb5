"""Model folders as one checkpoint, and written as save_pretrained writes them: transformers'
own folders (GPT-2 and Llama shaped models made from configs, tied embeddings included) are
opened by their folder, converted into sharded safetensors folders, and loaded back with
from_pretrained, whose outputs must equal the original model's."""

import json
import os
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file  # noqa: E402


def _gpt2():
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=64,
                                  tie_word_embeddings=True)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _llama():
    cfg = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   hidden_size=64, intermediate_size=128, vocab_size=256,
                                   max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(1)
    return transformers.LlamaForCausalLM(cfg).eval()


MODELS = {"gpt2": _gpt2, "llama": _llama}
IDS = torch.tensor([[1, 5, 9, 200, 17, 3]])


def _save(model, folder, safe):
    """save_pretrained; for the .bin layout (transformers 5 writes safetensors only) the weights
    are torch.save(model.state_dict()) as pytorch_model.bin, which is what older transformers'
    save_pretrained(safe_serialization=False) wrote: tied weights share one storage."""
    model.save_pretrained(folder)
    if not safe:
        for f in os.listdir(folder):
            if f.startswith("model") and f.endswith((".safetensors", ".index.json")):
                os.remove(os.path.join(folder, f))
        torch.save(model.state_dict(), os.path.join(folder, "pytorch_model.bin"))


def _logits(model):
    with torch.no_grad():
        return model(IDS).logits


def _load(path):
    return transformers.AutoModelForCausalLM.from_pretrained(str(path)).eval()


@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "bin"])
def test_folder_converts_to_a_sharded_folder_that_from_pretrained_loads(ckpt, tmp_path, kind, safe):
    model = MODELS[kind]()
    src = tmp_path / "src"
    _save(model, src, safe)
    model.generation_config.save_pretrained(src)
    want = _logits(model)
    # The folder is one checkpoint: ls and the Python module open it by its name.
    listed = ckpt.json("ls", src, "--json")
    names = {t["name"] for t in listed["tensors"]}
    assert "lm_head.weight" in names or "transformer.wte.weight" in names or \
        "model.embed_tokens.weight" in names
    out = tmp_path / "out"
    r = ckpt.ok("convert", src, f"{out}/", "--to", "safetensors", "--max-shard-size", "100KB")
    assert "copied from" in r.stdout and "config.json" in r.stdout
    shards = sorted(p.name for p in out.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] > 0
    assert sorted(set(index["weight_map"].values())) == shards
    assert (out / "config.json").read_bytes() == (src / "config.json").read_bytes()
    assert (out / "generation_config.json").exists()
    for s in shards:  # {"format": "pt"}, as save_pretrained writes
        from safetensors import safe_open
        with safe_open(str(out / s), "pt") as f:
            assert f.metadata().get("format") == "pt"
    got = _load(out)
    assert torch.equal(_logits(got), want)
    if kind == "gpt2":  # tied: stored once, re-tied by from_pretrained
        assert got.lm_head.weight.data_ptr() == got.transformer.wte.weight.data_ptr()


def test_bin_with_tied_embeddings_converts_to_one_safetensors_file(ckpt, tmp_path):
    # The everyday conversion of a tied model: the alias is dropped as safetensors' save_model
    # drops it, without --copy-shared.
    model = _gpt2()
    src = tmp_path / "src"
    _save(model, src, False)
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(src / "config.json", out / "config.json")
    ckpt.ok("convert", src / "pytorch_model.bin", out / "model.safetensors")
    stored = load_file(str(out / "model.safetensors"))
    assert len([k for k in stored if k in ("lm_head.weight", "transformer.wte.weight")]) == 1
    assert torch.equal(_logits(_load(out)), _logits(model))


def test_several_candidates_are_named_and_training_state_noted(ckpt, tmp_path):
    model = _gpt2()
    d = tmp_path / "checkpoint-500"
    _save(model, d, True)
    torch.save(model.state_dict(), d / "pytorch_model.bin")
    torch.save({"state": {}, "param_groups": []}, d / "optimizer.pt")
    (d / "trainer_state.json").write_text("{}")
    r = ckpt.run("ls", d)
    assert r.returncode == 0, r.stderr
    assert "read model.safetensors" in r.stderr and "pytorch_model.bin" in r.stderr
    assert "optimizer.pt" in r.stderr and "trainer_state.json" in r.stderr
    # The other one is read by naming it.
    assert ckpt.run("ls", d / "pytorch_model.bin").returncode == 0


def test_a_folder_without_a_checkpoint_is_refused_naming_what_was_looked_for(ckpt, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    r = ckpt.run("ls", tmp_path)
    assert r.returncode == 8
    assert "is a directory" in r.stderr and "model.safetensors" in r.stderr


def test_dcp_training_save_to_a_bf16_serving_folder_with_renames_and_shards(ckpt, tmp_path):
    # What training writes (DCP, names under "model.") to what serving reads: an HF folder of
    # bf16 safetensors shards under the serving model's names, loaded by from_pretrained.
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    model = _llama()
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(tmp_path / "step"), no_dist=True)
    out = tmp_path / "serve"
    out.mkdir()
    model.config.save_pretrained(out)
    ckpt.ok("convert", tmp_path / "step", f"{out}/", "--strip-prefix", "model.", "--cast", "bf16",
            "--max-shard-size", "150KB")
    shards = sorted(out.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1
    stored = {}
    for s in shards:
        stored.update(load_file(str(s)))
    assert set(stored) == set(model.state_dict())
    assert all(v.dtype == torch.bfloat16 for v in stored.values())
    for k, v in model.state_dict().items():
        assert torch.equal(stored[k], v.to(torch.bfloat16)), k
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(v.numel() * 2 for v in stored.values())
    got = _load(out)
    want = _llama().to(torch.bfloat16)
    assert torch.equal(_logits(got.to(torch.bfloat16)), _logits(want))
