#!/usr/bin/python3
"""Torch-side corpus for the ckpt interop tests.

Every case is an object handed to ``torch.save``; ``generate(outdir)`` writes
``<case>.pt`` (zip format) and, for cases marked legacy, ``<case>.legacy.pt``
(``_use_new_zipfile_serialization=False``).  Runnable as a script:

    /usr/bin/python3 tests/interop/corpus.py OUTDIR

What torch 1.13 cannot save, and is therefore absent here:
  * complex32 (torch.chalf): torch.save raises KeyError "dtype torch.complex32 is
    not recognized" in both formats (1.13 has no storage type for it).
  * float8_*, uint16/32/64, bits*: the dtypes do not exist in 1.13.
Quantized tensors (per-tensor and per-channel, qint8/quint8/qint32, and the
sub-byte quint4x2/quint2x4) save and load in both formats, but not with
weights_only=True (1.13's weights-only allowlist lacks _rebuild_qtensor).

``weights_only(file_id)`` says whether the running torch's ``torch.load(...,
weights_only=True)`` reads a corpus file (each Case states it, with the reason when not):
tests pass it to torch.load explicitly, since the default changed from False (torch 1.13)
to True (torch 2.6).
"""

import collections
import math
import os
import sys
import types

import torch

# ---------------------------------------------------------------------------
# Cases.  Each builder returns the object to torch.save; builders seed torch
# themselves so every run writes the same tensor bytes.


def _seeded(seed=0):
    torch.manual_seed(seed)


def _special_floats(dtype):
    """Values that catch sloppy conversions: NaN, infinities, -0.0, tiny and huge."""
    vals = [0.0, -0.0, 1.0, -1.5, math.inf, -math.inf, math.nan, 1e-30, 3.0e38, 65504.0, 6e-8, 1 / 3]
    t = torch.tensor(vals, dtype=torch.float64).to(dtype)
    return torch.cat([t, torch.randn(12, dtype=torch.float64).to(dtype)]).reshape(4, 6)


def _dtype_case(dtype):
    def build():
        _seeded(1)
        if dtype.is_floating_point:
            t = _special_floats(dtype)
        elif dtype.is_complex:
            t = torch.randn(3, 5, dtype=dtype)
            t[0, 0] = complex(math.nan, math.inf)
        elif dtype == torch.bool:
            t = torch.rand(3, 7) > 0.5
        elif dtype == torch.uint8:
            t = torch.randint(0, 256, (3, 7), dtype=dtype)
        else:
            info = torch.iinfo(dtype)
            t = torch.randint(max(info.min, -1000), min(info.max, 1000), (3, 7), dtype=dtype)
            t[0, 0] = info.min
            t[0, 1] = info.max
        # A 0-d and a 1-element tensor of the same dtype ride along.
        return {"t": t, "scalar": t.reshape(-1)[3].clone(), "one": t.reshape(-1)[:1].clone()}

    return build


DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.complex64, torch.complex128, torch.bool,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
]
# complex32 is deliberately absent: torch 1.13 cannot torch.save it (see module doc).


def _quant(qdtype):
    def build():
        _seeded(2)
        x = torch.randn(4, 5) * 3
        q = torch.quantize_per_tensor(x, 0.05 if qdtype != torch.qint32 else 1e-4, 3 if qdtype != torch.qint8 else -2, qdtype)
        return {"q": q, "qt": q.t(), "scalar": torch.quantize_per_tensor(torch.tensor(1.25), 0.5, 1, qdtype)}

    return build


def quant_per_channel():
    _seeded(3)
    x = torch.randn(3, 4) * 2
    a = torch.quantize_per_channel(x, torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64),
                                   torch.tensor([1, -2, 3]), 0, torch.qint8)
    b = torch.quantize_per_channel(x, torch.tensor([0.05, 0.1, 0.15, 0.2], dtype=torch.float64),
                                   torch.tensor([10, 20, 30, 40]), 1, torch.quint8)
    return {"axis0": a, "axis1": b, "plain": torch.ones(2)}


def quant_subbyte():
    # Packed two (quint4x2) or four (quint2x4) values per byte: the storage holds
    # ceil(numel / k) bytes while element_size() is 1.  Even numels only.
    _seeded(4)
    x = torch.rand(8) * 3
    return {"q4x2": torch.quantize_per_tensor(x, 0.25, 1, torch.quint4x2),
            "q2x4": torch.quantize_per_tensor(x, 1.0, 0, torch.quint2x4)}


def scalars_0d():
    return {"f": torch.tensor(3.5), "d": torch.tensor(-2.25, dtype=torch.float64),
            "i": torch.tensor(-7), "b": torch.tensor(True), "h": torch.tensor(0.1, dtype=torch.float16),
            "bf": torch.tensor(-0.5, dtype=torch.bfloat16), "c": torch.tensor(1 + 2j)}


def empty():
    return {"e0": torch.empty(0), "e30": torch.empty(3, 0), "e05": torch.zeros(0, 5, dtype=torch.int64),
            "e000": torch.empty(0, 0, 0, dtype=torch.float16), "after": torch.arange(3)}


def views():
    base = torch.arange(20, dtype=torch.float32)
    m = base.view(4, 5)
    return {"base": base, "tail": base[2:], "m": m, "sub": m[1:, 1:], "tr": m.t(),
            "step": base[1::3], "col": m[:, 2], "row": m[3]}


def view_only():
    # Only views are saved: the whole underlying storage is still written.
    base = torch.arange(64, dtype=torch.int32)
    return {"mid": base[10:20], "strided": base.view(8, 8)[2:6:2, 1::3]}


def noncontig():
    _seeded(5)
    x = torch.randn(2, 3, 4)
    return {"perm": x.permute(2, 0, 1), "tr": torch.randn(5, 6).t(),
            "expand": torch.randn(3, 1).expand(3, 4), "step": torch.randn(10)[::4],
            "overlap": torch.arange(10.0).as_strided((4, 3), (2, 1), 1)}


def shared_storage():
    _seeded(6)
    a = torch.randn(6, 4)
    b = torch.randn(5)
    return {"a": a, "a_view": a[2:].view(-1), "other": b, "b_again": b[1:3], "c": torch.randn(2)}


def tied():
    _seeded(7)
    w = torch.nn.Parameter(torch.randn(5, 3))
    return {"encoder.weight": w, "decoder.weight": w, "bias": torch.zeros(5), "list": [w, w]}


def params():
    _seeded(8)
    return {"p_grad": torch.nn.Parameter(torch.randn(3, 2)),
            "p_nograd": torch.nn.Parameter(torch.randn(4), requires_grad=False),
            "t_grad": torch.randn(2, 2).requires_grad_(),
            "t": torch.randn(2),
            "p_int": torch.nn.Parameter(torch.arange(3), requires_grad=False)}


def nested():
    _seeded(9)
    t = [torch.randn(i + 1) for i in range(6)]
    return {
        "a": [(1, {"x": t[0], 3: t[1]}), [t[2], "s", None], ()],
        7: {"y": (t[3],), -1: [t[4]]},
        "od": collections.OrderedDict([("z", t[5]), ("k", [])]),
        "empty_list": [], "empty_dict": {}, "empty_tuple": (),
    }


def values():
    return {
        "int": 42, "neg": -7, "zero": 0, "i16": 40000, "i32": -(2 ** 31), "big": 2 ** 70,
        "bigneg": -(2 ** 65) + 3, "float": 1.5, "nan": math.nan, "inf": math.inf, "ninf": -math.inf,
        "negzero": -0.0, "tiny": 5e-324, "str": "h\u00e9llo \u2713 \u65e5\u672c \U0001F600", "empty_str": "",
        "bytes": b"\x00\xff\x80abc", "empty_bytes": b"", "none": None, "true": True, "false": False,
        "t": torch.arange(4, dtype=torch.int16), "list": [1, 2.5, "x"], "tuple": (None, True),
    }


def adam():
    _seeded(10)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(8, 4)).pow(2).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3, "loss": 0.125}


def _module():
    _seeded(11)
    return torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 6),
                               torch.nn.BatchNorm1d(6), torch.nn.Linear(6, 2))


def module_sd():
    m = _module()
    m.train()
    m[2](torch.randn(5, 6))  # update the running stats and num_batches_tracked
    return m.state_dict()


def plain_sd():
    _seeded(12)
    return {"w": torch.randn(3, 4), "b": torch.randn(3), "steps": torch.tensor(5), "h": torch.randn(2, 2).half()}


def single_tensor():
    return torch.arange(12, dtype=torch.float64).reshape(3, 4)


def many_keys():
    # > 1000 dict items (pickle batches SETITEMS per 1000) and > 256 memo entries
    # (BINPUT -> LONG_BINPUT).
    return {f"layer{i}.w": torch.full((2,), float(i)) for i in range(1100)}


def big():
    _seeded(13)
    return {"big": torch.randn(1024, 1024), "small": torch.ones(3)}  # 4 MiB


def ordered():
    return collections.OrderedDict([("b", torch.ones(2)), ("a", torch.zeros(1))])


# --- files ckpt must refuse -------------------------------------------------

# A class in a module that does not exist anywhere: loading the file requires
# importing it, so ckpt must refuse and name it.  Registered in sys.modules only
# while pickling.
EVIL_MODULE = "ckpt_interop_evil"


class Foo:
    def __init__(self):
        self.x = 1


Foo.__module__ = EVIL_MODULE


class _Exploit:
    """Reduces to os.system(...): a loader that ran it would create MARKER."""

    marker = None

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def custom_class():
    return {"w": torch.ones(2), "obj": Foo()}


def evil_reduce(marker):
    e = _Exploit()
    e.marker = marker
    return {"w": torch.ones(2), "payload": e}


# Name of the global each refusal case must name (os.system pickles as posix.system).
REFUSE = {
    "custom_class": f"{EVIL_MODULE}.Foo",
    "evil_reduce": f"{os.system.__module__}.system",
}


# torch 2.x: the major version of the running torch ("2.11.0+cu130", "1.13.0a0").
TORCH2 = int(torch.__version__.split(".")[0]) >= 2
# What torch 1.13's weights-only unpickler lacks and torch 2.x has (checked by loading every
# corpus file with weights_only=True under 1.13.0 and 2.11.0): the BINFLOAT opcode (any Python
# float: "Unsupported operand 71") and torch._utils._rebuild_qtensor (quantized tensors).
WO_TORCH2 = TORCH2


class Case:
    """weights_only: whether torch.load(weights_only=True) of the running torch reads the file."""

    def __init__(self, name, build, legacy=False, byte_identity=False, notes=(), weights_only=True):
        self.name, self.build, self.legacy, self.byte_identity = name, build, legacy, byte_identity
        self.notes = frozenset(notes)
        self.weights_only = weights_only


CASES = (
    [Case(f"dtype_{str(d)[6:]}", _dtype_case(d), legacy=d in (torch.float32, torch.bfloat16, torch.complex128, torch.bool))
     for d in DTYPES]
    + [Case(f"quant_{str(q)[6:]}", _quant(q), legacy=q == torch.qint8, weights_only=WO_TORCH2)
       for q in (torch.qint8, torch.quint8, torch.qint32)]
    + [
        Case("quant_per_channel", quant_per_channel, legacy=True, weights_only=WO_TORCH2),
        Case("quant_subbyte", quant_subbyte, notes={"subbyte"}, weights_only=WO_TORCH2),
        Case("scalars_0d", scalars_0d, legacy=True),
        Case("empty", empty, legacy=True),
        Case("views", views, legacy=True),
        Case("view_only", view_only),
        Case("noncontig", noncontig, legacy=True),
        Case("shared_storage", shared_storage),
        Case("tied", tied, legacy=True),
        Case("params", params, legacy=True),
        Case("nested", nested, legacy=True),
        # bytes: protocol 2 pickles b"..." as GLOBAL _codecs.encode / __builtin__.bytes, which
        # no torch allowlists (and 1.13 lacks BINFLOAT besides)
        Case("values", values, legacy=True, weights_only=False),
        Case("adam", adam, legacy=True, weights_only=WO_TORCH2),  # lr, betas...: floats
        Case("module_sd", module_sd, legacy=True, byte_identity=True),
        Case("plain_sd", plain_sd, byte_identity=True),
        Case("single_tensor", single_tensor, byte_identity=True),
        Case("many_keys", many_keys, byte_identity=True),
        Case("big", big, legacy=True),
        Case("ordered", ordered, byte_identity=True),
    ]
)
CASE_BY_NAME = {c.name: c for c in CASES}


def _save(obj, path, legacy):
    torch.save(obj, path, _use_new_zipfile_serialization=not legacy)


def generate(outdir):
    """Write the corpus into outdir.

    Returns {"files": {file_id: path}, "refuse": {file_id: (path, global_name)},
    "marker": path that must never come into existence}.  file_id is the case
    name, plus ".legacy" for the legacy-format copy.
    """
    os.makedirs(outdir, exist_ok=True)
    files = {}
    for case in CASES:
        obj = case.build()
        path = os.path.join(outdir, f"{case.name}.pt")
        _save(obj, path, legacy=False)
        files[case.name] = path
        if case.legacy:
            obj = case.build()  # fresh objects: storage keys restart from a clean id map
            path = os.path.join(outdir, f"{case.name}.legacy.pt")
            _save(obj, path, legacy=True)
            files[f"{case.name}.legacy"] = path

    refuse = {}
    marker = os.path.join(outdir, "PWNED_MARKER")
    sys.modules[EVIL_MODULE] = types.ModuleType(EVIL_MODULE)
    sys.modules[EVIL_MODULE].Foo = Foo
    try:
        for legacy in (False, True):
            suffix = ".legacy" if legacy else ""
            for name, obj in (("custom_class", custom_class()), ("evil_reduce", evil_reduce(marker))):
                path = os.path.join(outdir, f"{name}{suffix}.pt")
                _save(obj, path, legacy)
                refuse[name + suffix] = (path, REFUSE[name])
    finally:
        del sys.modules[EVIL_MODULE]
    return {"files": files, "refuse": refuse, "marker": marker}


def file_case(file_id):
    """The Case a corpus file id belongs to."""
    return CASE_BY_NAME[file_id.split(".")[0]]


def weights_only(file_id):
    """The weights_only= to pass torch.load for a corpus file: True where the running torch's
    weights-only unpickler reads it (Case.weights_only says why not elsewhere)."""
    return file_case(file_id).weights_only


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUTDIR")
    result = generate(sys.argv[1])
    for fid, path in sorted(result["files"].items()):
        print(f"{fid}\t{path}\t{os.path.getsize(path)}")
    for fid, (path, glob) in sorted(result["refuse"].items()):
        print(f"{fid}\t{path}\trefuse {glob}")
