"""Checkpoint.convert's transform keywords (rename=, keep=, drop=, cast=, dequantize=, split=,
fuse=, transpose=, recipe=) against torch, and refusals as ckpt.InvalidArgumentError with
nothing written."""

import json

import pytest
import torch

safetensors_torch = pytest.importorskip("safetensors.torch")  # not in Debian's torch 1.13 tier
load_file, save_file = safetensors_torch.load_file, safetensors_torch.save_file

import ckpt


def test_convert_keywords_equal_torch(tmp_path):
    g = torch.Generator().manual_seed(1)
    sd = {"module.qkv.weight": torch.randn(12, 4, generator=g),
          "module.proj.weight": torch.randn(4, 6, generator=g),
          "module.extra": torch.randn(3, generator=g),
          "module.w8": torch.randint(0, 120, (130, 3), generator=g).to(torch.uint8)
          .view(torch.float8_e4m3fn),
          "module.w8_scale_inv": torch.rand(2, 1, generator=g)}
    src = tmp_path / "in.safetensors"
    save_file(sd, str(src))
    out = tmp_path / "out.safetensors"
    r = ckpt.open(src).convert(out, strip_prefix="module.", rename=[(r"^proj\.", "o_proj.")],
                               drop="*.extra", split=["model.qkv.weight:0:model.q,model.k,model.v"],
                               transpose="model.o_proj.weight", cast="fp16", dequantize=True,
                               add_prefix="model.")
    got = load_file(str(out))
    q, k, v = sd["module.qkv.weight"].split(4, 0)
    w8 = sd["module.w8"]
    full = sd["module.w8_scale_inv"].repeat_interleave(128, 0)[:130].repeat_interleave(128, 1)
    deq = (w8.float() * full[:, :3]).to(torch.bfloat16)
    want = {"model.q": q.half(), "model.k": k.half(), "model.v": v.half(),
            "model.o_proj.weight": sd["module.proj.weight"].t().contiguous().half(),
            "model.w8": deq.half()}
    assert sorted(got) == sorted(want)
    for n, t in want.items():
        assert got[n].dtype == t.dtype and torch.equal(got[n], t), n
    assert ("drop *.extra", 1) in r["transforms"]
    assert r["unmatched_rules"] == ["dequantize mxfp4"]  # dequantize=True: every scheme

    recipe = tmp_path / "r.json"
    recipe.write_text(json.dumps({"strip_prefix": "module.", "keep": ["qkv.*"], "cast": "bf16"}))
    r = ckpt.open(src).convert(tmp_path / "r.pt", recipe=str(recipe), drop="nothing")
    got = torch.load(tmp_path / "r.pt", weights_only=True)
    assert list(got) == ["qkv.weight"]
    assert torch.equal(got["qkv.weight"], sd["module.qkv.weight"].bfloat16())
    assert r["unmatched_rules"] == ["drop nothing"]

    # The same recipe in YAML gives the same file; the keywords add to it as to the JSON one.
    yaml = tmp_path / "r.yaml"
    yaml.write_text("strip_prefix: module.  # a comment\nkeep:\n  - qkv.*\ncast: bf16\n")
    try:
        r = ckpt.open(src).convert(tmp_path / "y.pt", recipe=yaml, drop="nothing")
    except ckpt.UnsupportedError as e:  # a build without yaml-cpp names its packages
        assert "libyaml-cpp-dev" in str(e) and not (tmp_path / "y.pt").exists()
        return
    got_yaml = torch.load(tmp_path / "y.pt", weights_only=True)
    assert list(got_yaml) == ["qkv.weight"]
    assert torch.equal(got_yaml["qkv.weight"].view(torch.int16), got["qkv.weight"].view(torch.int16))
    assert r["unmatched_rules"] == ["drop nothing"]
    yaml.write_text("keep:\n  - qkv.*\ncast: [bf16]\n")
    with pytest.raises(ckpt.InvalidArgumentError, match="line 3, column 7: cast must be a string"):
        ckpt.open(src).convert(tmp_path / "z.pt", recipe=str(yaml))
    assert not (tmp_path / "z.pt").exists()


def test_convert_refusal_leaves_nothing(tmp_path):
    src = tmp_path / "in.safetensors"
    save_file({"a": torch.zeros(2, 3), "b": torch.zeros(2, 3)}, str(src))
    out = tmp_path / "out.safetensors"
    with pytest.raises(ckpt.InvalidArgumentError):
        ckpt.open(src).convert(out, rename=[("^[ab]$", "x")])
    with pytest.raises(ckpt.InvalidArgumentError):
        ckpt.open(src).convert(out, transpose="*", split=["a:0:p,q:1,2"])
    assert not out.exists()
