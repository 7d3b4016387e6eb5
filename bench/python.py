#!/usr/bin/python3
"""The Python module against torch.load, in one run, on the same files (page cache warm).

Writes (once) a 1 GiB torch checkpoint of 256 float32 tensors and one of 20,000 tensors with
torch.save, and the same tensors as a tensorizer .tensors file (ckpt.save). Each measurement runs
in --processes fresh /usr/bin/python3 processes (the median of their medians: this machine's
speed drifts by tens of percent from one process to the next), in-process timing
(time.perf_counter), one untimed warm-up load, then the median of --repeat loads:

  torch.load(f)                         the peer
  ckpt.load(f)                          eager: tensors in memory of their own (a repeat load
                                        reuses the memory the last one freed: ckpt/memory.h)
  ckpt.load(f), no memory kept          the same with ckpt.set_kept_memory_limit(0): every load
                                        faults in fresh memory
  ckpt.load(f, mmap=True)               zero-copy views of a private mapping
  ckpt.load(f.tensors)                  the same tensors from the tensorizer file
  tensorizer TensorDeserializer         PyPI's tensorizer (tests/peers/requirements.txt), run by
                                        the peer venv's interpreter (scripts/install-peers.sh;
                                        --tensorizer-python PY picks another one), with torch
                                        2.x; its ratio is against ckpt.load(f.tensors) timed in
                                        that same interpreter. --tensorizer DIR (or
                                        $TENSORIZER_SRC) instead runs a local checkout of
                                        tensorizer's public repository under /usr/bin/python3
                                        (its Python dependencies: `make bench-peers`). Without
                                        either the row says "skipped" and why
and the first load of a fresh process (torch and ckpt imported, then one timed call: what a
program that loads once pays, first-touch page faults of fresh memory included; page cache
warm), and, in fresh processes: peak RSS of an eager ckpt.load over the interpreter's own (after
importing torch and ckpt), and the time of `import ckpt` alone (median of 5 processes).

    /usr/bin/python3 bench/python.py [--size-mb 1024] [--repeat 5] [--out build/bench-python]
        [--pythonpath build/python] [--tensorizer-python PY | --tensorizer DIR] [--processes 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GEN = textwrap.dedent(r"""
    import collections, sys, torch
    path, n, size_mb = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    sys.path.insert(0, sys.argv[4]); import ckpt
    torch.manual_seed(0)
    numel = int(size_mb * 2**20 / 4 / n)
    sd = collections.OrderedDict((f"layers.{i}.weight", torch.randn(numel)) for i in range(n))
    torch.save(sd, path)
    ckpt.save(sd, path[:-3] + ".tensors")
""")

TIME = textwrap.dedent(r"""
    import json, os, resource, sys, time, warnings
    warnings.filterwarnings("ignore")
    path, repeat, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    sys.path.insert(0, sys.argv[4])
    import torch, ckpt
    if what == "torch":
        fn = lambda: torch.load(path)
    elif what == "ckpt":
        fn = lambda: ckpt.load(path)
    elif what == "ckpt-fresh":  # no memory kept from the last load (ckpt/memory.h)
        ckpt.set_kept_memory_limit(0)
        fn = lambda: ckpt.load(path)
    elif what == "ckpt-mmap":
        fn = lambda: ckpt.load(path, mmap=True)
    elif what == "tensorizer":
        if len(sys.argv) > 5:  # a checkout (--tensorizer DIR); else the interpreter's own
            sys.path.insert(0, sys.argv[5])
        from tensorizer import TensorDeserializer
        fn = lambda: TensorDeserializer(path, device="cpu")
    elif what == "rss":
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        t0 = time.perf_counter(); sd = ckpt.load(path); dt = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(json.dumps({"base": base, "peak": peak, "seconds": dt})); sys.exit(0)
    if os.environ.get("CKPT_BENCH_FIRST") == "1":  # the process's first call, alone
        t0 = time.perf_counter(); sd = fn(); dt = time.perf_counter() - t0
        print(json.dumps({"median": dt, "min": dt})); sys.exit(0)
    sd = fn(); del sd  # warm-up (page cache, allocator)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter(); sd = fn(); times.append(time.perf_counter() - t0); del sd
    print(json.dumps({"median": sorted(times)[len(times) // 2], "min": min(times)}))
""")

IMPORT = ("import sys, time; sys.path.insert(0, sys.argv[1]); t = time.perf_counter(); "
          "import ckpt; print(time.perf_counter() - t)")


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr}")
    return r.stdout


def peer_python():
    """The peer venv's interpreter if scripts/install-peers.sh completed it (found as that script
    names it: the hash of tests/peers/requirements.txt; never installed from here), else None."""
    import hashlib
    with open(os.path.join(REPO, "tests", "peers", "requirements.txt"), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    root = os.environ.get("CKPT_PEERS_ROOT") or os.path.expanduser("~/.cache/ckpt")
    venv = os.path.join(root, f"peers-{digest}")
    ok = os.path.isfile(os.path.join(venv, ".complete"))
    return os.path.join(venv, "bin", "python") if ok else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(REPO, "build", "bench-python"))
    ap.add_argument("--pythonpath", default=os.path.join(REPO, "build", "python"))
    ap.add_argument("--size-mb", type=float, default=1024)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tensorizer", default=os.environ.get("TENSORIZER_SRC"),
                    help="a local checkout of tensorizer, run under /usr/bin/python3 (optional)")
    ap.add_argument("--tensorizer-python", default=None,
                    help="the interpreter whose PyPI tensorizer the row runs (default: the peer "
                    "venv's, scripts/install-peers.sh)")
    ap.add_argument("--processes", type=int, default=3,
                    help="fresh processes per measurement; the median of their medians")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    py = "/usr/bin/python3"
    # The tensorizer row: (interpreter, extra argv for TIME, what it is), or None and why not.
    tz, tz_why = None, "no peer venv (scripts/install-peers.sh) and no --tensorizer DIR"
    if a.tensorizer:
        if os.path.isdir(os.path.join(a.tensorizer, "tensorizer")):
            tz = (py, [a.tensorizer], f"the checkout in {a.tensorizer}")
        else:
            tz_why = f"no tensorizer package in {a.tensorizer}"
    elif a.tensorizer_python or peer_python():
        tzpy = a.tensorizer_python or peer_python()
        tz = (tzpy, [], f"the tensorizer that {tzpy} imports")
    if tz:
        print(f"tensorizer: {tz[2]}")
    print(f"machine: {os.cpu_count()} cores; files in {a.out}; each kind in {a.processes} fresh "
          f"processes, each the median of {a.repeat} loads after one warm-up; the median of "
          "those medians\n")
    print("| file | torch.load | ckpt.load | ratio | ckpt.load, no memory kept | ratio | "
          "ckpt.load(mmap=True) | ratio | ckpt.load(.tensors) | tensorizer | ratio | "
          "peak RSS over interpreter (file size) | first load: torch.load | ckpt.load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")

    def timed(args, first=None):
        """The median over a.processes fresh processes of each one's median (`first`: the
        output of one such process already run)."""
        ms = [json.loads(first)["median"]] if first else []
        ms += [json.loads(run(args))["median"] for _ in range(a.processes - len(ms))]
        return {"median": statistics.median(ms), "runs": ms}
    for label, n in (("256 tensors", 256), ("20,000 tensors", 20000)):
        path = os.path.join(a.out, f"t{n}.pt")
        tpath = path[:-3] + ".tensors"
        if not (os.path.exists(path) and os.path.exists(tpath)):
            run([py, "-c", GEN, path, str(n), str(a.size_mb), a.pythonpath])
        t = {}
        for what, p in (("torch", path), ("ckpt", path), ("ckpt-fresh", path),
                        ("ckpt-mmap", path), ("ckpt", tpath)):
            key = what if p == path else "ckpt-tensors"
            t[key] = timed([py, "-c", TIME, p, str(a.repeat), what, a.pythonpath])
        tz_skip = f"skipped ({tz_why})"
        if tz:
            tzpy, extra, where = tz
            args = [tzpy, "-c", TIME, tpath, str(a.repeat), "tensorizer", a.pythonpath, *extra]
            r = subprocess.run(args, capture_output=True, text=True)
            if r.returncode == 0:
                t["tensorizer"] = timed(args, r.stdout)
                if tzpy != py:  # the ratio's other side, timed in the same interpreter
                    t["ckpt-tensors-tz"] = timed([tzpy, "-c", TIME, tpath, str(a.repeat), "ckpt",
                                                  a.pythonpath])
            else:  # e.g. a checkout's Python dependencies are missing: `make bench-peers`
                last = (r.stderr.strip().splitlines() or ["?"])[-1]
                tz_skip = f"skipped ({where} failed: {last})"
                print(f"tensorizer row skipped: {r.stderr.strip()[-2000:]}", file=sys.stderr)
        os.environ["CKPT_BENCH_FIRST"] = "1"
        for what in ("torch", "ckpt"):
            t["first-" + what] = timed([py, "-c", TIME, path, "1", what, a.pythonpath])
        del os.environ["CKPT_BENCH_FIRST"]
        rss = json.loads(run([py, "-c", TIME, path, "1", "rss", a.pythonpath]))
        tl = t["torch"]["median"]
        ms = lambda k: f"{t[k]['median'] * 1000:.1f} ms"  # noqa: E731
        have_tz = "tensorizer" in t
        tzc = ms("tensorizer") if have_tz else tz_skip
        tz_ckpt = t.get("ckpt-tensors-tz", t["ckpt-tensors"])
        tzr = f"{t['tensorizer']['median'] / tz_ckpt['median']:.1f}x" if have_tz else "-"
        if "ckpt-tensors-tz" in t:
            tzr += f" (vs {ms('ckpt-tensors-tz')} there)"
        over = (rss["peak"] - rss["base"]) / 2**20
        size = os.path.getsize(path) / 2**20
        print(f"| {label} | {ms('torch')} | {ms('ckpt')} | {tl / t['ckpt']['median']:.1f}x | "
              f"{ms('ckpt-fresh')} | {tl / t['ckpt-fresh']['median']:.1f}x | "
              f"{ms('ckpt-mmap')} | {tl / t['ckpt-mmap']['median']:.1f}x | {ms('ckpt-tensors')} "
              f"| {tzc} | {tzr} | {over:.0f} MiB ({size:.0f} MiB) | {ms('first-torch')} | "
              f"{ms('first-ckpt')} |")
        runs = "; ".join(f"{k} " + ", ".join(f"{x * 1000:.1f}" for x in v["runs"])
                         for k, v in t.items())
        print(f"<!-- {label}, per-process medians (ms): {runs} -->")
    imports = [float(run([py, "-c", IMPORT, a.pythonpath])) for _ in range(5)]
    print(f"\nimport ckpt (alone, fresh process, median of 5): "
          f"{statistics.median(imports) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
