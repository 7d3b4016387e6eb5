"""ckpt.vllm without vLLM: `import ckpt` never imports vllm, and ckpt.vllm.weights (what the
"ckpt" load format feeds model.load_weights) yields a model folder's tensors as safetensors
reads them. vLLM itself: tests/vllm (make vllm-check)."""

import subprocess
import sys

import pytest



def test_import_ckpt_does_not_import_vllm(built_path):
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import ckpt; "
            "assert 'vllm' not in sys.modules and 'ckpt.vllm' not in sys.modules; "
            "import ckpt.vllm; print(ckpt.vllm.LOAD_FORMAT)")
    p = subprocess.run([sys.executable, "-c", code, built_path], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "ckpt"


def _sharded_folder(tmp_path):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    torch.manual_seed(0)
    a = {"model.embed_tokens.weight": torch.randn(32, 8),
         "model.layers.0.self_attn.q_proj.weight": torch.randn(8, 8)}
    b = {"model.norm.weight": torch.randn(8), "lm_head.weight": torch.randn(32, 8).half(),
         "model.layers.0.count": torch.arange(4)}
    st.save_file(a, str(tmp_path / "model-00001-of-00002.safetensors"), {"format": "pt"})
    st.save_file(b, str(tmp_path / "model-00002-of-00002.safetensors"), {"format": "pt"})
    index = {name: "model-00001-of-00002.safetensors" for name in a}
    index.update({name: "model-00002-of-00002.safetensors" for name in b})
    import json
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": index}))
    return {**a, **b}


def test_weights_of_a_sharded_folder(tmp_path):
    import ckpt.vllm
    import torch
    want = _sharded_folder(tmp_path)
    got = dict(ckpt.vllm.weights(str(tmp_path)))
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name


def test_weights_cast_floating_point_only(tmp_path):
    import ckpt.vllm
    import torch
    want = _sharded_folder(tmp_path)
    got = dict(ckpt.vllm.weights(str(tmp_path), dtype=torch.bfloat16))
    assert got["lm_head.weight"].dtype == torch.bfloat16
    assert torch.equal(got["lm_head.weight"], want["lm_head.weight"].to(torch.bfloat16))
    assert got["model.layers.0.count"].dtype == torch.int64


def test_model_folder_refuses_a_hub_name(tmp_path):
    import ckpt.vllm

    class Config:
        model = "org/not-a-local-folder"
    with pytest.raises(ValueError, match="reads a local model folder"):
        ckpt.vllm.model_folder(Config())
    Config.model = str(tmp_path)
    assert ckpt.vllm.model_folder(Config()) == str(tmp_path)
