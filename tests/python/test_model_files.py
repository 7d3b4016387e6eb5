"""Checkpoint.convert into a folder copies the model files beside the weights (config.json,
generation_config.json, tokenizer files) as `ckpt convert` does, so that the folder loads with
transformers' from_pretrained as the input did."""

import os
import subprocess

import pytest
import torch

import ckpt

transformers = pytest.importorskip("transformers")


def _model_folder(path):
    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=128, n_positions=32)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.save_pretrained(path)
    model.generation_config.save_pretrained(path)
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        f.write('{"model_max_length": 32}\n')
    return model


def _logits(model):
    with torch.no_grad():
        return model(torch.tensor([[1, 5, 9, 3]])).logits


@pytest.mark.parametrize("shards", [0, 40_000], ids=["one-file", "sharded"])
def test_convert_into_a_folder_copies_the_model_files(tmp_path, shards):
    src, out = tmp_path / "src", tmp_path / "out"
    model = _model_folder(src)
    report = ckpt.open(str(src)).convert(f"{out}/", max_shard_size=shards)
    assert report["model_files_copied"] == ["config.json", "generation_config.json",
                                            "tokenizer_config.json"]
    for name in report["model_files_copied"]:
        assert (out / name).read_bytes() == (src / name).read_bytes()
    assert not [p for p in os.listdir(out) if p.endswith(".ckpt-tmp")]
    got = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert torch.equal(_logits(got), _logits(model))


def test_the_library_and_the_cli_write_the_same_folder(tmp_path):
    cli = os.environ.get("CKPT_BIN") or os.path.join(
        os.path.dirname(__file__), "..", "..", "build", "ckpt")
    if not os.path.exists(cli):
        pytest.skip("the ckpt binary is not built")
    src = tmp_path / "src"
    _model_folder(src)
    ckpt.open(str(src)).convert(f"{tmp_path / 'lib'}/")
    subprocess.run([cli, "convert", str(src), f"{tmp_path / 'cli'}/"], check=True,
                   capture_output=True)
    assert sorted(os.listdir(tmp_path / "lib")) == sorted(os.listdir(tmp_path / "cli"))


def test_a_file_input_copies_nothing(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    _model_folder(src)
    report = ckpt.open(str(src / "model.safetensors")).convert(f"{out}/")
    assert report["model_files_copied"] == []
    assert not (out / "config.json").exists()
