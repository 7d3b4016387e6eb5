"""`ckpt convert` transforms (docs/cli.md, "Converting for serving") against torch: casts equal
Tensor.to() bit for bit (NaN, infinities, subnormals included), splits, fusions and transposes
equal torch's, block-scaled FP8 and MXFP4 dequantization equal reference implementations written
here with torch ops; a rule that cannot apply exits 8 with nothing written; a streamed cast holds
about the budget plus a tensor; tied weights reach safetensors as safetensors' save_model writes
them; float4_e2m1fn_x2 goes to and from safetensors' F4 as safetensors does."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import helpers
from conftest import one_error_line

UINT = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.uint64}


def bits(t):
    return t.contiguous().view(UINT[t.element_size()])


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def every(dtype, n):
    """All n bit patterns of a 1- or 2-byte dtype."""
    return torch.arange(n, dtype=torch.int64).to(UINT[n.bit_length() // 8 or 1]).view(dtype)


def float32_cases():
    g = torch.Generator().manual_seed(3)
    rnd = torch.randint(0, 2**32, (1 << 18,), generator=g, dtype=torch.int64)
    special = [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF812345, 0x7FBFFFFF, 0x7F800000,
               0xFF800000, 0x00000001, 0x807FFFFF, 0x33000000, 0x33000001, 0x477FEFFF,
               0x477FF000, 0x38800000, 0x387FFFFF, 0x7F7FFFFF, 0x3F808000, 0x3F818000]
    # Every bfloat16 and float16 rounding boundary neighbourhood: x.5 ulp above each value.
    halves = (torch.arange(1 << 16, dtype=torch.int64) << 16) | 0x8000
    t = torch.cat([rnd, torch.tensor(special * 64), halves, halves + 1, halves - 1])
    t = t[: len(t) // 64 * 64]
    return t.to(torch.uint32).view(torch.float32)


def cast_inputs():
    g = torch.Generator().manual_seed(5)
    f64 = torch.randn(1 << 14, generator=g, dtype=torch.float64) * 1e5
    f64[:64] = float("nan")
    f64[64:128] = float("inf")
    f64[128:192] = 1e-300
    return {
        "f32": float32_cases(),
        "f16": every(torch.float16, 1 << 16),
        "bf16": every(torch.bfloat16, 1 << 16),
        "f64": f64,
        "e4m3": every(torch.uint8, 256).repeat(64).view(torch.float8_e4m3fn),
        "e5m2": every(torch.uint8, 256).repeat(64).view(torch.float8_e5m2),
        "i32": torch.arange(64, dtype=torch.int32),
    }


@pytest.mark.parametrize("to,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16),
                                      ("fp32", torch.float32)])
def test_cast_equals_torch_bit_for_bit(ckpt, tmp_path, to, dtype):
    src = cast_inputs()
    path = tmp_path / "in.safetensors"
    save_file(src, str(path))
    out = tmp_path / "out.safetensors"
    r = ckpt.ok("convert", path, out, "--cast", to)
    assert "cast" in r.stderr
    got = load_file(str(out))
    for name, t in src.items():
        want = t if name == "i32" else t.to(dtype)
        assert same_bits(got[name], want), f"{name} -> {to}: " + str(
            (bits(got[name]) != bits(want)).nonzero()[:5].flatten().tolist())


def test_rename_keep_drop_split_fuse_transpose_equal_torch(ckpt, tmp_path):
    g = torch.Generator().manual_seed(1)
    sd = {"module._orig_mod.h.0.attn.qkv.weight": torch.randn(96, 16, generator=g),
          "module._orig_mod.h.0.mlp.gate.weight": torch.randn(24, 16, generator=g),
          "module._orig_mod.h.0.mlp.up.weight": torch.randn(24, 16, generator=g),
          "module._orig_mod.h.0.c_proj.weight": torch.randn(16, 40, generator=g),
          "module._orig_mod.h.0.rotary.inv_freq": torch.randn(8, generator=g),
          "module._orig_mod.wte.weight": torch.randn(50, 16, generator=g).half()}
    path = tmp_path / "in.pt"
    torch.save(sd, path)
    out = tmp_path / "out.safetensors"
    r = ckpt.ok("convert", path, out, "--strip-prefix", "module.", "--strip-prefix", "_orig_mod.",
                "--rename", r"^h\.(\d+)\.=model.layers.$1.", "--drop", "*.inv_freq",
                "--split", "model.layers.0.attn.qkv.weight:0:q.weight,k.weight,v.weight:32,48,16",
                "--fuse", "model.layers.0.mlp.gate.weight,model.layers.0.mlp.up.weight:0:gate_up",
                "--transpose", "*.c_proj.weight", "--keep", "*", "--drop", "nothing.*")
    assert "warning: drop nothing.* matched no tensor" in r.stderr
    got = load_file(str(out))
    p = "module._orig_mod.h.0."
    q, k, v = sd[p + "attn.qkv.weight"].split([32, 48, 16], 0)
    want = {"q.weight": q, "k.weight": k, "v.weight": v,
            "gate_up": torch.cat([sd[p + "mlp.gate.weight"], sd[p + "mlp.up.weight"]], 0),
            "model.layers.0.c_proj.weight": sd[p + "c_proj.weight"].t().contiguous(),
            "wte.weight": sd["module._orig_mod.wte.weight"]}
    assert sorted(got) == sorted(want)
    for n, t in want.items():
        assert same_bits(got[n], t), n
    # The same rules from a recipe give the same file's tensors.
    recipe = tmp_path / "r.json"
    recipe.write_text(json.dumps({
        "rename": [{"strip_prefix": "module."}, {"strip_prefix": "_orig_mod."},
                   {"regex": r"^h\.(\d+)\.", "replacement": "model.layers.$1."}],
        "drop": ["*.inv_freq"],
        "split": ["model.layers.0.attn.qkv.weight:0:q.weight,k.weight,v.weight:32,48,16"],
        "fuse": [{"parts": ["model.layers.0.mlp.gate.weight", "model.layers.0.mlp.up.weight"],
                  "dim": 0, "name": "gate_up"}],
        "transpose": ["*.c_proj.weight"]}))
    out2 = tmp_path / "out2.pt"
    ckpt.ok("convert", path, out2, "--recipe", recipe)
    got2 = torch.load(out2, weights_only=True)
    assert sorted(got2) == sorted(want)
    for n, t in want.items():
        assert same_bits(got2[n], t), n


YAML_RECIPE = r"""# the rules of the JSON recipe, in YAML
rename:
  - strip_prefix: module.
  - {strip_prefix: _orig_mod.}
  - regex: '^h\.(\d+)\.'
    replacement: model.layers.$1.
drop: ['*.inv_freq']
split:
  - name: model.layers.0.attn.qkv.weight
    dim: 0
    parts: [q.weight, k.weight, v.weight]
    sizes: [32, 48, 16]
fuse:
  - parts: [model.layers.0.mlp.gate.weight, model.layers.0.mlp.up.weight]
    dim: 1
    name: gate_up
transpose: ["*.c_proj.weight"]
cast: bf16
"""


def test_yaml_recipe_equals_json_recipe_and_torch(ckpt, tmp_path):
    g = torch.Generator().manual_seed(2)
    p = "module._orig_mod.h.0."
    sd = {p + "attn.qkv.weight": torch.randn(96, 16, generator=g),
          p + "mlp.gate.weight": torch.randn(24, 16, generator=g),
          p + "mlp.up.weight": torch.randn(24, 8, generator=g),
          p + "c_proj.weight": torch.randn(16, 40, generator=g),
          p + "rotary.inv_freq": torch.randn(8, generator=g),
          "module._orig_mod.wte.weight": torch.randn(50, 16, generator=g).half()}
    path = tmp_path / "in.pt"
    torch.save(sd, path)
    (tmp_path / "r.yaml").write_text(YAML_RECIPE)
    (tmp_path / "r.json").write_text(json.dumps({
        "rename": [{"strip_prefix": "module."}, {"strip_prefix": "_orig_mod."},
                   {"regex": r"^h\.(\d+)\.", "replacement": "model.layers.$1."}],
        "drop": ["*.inv_freq"],
        "split": [{"name": "model.layers.0.attn.qkv.weight", "dim": 0,
                   "parts": ["q.weight", "k.weight", "v.weight"], "sizes": [32, 48, 16]}],
        "fuse": [{"parts": ["model.layers.0.mlp.gate.weight", "model.layers.0.mlp.up.weight"],
                  "dim": 1, "name": "gate_up"}],
        "transpose": ["*.c_proj.weight"], "cast": "bf16"}))
    ckpt.ok("convert", path, tmp_path / "json.safetensors", "--recipe", tmp_path / "r.json")
    out = tmp_path / "yaml.safetensors"
    if "-yaml" in ckpt.ok("--version").stdout:  # a build without yaml-cpp refuses it, exit 6
        r = ckpt.run("convert", path, out, "--recipe", tmp_path / "r.yaml")
        line = one_error_line(r)
        assert r.returncode == 6 and "libyaml-cpp-dev" in line and "yaml-cpp-devel" in line, line
        assert not out.exists()
        pytest.skip("built without yaml-cpp (the refusal checked)")
    ckpt.ok("convert", path, out, "--recipe", tmp_path / "r.yaml")
    assert out.read_bytes() == (tmp_path / "json.safetensors").read_bytes()
    q, k, v = sd[p + "attn.qkv.weight"].split([32, 48, 16], 0)
    want = {"q.weight": q, "k.weight": k, "v.weight": v,
            "gate_up": torch.cat([sd[p + "mlp.gate.weight"], sd[p + "mlp.up.weight"]], 1),
            "model.layers.0.c_proj.weight": sd[p + "c_proj.weight"].t().contiguous(),
            "wte.weight": sd["module._orig_mod.wte.weight"]}
    got = load_file(str(out))
    assert sorted(got) == sorted(want)
    for n, t in want.items():
        assert same_bits(got[n], t.to(torch.bfloat16)), n
    # YAML's typing: a quoted dim is a string, refused (exit 8) naming the file, line and column.
    bad = tmp_path / "bad.yml"
    bad.write_text(YAML_RECIPE.replace("dim: 0", 'dim: "0"'))
    r = ckpt.run("convert", path, tmp_path / "bad.safetensors", "--recipe", bad)
    line = one_error_line(r)
    assert r.returncode == 8 and str(bad) in line and "line 10, column 10" in line, line
    assert "must be an integer, not the string" in line
    assert not (tmp_path / "bad.safetensors").exists()


def fp8_block_reference(w, s):
    """DeepSeek-V3's dequantization: each 128x128 block times its scale, to bfloat16."""
    rows, cols = w.shape
    full = s.repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :cols]
    return (w.float() * full).to(torch.bfloat16)


def test_fp8_block_dequantize_equals_reference(ckpt, tmp_path):
    g = torch.Generator().manual_seed(2)
    w = torch.randint(0, 256, (300, 260), generator=g, dtype=torch.int64).to(torch.uint8)
    w = w.view(torch.float8_e4m3fn)
    s = torch.rand(3, 3, generator=g) * 4 + 1e-3
    s[1, 2] = 1e-30  # subnormal products
    sd = {"layers.0.mlp.down_proj.weight": w, "layers.0.mlp.down_proj.weight_scale_inv": s,
          "layers.0.norm.weight": torch.randn(64, generator=g)}
    path = tmp_path / "in.safetensors"
    save_file(sd, str(path))
    out = tmp_path / "out.safetensors"
    ckpt.ok("convert", path, out, "--dequantize", "fp8-block")
    got = load_file(str(out))
    assert sorted(got) == ["layers.0.mlp.down_proj.weight", "layers.0.norm.weight"]
    assert same_bits(got["layers.0.mlp.down_proj.weight"], fp8_block_reference(w, s))
    assert same_bits(got["layers.0.norm.weight"], sd["layers.0.norm.weight"])


FP4_VALUES = [+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def mxfp4_reference(blocks, scales):
    """transformers' convert_moe_packed_tensors, in torch ops: nibbles (low first) through the
    e2m1 table, times 2^(scale - 127), [..., G * B * 2], dims 1 and 2 swapped."""
    exp = scales.to(torch.int32) - 127
    lut = torch.tensor(FP4_VALUES, dtype=torch.bfloat16)
    *prefix, G, B = blocks.shape
    rows = math.prod(prefix) * G
    blk = blocks.reshape(rows, B)
    out = torch.empty(rows, B * 2, dtype=torch.bfloat16)
    out[:, 0::2] = lut[(blk & 0x0F).long()]
    out[:, 1::2] = lut[(blk >> 4).long()]
    torch.ldexp(out, exp.reshape(rows, 1), out=out)
    out = out.reshape(*prefix, G, B * 2).view(*prefix, G * B * 2)
    return out.transpose(1, 2).contiguous()


def test_mxfp4_dequantize_equals_reference(ckpt, tmp_path):
    g = torch.Generator().manual_seed(4)
    blocks = torch.randint(0, 256, (2, 5, 3, 16), generator=g, dtype=torch.int64).to(torch.uint8)
    scales = torch.randint(100, 150, (2, 5, 3), generator=g, dtype=torch.int64).to(torch.uint8)
    scales[0, 0, :] = torch.tensor([0, 255, 254], dtype=torch.uint8)
    sd = {"model.layers.0.mlp.experts.gate_up_proj_blocks": blocks,
          "model.layers.0.mlp.experts.gate_up_proj_scales": scales,
          "model.layers.0.mlp.experts.gate_up_proj_bias": torch.randn(2, 5, generator=g)}
    path = tmp_path / "in.safetensors"
    save_file(sd, str(path))
    out = tmp_path / "out.safetensors"
    ckpt.ok("convert", path, out, "--dequantize")
    got = load_file(str(out))
    assert sorted(got) == ["model.layers.0.mlp.experts.gate_up_proj",
                           "model.layers.0.mlp.experts.gate_up_proj_bias"]
    assert same_bits(got["model.layers.0.mlp.experts.gate_up_proj"],
                     mxfp4_reference(blocks, scales))


@pytest.mark.parametrize("case", ["missing_scale", "scale_shape", "collision", "transpose_1d",
                                  "split_sizes", "fuse_shapes", "mxfp4_no_scales", "bad_regex"])
def test_refusals_exit_8_with_nothing_written(ckpt, tmp_path, case):
    w8 = torch.zeros(200, 10, dtype=torch.uint8).view(torch.float8_e4m3fn)
    sd, args = {"a.weight": torch.randn(4, 6), "b.weight": torch.randn(3, 6),
                "c": torch.randn(5)}, []
    if case == "missing_scale":
        sd["f.weight"], args = w8, ["--dequantize", "fp8-block"]
    elif case == "scale_shape":
        sd["f.weight"], sd["f.weight_scale_inv"] = w8, torch.ones(1, 1)
        args = ["--dequantize"]
    elif case == "collision":
        args = ["--rename", r"^[ab]\.=x."]
    elif case == "transpose_1d":
        args = ["--transpose", "c"]
    elif case == "split_sizes":
        args = ["--split", "a.weight:0:p,q:1,2"]
    elif case == "fuse_shapes":
        args = ["--fuse", "a.weight,c:0:ac"]
    elif case == "mxfp4_no_scales":
        sd["e_blocks"], args = torch.zeros(2, 16, dtype=torch.uint8), ["--dequantize", "mxfp4"]
    else:
        args = ["--rename", "(=x"]
    path = tmp_path / "in.safetensors"
    save_file(sd, str(path))
    for out in (tmp_path / "out.safetensors", tmp_path / "out.pt"):
        r = ckpt.run("convert", path, out, *args)
        line = one_error_line(r)
        assert r.returncode == 8, line
        assert not out.exists(), line
        assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]


MAKE_BIG = """
import sys, torch, torch.distributed.checkpoint as dcp
g = torch.Generator().manual_seed(1)
sd = {f"w.{i}": torch.randn(1024, 1024, generator=g) for i in range(48)}  # 48 x 4 MiB
dcp.save(sd, checkpoint_id=sys.argv[1], no_dist=True)
"""


def test_streamed_cast_holds_the_budget_plus_a_tensor(ckpt, tmp_path):
    """192 MiB of float32 in a DCP folder (streamed) cast to bfloat16 with --budget-mb 16: the
    process holds about the budget, one input tensor (4 MiB) and its output (2 MiB)."""
    if "asan" in ckpt.path:
        pytest.skip("ASan's shadow memory counts in the RSS")
    d = tmp_path / "big"
    subprocess.run([sys.executable, "-c", MAKE_BIG, str(d)], check=True, capture_output=True,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))
    out = tmp_path / "big.safetensors"
    r, peak = helpers.run_measured(ckpt, "convert", d, out, "--budget-mb", "16", "--cast", "bf16")
    assert r.returncode == 0, r.stderr
    base = 48 << 20  # the binary, its libraries and heap
    assert peak < base + (16 << 20) + (4 << 20) + (2 << 20), f"peak RSS {peak >> 20} MiB"
    got = load_file(str(out))
    g = torch.Generator().manual_seed(1)
    first = torch.randn(1024, 1024, generator=g)
    assert len(got) == 48 and same_bits(got["w.0"], first.to(torch.bfloat16))


MAKE_FP8 = """
import sys, torch, torch.distributed.checkpoint as dcp
g = torch.Generator().manual_seed(1)
sd = {}
for i in range(24):  # 24 x 4 MiB of float8 and their scales, weight first in the tree
    w = torch.randint(0, 120, (2048, 2048), generator=g).to(torch.uint8)
    sd[f"l.{i}.weight"] = w.view(torch.float8_e4m3fn)
    sd[f"l.{i}.weight_scale_inv"] = torch.rand(16, 16, generator=g)
dcp.save(sd, checkpoint_id=sys.argv[1], no_dist=True)
"""


def test_streamed_fp8_dequantize_holds_the_budget_plus_a_tensor(ckpt, tmp_path):
    """96 MiB of block-scaled float8 (a DCP folder, streamed) dequantized to 192 MiB of bfloat16
    with --budget-mb 16: the process holds about the budget, one input (4 MiB) and its output
    (8 MiB)."""
    if "asan" in ckpt.path:
        pytest.skip("ASan's shadow memory counts in the RSS")
    d = tmp_path / "fp8"
    subprocess.run([sys.executable, "-c", MAKE_FP8, str(d)], check=True, capture_output=True,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))
    out = tmp_path / "bf16.safetensors"
    r, peak = helpers.run_measured(ckpt, "convert", d, out, "--budget-mb", "16",
                                   "--dequantize", "fp8-block")
    assert r.returncode == 0, r.stderr
    base = 48 << 20
    assert peak < base + (16 << 20) + (4 << 20) + (8 << 20), f"peak RSS {peak >> 20} MiB"
    got = load_file(str(out))
    assert sorted(got) == sorted(f"l.{i}.weight" for i in range(24))
    g = torch.Generator().manual_seed(1)
    w = torch.randint(0, 120, (2048, 2048), generator=g).to(torch.uint8)
    s = torch.rand(16, 16, generator=g)
    assert same_bits(got["l.0.weight"], fp8_block_reference(w.view(torch.float8_e4m3fn), s))


def gpt2_tied_state():
    g = torch.Generator().manual_seed(7)
    wte = torch.randn(64, 16, generator=g)
    sd = {"transformer.wte.weight": wte, "transformer.wpe.weight": torch.randn(8, 16, generator=g),
          "transformer.h.0.attn.c_attn.weight": torch.randn(16, 48, generator=g),
          "transformer.h.0.attn.c_attn.bias": torch.randn(48, generator=g),
          "transformer.ln_f.weight": torch.ones(16), "transformer.ln_f.bias": torch.zeros(16),
          "lm_head.weight": wte}
    return sd


def test_tied_embeddings_to_safetensors_as_save_model(ckpt, tmp_path):
    from safetensors.torch import _remove_duplicate_names
    sd = gpt2_tied_state()
    path = tmp_path / "pytorch_model.bin"
    torch.save(sd, path)
    out = tmp_path / "model.safetensors"
    r = ckpt.ok("convert", path, out)
    assert "tied names left out" in r.stderr
    got = load_file(str(out))
    removed = _remove_duplicate_names(sd)  # {kept: [removed...]}, as save_model uses it
    want = dict(sd)
    meta = {"format": "pt"}
    for kept, gone in removed.items():
        for name in gone:
            del want[name]
            meta[name] = kept
    assert sorted(got) == sorted(want)
    for n, t in want.items():
        assert torch.equal(got[n], t), n
    with safe_open(str(out), "pt") as f:
        assert f.metadata() == meta
    # Renamed on the way: the metadata names the names written.
    out2 = tmp_path / "renamed.safetensors"
    ckpt.ok("convert", path, out2, "--strip-prefix", "transformer.", "--cast", "bf16")
    with safe_open(str(out2), "pt") as f:
        assert f.metadata() == {"format": "pt", "wte.weight": "lm_head.weight"}
        assert sorted(f.keys()) == sorted(k.replace("transformer.", "") for k in want)
    # A view of part of a storage is still refused.
    base = torch.randn(10)
    torch.save({"a": base, "b": base[2:5]}, tmp_path / "views.pt")
    r = ckpt.run("convert", tmp_path / "views.pt", tmp_path / "v.safetensors")
    assert r.returncode == 8 and "--copy-shared" in one_error_line(r)


def test_tied_embeddings_load_with_from_pretrained(ckpt, tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=8)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    cfg.save_pretrained(tmp_path / "hf")
    ckpt.ok("convert", tmp_path / "pytorch_model.bin", tmp_path / "hf" / "model.safetensors")
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_float4_pairs_to_and_from_safetensors(ckpt, tmp_path):
    x = torch.randint(0, 256, (4, 3), dtype=torch.int64).to(torch.uint8)
    x = x.view(torch.float4_e2m1fn_x2)
    st = tmp_path / "f4.safetensors"
    save_file({"w": x}, str(st))
    pt = tmp_path / "f4.pt"
    ckpt.ok("convert", st, pt)
    back = torch.load(pt, weights_only=True)["w"]
    assert back.dtype == torch.float4_e2m1fn_x2 and back.shape == (4, 3)
    assert torch.equal(back.view(torch.uint8), x.view(torch.uint8))
    torch.save({"w": x}, tmp_path / "x.pt")
    st2 = tmp_path / "x.safetensors"
    ckpt.ok("convert", tmp_path / "x.pt", st2)
    header = open(st2, "rb").read(200)
    assert b'"dtype":"F4","shape":[4,6]' in header
    y = load_file(str(st2))["w"]
    assert y.dtype == torch.float4_e2m1fn_x2 and torch.equal(y.view(torch.uint8),
                                                             x.view(torch.uint8))
