#!/usr/bin/env python3
"""onnxruntime session start and resident memory (issue 12, docs/benchmarks/onnx.md "ONNX").

Builds a model of LAYERS MatMuls with N x N float32 weights (default 16 x 2816^2: 507 MB) with
onnx, then for each variant starts onnxruntime 1.30 sessions (PyPI's Python package), each in a
process of its own (this script again, with --session): one alone (cold page cache not forced: a
warm-cache start, the figure a server restart sees) and four at once in four processes, reporting
the time to create the session (InferenceSession(...), after the imports) and each process's
PSS and RSS (/proc/self/smaps_rollup) while all four hold their session. Separate processes are
the point: what the four can share is the page cache of the files they map.

Variants: inline (one .onnx), external (onnx's external data, offsets unaligned),
aligned (ckpt rewrite --align 4096), prepacked (onnxruntime's optimized model with pre-packed
blobs, rewritten aligned by ckpt).

Run it with an interpreter that has onnx, numpy and onnxruntime: the peer venv's
(scripts/install-peers.sh prints its path). The sessions run under the same interpreter.

Usage: $PEERS/bin/python bench/onnx_session.py CKPT_BIN WORKDIR [LAYERS N]
"""
import json
import os
import subprocess
import sys
import time


def session_main(model, hold_ms, n):
    """One process: create a session on model, run it once on zeros, hold it for hold_ms
    (while the others load), then print one JSON line: create_ms, run_ms, rss_kb, pss_kb."""
    import numpy as np
    import onnxruntime as ort
    t0 = time.perf_counter()
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    t1 = time.perf_counter()
    s.run(None, {s.get_inputs()[0].name: np.zeros((1, n), np.float32)})
    t2 = time.perf_counter()
    time.sleep(hold_ms / 1000)
    mem = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss"):
                mem[key.lower() + "_kb"] = int(rest.split()[0])
    print(json.dumps({"create_ms": (t1 - t0) * 1e3, "run_ms": (t2 - t1) * 1e3, **mem}))


def optimize_main(model, opt_model, opt_data, n):
    """One process: onnxruntime's optimized model of model (level "all") saved as opt_model,
    initializers of 1 KiB or more and the pre-packed weights in opt_data beside it."""
    import numpy as np
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3  # its warning that pre-packs fit this machine only: known
    so.optimized_model_filepath = opt_model
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    for key, value in (("save_external_prepacked_constant_initializers", "1"),
                       ("optimized_model_external_initializers_file_name", opt_data),
                       ("optimized_model_external_initializers_min_size_in_bytes", "1024")):
        so.add_session_config_entry("session." + key, value)
    s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    s.run(None, {s.get_inputs()[0].name: np.zeros((1, n), np.float32)})


def child(*args):
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def result(p):
    out = p.communicate()[0]
    if p.returncode != 0:
        sys.exit(f"a session process failed (exit {p.returncode}): {p.args}")
    return json.loads(out)


def main():
    import numpy as np
    import onnx
    import onnxruntime
    from onnx import TensorProto as T, helper as h, numpy_helper as nh
    ckpt, work = sys.argv[1], os.path.abspath(sys.argv[2])
    layers = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 2816
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(0)
    inits, nodes, prev = [], [], "x"
    for i in range(layers):
        inits.append(nh.from_array((rng.standard_normal((n, n)) / n).astype(np.float32), f"w{i}"))
        nodes.append(h.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"]))
        prev = f"h{i}"
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [1, n])],
                     [h.make_tensor_value_info(prev, T.FLOAT, [1, n])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 8
    paths = {}
    paths["inline"] = os.path.join(work, "inline.onnx")
    onnx.save(m, paths["inline"])
    os.makedirs(os.path.join(work, "ext"), exist_ok=True)
    paths["external"] = os.path.join(work, "ext", "ext.onnx")
    onnx.save_model(m, paths["external"], save_as_external_data=True, all_tensors_to_one_file=True,
                    location="ext.onnx.data", size_threshold=1024)
    del m, g, inits
    paths["aligned"] = os.path.join(work, "aligned.onnx")
    subprocess.run([ckpt, "rewrite", paths["inline"], paths["aligned"], "--external-data",
                    paths["aligned"] + ".data", "--align", "4096", "--align-threshold", "1MiB",
                    "--size-threshold", "1024"], check=True, stdout=subprocess.DEVNULL)
    # onnxruntime's optimized model with pre-packs (in a process of its own), then aligned by ckpt
    opt = os.path.join(work, "opt.onnx")
    subprocess.run([sys.executable, os.path.abspath(__file__), "--optimize", paths["aligned"], opt,
                    "opt.onnx.data", str(n)], check=True, stderr=subprocess.DEVNULL)
    paths["prepacked"] = os.path.join(work, "prepacked.onnx")
    subprocess.run([ckpt, "rewrite", opt, paths["prepacked"], "--external-data",
                    paths["prepacked"] + ".data"], check=True, stdout=subprocess.DEVNULL)
    weights = layers * n * n * 4
    print(f"model: {layers} MatMul weights of {n}x{n} float32, {weights / 1e6:.0f} MB; "
          f"onnxruntime {onnxruntime.__version__} (Python {sys.version.split()[0]}, {sys.executable})")
    print(f"{'variant':10} {'start ms (1 proc)':>18} {'start ms (4 procs, max)':>24} "
          f"{'PSS MiB each (4 procs)':>24} {'RSS MiB each':>14}")
    for variant, p in paths.items():
        one = result(child("--session", p, 0, n))
        procs = [child("--session", p, 3000, n) for _ in range(4)]
        four = [result(pr) for pr in procs]
        print(f"{variant:10} {one['create_ms']:18.0f} {max(r['create_ms'] for r in four):24.0f} "
              f"{np.mean([r['pss_kb'] for r in four]) / 1024:24.0f} "
              f"{np.mean([r['rss_kb'] for r in four]) / 1024:14.0f}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--session":
        session_main(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--optimize":
        optimize_main(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        main()
