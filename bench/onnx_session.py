#!/usr/bin/python3
"""onnxruntime session start and resident memory (issue 12, docs/benchmarks.md "ONNX").

Builds a model of LAYERS MatMuls with N x N float32 weights (default 16 x 2816^2: 507 MB) with
python3-onnx, then for each variant starts onnxruntime-node 1.30 sessions (tests/peers/
ort_bench.js): one alone (cold page cache not forced: a warm-cache start, the figure a server
restart sees) and four at once in four processes, reporting the time to create the session and
each process's PSS (/proc/self/smaps_rollup) while all four hold their session.

Variants: inline (one .onnx), external (python3-onnx's external data, offsets unaligned),
aligned (ckpt rewrite --align 4096), prepacked (onnxruntime's optimized model with pre-packed
blobs, rewritten aligned by ckpt).

Usage: bench/onnx_session.py CKPT_BIN WORKDIR [LAYERS N]
"""
import json
import os
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto as T, helper as h, numpy_helper as nh

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = os.path.join(REPO, "tests", "peers")


def node(*args, env=None):
    return subprocess.Popen(["node", *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env)


def main():
    ckpt, work = sys.argv[1], sys.argv[2]
    layers = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 2816
    os.makedirs(work, exist_ok=True)
    subprocess.run([os.path.join(REPO, "scripts", "install-onnxruntime.sh")], check=True)
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
    paths["aligned"] = os.path.join(work, "aligned.onnx")
    subprocess.run([ckpt, "rewrite", paths["inline"], paths["aligned"], "--external-data",
                    paths["aligned"] + ".data", "--align", "4096", "--align-threshold", "1MiB",
                    "--size-threshold", "1024"], check=True, stdout=subprocess.DEVNULL)
    # onnxruntime's optimized model with pre-packs, then aligned by ckpt
    inp = os.path.join(work, "in.json")
    with open(inp, "w") as f:
        json.dump({"x": {"dims": [1, n], "data": [0.0] * n}}, f)
    subprocess.run(["node", os.path.join(PEERS, "ort_run.js"), paths["aligned"], inp,
                    os.path.join(work, "out.json"), "opt.onnx", "opt.onnx.data"], cwd=work,
                   check=True, stderr=subprocess.DEVNULL)
    paths["prepacked"] = os.path.join(work, "prepacked.onnx")
    subprocess.run([ckpt, "rewrite", os.path.join(work, "opt.onnx"), paths["prepacked"],
                    "--external-data", paths["prepacked"] + ".data"], check=True,
                   stdout=subprocess.DEVNULL)
    env = dict(os.environ, BENCH_N=str(n))
    weights = layers * n * n * 4
    print(f"model: {layers} MatMul weights of {n}x{n} float32, {weights / 1e6:.0f} MB")
    print(f"{'variant':10} {'start ms (1 proc)':>18} {'start ms (4 procs, max)':>24} "
          f"{'PSS MiB each (4 procs)':>24} {'RSS MiB each':>14}")
    for variant, p in paths.items():
        one = json.loads(node(os.path.join(PEERS, "ort_bench.js"), p, "0", env=env).communicate()[0])
        procs = [node(os.path.join(PEERS, "ort_bench.js"), p, "3000", env=env) for _ in range(4)]
        four = [json.loads(pr.communicate()[0]) for pr in procs]
        print(f"{variant:10} {one['create_ms']:18.0f} {max(r['create_ms'] for r in four):24.0f} "
              f"{np.mean([r['pss_kb'] for r in four]) / 1024:24.0f} "
              f"{np.mean([r['rss_kb'] for r in four]) / 1024:14.0f}")


if __name__ == "__main__":
    main()
