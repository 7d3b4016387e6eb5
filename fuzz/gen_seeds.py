#!/usr/bin/python3
"""Writes fuzz seed corpora of real files into OUT/<target>/ (make fuzz calls it).

Torch files come from the real torch.save (Debian's python3-torch); tensorizer files are the
fixtures written by the real tensorizer 2.11.1 (docs/formats/tensorizer.md "tensorizer",
**Fixtures**; not part of the repository: FIXTURES_DIR, by default ../shared/fixtures/tensorizer
beside the checkout, and no tensorizer seeds when it is absent). Seeds are small so that
the fuzzer mutates structure, not megabytes of tensor data.

Usage: gen_seeds.py OUT [FIXTURES_DIR]
"""
import collections
import io
import json
import os
import pickle
import struct
import sys
import zipfile


def write(out, target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def torch_seeds(out):
    import torch

    torch.manual_seed(0)
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    objs = {
        "state_dict": collections.OrderedDict(
            w=torch.ones(2, 3), b=torch.zeros(3, dtype=torch.float16)),
        "views": {"a": base, "t": base.t(), "row": base[1], "step": base[:, ::2]},
        "dtypes": [torch.tensor([1, 2], dtype=dt) for dt in
                   (torch.int8, torch.uint8, torch.int64, torch.bool, torch.bfloat16,
                    torch.complex64, torch.float64)],
        "optimizer": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(2)}},
                      "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "params": [0],
                                        "name": "g", "flag": None, "big": 2**70}]},
        "param": {"p": torch.nn.Parameter(torch.ones(2)), "e": torch.empty(0),
                  "s": torch.tensor(5)},
        "quant": {"q": torch.quantize_per_tensor(torch.ones(4), 0.5, 2, torch.quint8)},
        "module": torch.nn.Linear(2, 2).state_dict(),
    }
    for name, obj in objs.items():
        buf = io.BytesIO()
        torch.save(obj, buf)
        data = buf.getvalue()
        write(out, "torch", name + ".pt", data)
        write(out, "zip_reader", name + ".pt", data)
        if name in ("param", "module"):  # single tensors, as a DCP chunk's item holds one
            for key, t in obj.items():
                if isinstance(t, torch.Tensor) and t.numel():
                    one = io.BytesIO()
                    torch.save(t.detach(), one)
                    write(out, "dcp_chunk", f"{name}_{key}.pt", one.getvalue())
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            pkl = [n for n in z.namelist() if n.endswith("data.pkl")][0]
            write(out, "pickle", name + ".pkl", z.read(pkl))
        if name != "quant":
            buf = io.BytesIO()
            torch.save(obj, buf, _use_new_zipfile_serialization=False)
            write(out, "legacy", name + ".pt", buf.getvalue())
    # Legacy files in the other pickle protocols: text opcodes and a text persistent id (0),
    # no PROTO (0, 1), FRAME (4, 5).
    for p in (0, 1, 3, 4, 5):
        buf = io.BytesIO()
        torch.save(objs["state_dict"], buf, _use_new_zipfile_serialization=False, pickle_protocol=p)
        write(out, "legacy", f"state_dict_p{p}.pt", buf.getvalue())


def torchscript_seeds(out):
    import torch

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)
            self.register_buffer("buf", torch.ones(2))

        def forward(self, x):
            return self.lin(x) + self.buf + torch.tensor([1.0, 2.0])

    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(M()), buf, _extra_files={"meta.txt": "hello"})
    data = buf.getvalue()
    write(out, "torchscript", "module.pt", data)
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for n in z.namelist():
            if n.endswith(".debug_pkl"):
                write(out, "torchscript", n.replace("/", "_"), z.read(n))


def zip_seeds(out):
    for method, tag in ((zipfile.ZIP_STORED, "stored"), (zipfile.ZIP_DEFLATED, "deflated")):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", method) as z:
            z.writestr("archive/data.pkl", pickle.dumps({"a": 1}, protocol=2))
            z.writestr("archive/data/0", b"\0" * 64 + b"x" * 64)
            z.writestr("archive/version", b"3\n")
        write(out, "zip_reader", tag + ".zip", buf.getvalue())
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, allowZip64=True) as z:
        with z.open("archive/big", "w", force_zip64=True) as f:
            f.write(b"y" * 1000)
    write(out, "zip_reader", "zip64.zip", buf.getvalue())


def pickle_seeds(out):
    values = [None, True, 1, -1, 2**40, 2**100, 1.5, "text", b"bytes", bytearray(b"ba"),
              (1, 2), [1, [2, [3]]], {"k": {"n": [1, 2.0, "3"]}}, {1, 2}, frozenset([3]),
              complex(1, 2), collections.OrderedDict(a=1)]
    for proto in range(0, 6):
        write(out, "pickle", "values_p%d.pkl" % proto, pickle.dumps(values, protocol=proto))
    shared = [1, 2]
    write(out, "pickle", "memo.pkl", pickle.dumps([shared, shared, {"s": shared}], protocol=2))


def safetensors_seeds(out):
    def st(tensors, meta=None, pad=8):
        header = {}
        if meta:
            header["__metadata__"] = meta
        data = b""
        for name, (dtype, shape, raw) in tensors.items():
            header[name] = {"dtype": dtype, "shape": shape,
                            "data_offsets": [len(data), len(data) + len(raw)]}
            data += raw
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % pad)
        return struct.pack("<Q", len(h)) + h + data

    write(out, "safetensors", "basic.safetensors",
          st({"w": ("F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)),
              "b": ("BF16", [2], b"\x80\x3f\x00\x40")}, {"format": "pt"}))
    write(out, "safetensors", "dtypes.safetensors",
          st({"i8": ("I8", [3], b"\1\2\3"), "u64": ("U64", [1], b"\1" * 8),
              "bool": ("BOOL", [2], b"\0\1"), "f16": ("F16", [1, 1], b"\0\x3c"),
              "e": ("F64", [0], b""), "s": ("I32", [], b"\7\0\0\0")}))


def tensorizer_seeds(out, fixtures):
    if not fixtures or not os.path.isdir(fixtures):
        return
    for name in sorted(os.listdir(fixtures)):
        if not name.endswith(".tensors"):
            continue
        with open(os.path.join(fixtures, name), "rb") as f:
            data = f.read()
        if len(data) < 2 << 20:  # the 4 MiB encrypted fixture only slows every execution
            write(out, "tensorizer", name, data)
        # Per-tensor headers for the header target: [header offset, data offset) from the index.
        version, = struct.unpack_from("<I", data, 5)
        count, = struct.unpack_from("<Q", data, 57)
        pos = 73
        for i in range(count):
            n, = struct.unpack_from("<H", data, pos); pos += 2 + n
            pos += 1
            n = data[pos]; pos += 1 + n
            nd = data[pos]; pos += 1 + 4 * nd
            hoff, doff, dlen = struct.unpack_from("<QQQ", data, pos); pos += 24
            if i < 3:
                flag = b"\1" if version == 3 or (version >= 4 and data[9] & 1) else b"\0"
                write(out, "tensorizer_header", "%s.%d" % (name, i), flag + data[hoff:doff])


def onnx_seeds(out):
    """Small ONNX models from python3-onnx: raw_data and typed initializers, a subgraph with a
    Constant, and an external-data entry (its file is absent: the reader still parses it)."""
    import numpy as np
    import onnx
    from onnx import TensorProto as T, helper as h, numpy_helper as nh
    inits = [nh.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w"),
             h.make_tensor("i8", T.INT8, [3], [1, -2, 3]),
             h.make_tensor("f16", T.FLOAT16, [2], [1.5, -2.0]),
             h.make_tensor("i64", T.INT64, [2], [1, -1]),
             h.make_tensor("d", T.DOUBLE, [1], [0.25])]
    body = h.make_graph([h.make_node("Constant", [], ["c"], value=nh.from_array(np.ones(2, np.float32), "c"))],
                        "then", [], [h.make_tensor_value_info("c", T.FLOAT, [2])],
                        [nh.from_array(np.zeros(2, np.float32), "sub_w")])
    g = h.make_graph([h.make_node("If", ["cond"], ["o"], then_branch=body, else_branch=body)], "g",
                     [h.make_tensor_value_info("cond", T.BOOL, [])],
                     [h.make_tensor_value_info("o", T.FLOAT, [2])], inits)
    write(out, "onnx", "basic.onnx", h.make_model(g).SerializeToString())
    t = T()
    t.name, t.data_type, t.data_location = "ext", T.FLOAT, T.EXTERNAL
    t.dims.extend([4])
    for k, v in (("location", "w.bin"), ("offset", "0"), ("length", "16"),
                 ("prepacked_0", "MatMul+1|4096;16;0")):
        e = t.external_data.add()
        e.key, e.value = k, v
    g2 = h.make_graph([], "g", [], [], [t])
    write(out, "onnx", "external.onnx", h.make_model(g2).SerializeToString())


def dcp_seeds(out):
    """`.metadata` pickles written opcode by opcode (protocol 2, as pickle writes torch's
    dataclasses; torch itself is not needed): list indexes in planner_data that ask for padding,
    many entries sharing one byte range of a data file, optimizer-shaped states of 256 and 32
    keys with nested planner paths, a cycle through the memo, a key listed twice and a tree nested
    deeper than the depth limit."""
    md_mod = b"torch.distributed.checkpoint.metadata"

    def glob(module, name):
        return b"c" + module + b"\n" + name + b"\n"

    def text(x):
        b = x.encode()
        return b"X" + struct.pack("<I", len(b)) + b

    def num(x):
        return b"J" + struct.pack("<i", x)

    def tup(*items):
        return b"(" + b"".join(items) + b"t"

    def items(pairs):
        return b"(" + b"".join(k + v for k, v in pairs) + b"u"

    def obj(module, name, fields):
        return glob(module, name) + b")\x81}" + items((text(k), v) for k, v in fields) + b"b"

    def size(dims):
        return glob(b"torch", b"Size") + tup(tup(*map(num, dims))) + b"R"

    def tensor(dims):
        props = glob(md_mod, b"TensorProperties") + b")\x81" + tup(
            glob(b"torch", b"float32"), glob(b"torch", b"strided"), b"\x89",
            glob(md_mod, b"_MEM_FORMAT_ENCODING") + tup(num(0)) + b"R", b"\x89") + b"b"
        chunk = obj(md_mod, b"ChunkStorageMetadata",
                    [("offsets", size([0] * len(dims))), ("sizes", size(dims))])
        return obj(md_mod, b"TensorStorageMetadata",
                   [("properties", props), ("size", size(dims)), ("chunks", b"](" + chunk + b"e")])

    def metadata(entries, planner, storage):
        sdm = b"}" + items((text(k), v) for k, v in entries)
        pd = b"}" + items((text(k), tup(*(text(x) if isinstance(x, str) else num(x) for x in p)))
                          for k, p in planner)
        sd = b"}" + items(
            (obj(md_mod, b"MetadataIndex",
                 [("fqn", text(k)), ("offset", size(off)), ("index", b"N")]),
             obj(b"torch.distributed.checkpoint.filesystem", b"_StorageInfo",
                 [("relative_path", text("__0_0.distcp")), ("offset", num(o)),
                  ("length", num(n))]))
            for k, off, o, n in storage)
        return b"\x80\x02" + obj(md_mod, b"Metadata", [
            ("state_dict_metadata", sdm), ("planner_data", pd), ("storage_data", sd),
            ("version", text("1.0.0"))]) + b"."

    bytes_md = glob(md_mod, b"BytesStorageMetadata") + b")\x81"
    # Padding: a few list positions, one far past the entries (torch writes gaps: an empty
    # dict in a list leaves no key).
    keys = ["a.0", "a.3", "b.16777216", "c.2.1"]
    write(out, "dcp_metadata", "index_padding.metadata", metadata(
        [(k, bytes_md) for k in keys],
        [("a.0", ("a", 0)), ("a.3", ("a", 3)), ("b.16777216", ("b", 16777216)),
         ("c.2.1", ("c", 2, 1))],
        [(k, [], 0, 8) for k in keys]))
    # 64 tensors whose items all lie on the same 64 bytes.
    keys = [f"w{i}" for i in range(64)]
    write(out, "dcp_metadata", "shared_range.metadata", metadata(
        [(k, tensor([4, 4])) for k in keys], [(k, (k,)) for k in keys],
        [(k, [0, 0], 0, 64) for k in keys]))
    # A state_dict_metadata dict that holds the Metadata object itself (memo): a cycle.
    write(out, "dcp_metadata", "cycle.metadata",
          b"\x80\x02" + glob(md_mod, b"Metadata") + b")\x81q\x00}" +
          items([(text("state_dict_metadata"), b"}" + items([(text("x"), b"h\x00")]))]) + b"b.")
    # The same key twice in state_dict_metadata (SETITEMS appends).
    write(out, "dcp_metadata", "keys_twice.metadata", metadata(
        [("k", bytes_md), ("k", bytes_md)], [], [("k", [], 0, 8)]))
    # A version nested 5,000 TUPLE1 deep (a tree deeper than max_pickle_depth).
    deep = metadata([("k", bytes_md)], [], [("k", [], 0, 8)])
    write(out, "dcp_metadata", "deep_tuple.metadata",
          deep.replace(text("1.0.0"), text("1.0.0") + b"\x85" * 5000))
    def many_keys(params, name):
        """PARAMS parameters and Adam's state for each: 4 x PARAMS keys, nested paths, one item
        each (the shape whose reading was once quadratic)."""
        entries, planner, storage = [], [], []
        for i in range(params):
            p = f"layers.{i}.weight"
            for path in (("model", p), ("optim", "state", p, "exp_avg"),
                         ("optim", "state", p, "exp_avg_sq"), ("optim", "state", p, "step")):
                key = ".".join(path)
                entries.append((key, tensor([] if path[-1] == "step" else [8])))
                planner.append((key, path))
                storage.append((key, [] if path[-1] == "step" else [0], 32 * len(storage), 32))
        write(out, "dcp_metadata", name, metadata(entries, planner, storage))

    many_keys(64, "many_keys.metadata")
    many_keys(8, "some_keys.metadata")


def main():
    out = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    fixtures = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        here, "..", "..", "shared", "fixtures", "tensorizer")
    zip_seeds(out)
    pickle_seeds(out)
    safetensors_seeds(out)
    try:
        onnx_seeds(out)
    except ImportError:
        print("gen_seeds.py: no python3-onnx; onnx seeds come from fuzz/corpus only", file=sys.stderr)
    tensorizer_seeds(out, fixtures)
    dcp_seeds(out)
    try:
        torch_seeds(out)
        torchscript_seeds(out)
    except ImportError:
        print("gen_seeds.py: no torch; torch seeds come from fuzz/corpus only", file=sys.stderr)


if __name__ == "__main__":
    main()
