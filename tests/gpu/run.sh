#!/bin/bash
# The GPU table (docs/benchmarks/gpu.md, "Loading into GPU memory"), on a CUDA machine with torch and
# safetensors, from what tests/gpu/pack.sh carried in build-gpu/: nothing of ckpt is built here
# except the Python module (its Python is this machine's).
# Usage: tests/gpu/run.sh [--pending | --quick | --python | --gds | --memory]
#   --pending what docs/benchmarks/gpu.md still needs from a device, in one call of about 5 minutes
#             (under 8): the device-path correctness tests, a rank's Shard(0) load into cuda,
#             `ckpt bench --device` and bench/device.py (first load against warm, the CLI's arena
#             and torch's per-storage allocator, each with its set-up overlapping the first reads
#             and serial: CKPT_DEVICE_OVERLAP=0), and a 60 GB shard set against the link
#   --quick   exactness and `ckpt bench --device` only (no peers, no cold cache, no module)
#   --python  the module, its tests and the peers' rows only
#   --gds     GPUDirect Storage and the cold-cache rows only
#   --sweep   what limits a device load: the CPU's caches, the CLI's reader threads against staging
#             sizes on 8 GiB and on a 60 GB set (fresh processes), and CUDA's own first-use costs
#             (pinned allocation, device allocation, first copy), in one call of about 5 minutes
#   --defaults the default device load on 8 GiB and a 60 GB set: `ckpt bench --device` and
#             bench/device.py (first load and warm, per-storage and arena), about 3 minutes
#   --memory  device memory: the module and its device tests, tests/gpu/memory.py, the device
#             budget refusal, what --gds really did, and bench/load_into.py on the GPU
set -u
ROOT=$(pwd)
G=$ROOT/build-gpu
export LD_LIBRARY_PATH=$G/lib:${LD_LIBRARY_PATH:-}
CKPT=$G/ckpt
DATA=${CKPT_GPU_DATA:-/tmp/ckpt-gpu}
QUICK=0; [ "${1:-}" = "--quick" ] && QUICK=1
PYONLY=0; [ "${1:-}" = "--python" ] && PYONLY=1
GDS=0; [ "${1:-}" = "--gds" ] && GDS=1
MEMORY=0; [ "${1:-}" = "--memory" ] && MEMORY=1 && PYONLY=1
PENDING=0; [ "${1:-}" = "--pending" ] && PENDING=1
SWEEP=0; [ "${1:-}" = "--sweep" ] && SWEEP=1
DEFAULTS=0; [ "${1:-}" = "--defaults" ] && DEFAULTS=1
PY=python3
export PYTHONUNBUFFERED=1
step() { echo; echo "== $* ($(date +%T), ${SECONDS} s)"; }

# The Python module, built here against this machine's Python (PYTHONPATH set on success).
build_module() {
  [ -f "$G/libckpt.a" ] || { echo "no $G/libckpt.a: no module"; return 1; }
  mkdir -p /tmp/ckptpy/ckpt && cp python/ckpt/*.py /tmp/ckptpy/ckpt/
  EXT=$($PY -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  for f in python/src/*.cc; do  # one compiler per file, in parallel
    c++ -O2 -fPIC -std=c++20 -fvisibility=hidden -c "$f" -Iinclude -I"$G/include" \
      $($PY -m pybind11 --includes) -o "/tmp/ckptpy/$(basename "$f" .cc).o" &
  done; wait
  c++ -shared /tmp/ckptpy/*.o "$G/libckpt.a" "$G"/lib/*.so* -lpthread -ldl \
    -o /tmp/ckptpy/ckpt/_ckpt$EXT && export PYTHONPATH=/tmp/ckptpy && echo "module: $EXT"
}

# ckpt load --device's CRC32 of every tensor against the host load's, for `$DATA/$1`.
exactness() {
  $CKPT load "$DATA/$1" --json --digest > /tmp/host.json
  $CKPT load "$DATA/$1" --json --digest --device cuda:0 > /tmp/dev.json
  $CKPT load "$DATA/$1" --json --digest --device cuda:0 --verify --staging-mb 8 --threads 3 > /tmp/dev2.json
  CKPT_DEVICE_OVERLAP=0 $CKPT load "$DATA/$1" --json --digest --device cuda:0 > /tmp/dev3.json
  $PY - "$1" <<'PY'
import json, sys
h, d, d2, d3 = (json.load(open(p)) for p in ("/tmp/host.json", "/tmp/dev.json", "/tmp/dev2.json", "/tmp/dev3.json"))
print(sys.argv[1], d["device"], d["tensors"], "tensors; digests equal (overlap, verify, serial):",
      h["digests"] == d["digests"] == d2["digests"] == d3["digests"], "; %.2f GB/s" % (d["bytes"] / d["seconds"] / 1e9))
PY
}

# One rank's Shard(0) rows of `$1` read into cuda (a single rank), three times, against safetensors.
rank_slice() {
  $PY - "$1" <<'PY'
import sys, time, torch, ckpt
from safetensors.torch import load_file
p = sys.argv[1]
torch.empty(1, device="cuda")
for i in range(3):
    t = time.perf_counter()
    sd = ckpt.load(p, map_location="cuda", plan={"*": ckpt.Shard(0)})
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    n = sum(v.numel() * v.element_size() for v in sd.values())
    print("slice load: %d tensors on %s, %.2f GB in %.3f s: %.1f GB/s"
          % (len(sd), next(iter(sd.values())).device, n / 1e9, dt, n / dt / 1e9))
ref = load_file(p)
print("equal to safetensors:", all(torch.equal(sd[k].cpu(), ref[k]) for k in ref))
PY
}

step machine
nvidia-smi -L; nproc; free -g | head -2; $PY -c 'import torch, safetensors, sys; print(sys.version.split()[0], torch.__version__, safetensors.__version__)'
$CKPT --version 2>/dev/null || true

# cuFile (GPUDirect Storage) as torch's wheels ship it, for `--gds`.
if [ -z "${CKPT_CUFILE:-}" ]; then
  for d in $($PY -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    f=$(ls "$d"/nvidia/*/lib/libcufile.so.0 "$d"/nvidia/cufile/lib/libcufile.so.0 2>/dev/null | head -1)
    [ -n "$f" ] && export CKPT_CUFILE=$f && break
  done
fi
echo "CKPT_CUFILE=${CKPT_CUFILE:-}"

# GB/s of `ckpt load FILE --device cuda:0` (each a fresh process) for reader threads x staging MiB,
# the median of $REPS runs, beside the load's own seconds and the CUDA context's.
sweep() {
  local file=$1 reps=$2; shift 2
  for t in $THREADS; do for s in "$@"; do
    for r in $(seq "$reps"); do
      $CKPT load "$file" --json --device cuda:0 --threads "$t" --staging-mb "$s"
    done | $PY -c '
import json, statistics, sys
rs = [json.loads(l) for l in sys.stdin if l.startswith("{")]
if not rs: sys.exit("no result")
g = statistics.median(r["bytes"] / r["seconds"] / 1e9 for r in rs)
print("threads %2s staging %4s MiB: %5.1f GB/s (median of %d; load %.3f s, context %.3f s)" % (
    sys.argv[1], sys.argv[2], g, len(rs), statistics.median(r["seconds"] for r in rs),
    statistics.median(r["context_seconds"] for r in rs)))' "$t" "$s"
  done; done
}

if [ $DEFAULTS = 1 ]; then
step "files: 8 GiB safetensors, and the module"
( [ -f "$DATA/m8.safetensors" ] || $PY tests/gpu/make_files.py "$DATA" 8 --safetensors-only ) &
build_module
wait
step "ckpt bench m8.safetensors --device cuda:0 --repeat 3"
$CKPT bench "$DATA/m8.safetensors" --device cuda:0 --repeat 3
step "bench/device.py: m8.safetensors and a 60 GB set"
timeout 200 $PY bench/device.py --pythonpath /tmp/ckptpy --size-gb 0 --also "$DATA/m8.safetensors" \
  --set-gb 60 --repeat 2 --no-serial || echo "bench/device.py: exit $?"
step "done"
exit 0
fi

if [ $SWEEP = 1 ]; then
step "the CPU: caches and NUMA"
lscpu | grep -E "Model name|^CPU\\(s\\)|Socket|NUMA node|L2|L3" ; cat /sys/fs/cgroup/cpu.max 2>/dev/null
step "files: 8 GiB safetensors, and the module"
( [ -f "$DATA/m8.safetensors" ] || $PY tests/gpu/make_files.py "$DATA" 8 --safetensors-only ) &
FILES=$!
build_module
wait $FILES
step "CUDA's first-use costs in a fresh process (torch): pinned 256 MiB, device 8 GiB, copies"
$PY - <<'PY'
import time, torch
def t(f):
    torch.cuda.synchronize(); a = time.perf_counter(); r = f(); torch.cuda.synchronize()
    return r, (time.perf_counter() - a) * 1e3
torch.cuda.init(); torch.empty(1, device="cuda")
for i in (1, 2):
    h, ms = t(lambda: torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True))
    print("pinned 256 MiB, allocation %d: %.1f ms" % (i, ms))
    d, ms = t(lambda: torch.empty(8 << 30, dtype=torch.uint8, device="cuda"))
    print("device 8 GiB, allocation %d: %.1f ms" % (i, ms))
    def fill():
        for k in range(32):
            d[k << 28:(k + 1) << 28].copy_(h, non_blocking=True)
    _, ms = t(fill)
    print("8 GiB through one 256 MiB pinned buffer, pass %d: %.1f ms, %.1f GB/s" % (i, ms, 8.59e3 / ms))
    del h, d; torch.cuda.empty_cache()
PY
step "the CLI, 8 GiB, fresh processes: threads x staging MiB"
THREADS="8 16 24 32"; sweep "$DATA/m8.safetensors" 3 16 32 64 128 256
THREADS=16; echo "serial set-up:"; CKPT_DEVICE_OVERLAP=0 sweep "$DATA/m8.safetensors" 3 64 256
step "bench/device.py: the module on a 60 GB set (per-storage and arena)"
timeout 200 $PY bench/device.py --pythonpath /tmp/ckptpy --size-gb 0 --set-gb 60 --repeat 2 --no-serial \
  || echo "bench/device.py: exit $?"
SET=$(ls -d /dev/shm/ckpt-device-set/*/model.safetensors.index.json 2>/dev/null | head -1)
if [ -n "$SET" ]; then
step "the CLI, the 60 GB set, fresh processes: threads x staging MiB"
THREADS="16 32"; sweep "$SET" 2 32 64 256
fi
step "done"
exit 0
fi

if [ $PENDING = 1 ]; then
step "files: 1 GiB (.pt and .safetensors) and 8 GiB (.safetensors), beside the module's build"
df -h /tmp /dev/shm 2>/dev/null | sed 1d
( [ -f "$DATA/m1.safetensors" ] || $PY tests/gpu/make_files.py "$DATA" 1
  [ -f "$DATA/m8.safetensors" ] || $PY tests/gpu/make_files.py "$DATA" 8 --safetensors-only ) &
FILES=$!
build_module
wait $FILES
step "device-path correctness: the CLI's digests, the Python device tests, tests/gpu/memory.py"
for f in m1.safetensors m1.pt; do exactness $f; done
CKPT_PYTHONPATH=/tmp/ckptpy CKPT_BIN=$CKPT $PY -m pytest -q -p no:cacheprovider \
  tests/python/test_device.py tests/python/test_load_into.py tests/interop/test_cli_device.py 2>&1 | tail -15
$PY tests/gpu/memory.py "$DATA/m1.pt"
step "rank plan: one rank's Shard(0) rows of 1 GiB into cuda"
rank_slice "$DATA/m1.safetensors"
step "ckpt bench m8.safetensors --device cuda:0 (the CLI's arena; first load and warm): overlap, then serial"
$CKPT bench "$DATA/m8.safetensors" --device cuda:0 --repeat 3
CKPT_DEVICE_OVERLAP=0 $CKPT bench "$DATA/m8.safetensors" --device cuda:0 --repeat 3
step "bench/device.py: ckpt.load_file into cuda, m8.safetensors (2048 storages) and a 60 GB set"
LEFT=$((460 - SECONDS)); [ $LEFT -lt 60 ] && LEFT=60
timeout $LEFT $PY bench/device.py --pythonpath /tmp/ckptpy --size-gb 0 \
  --also "$DATA/m8.safetensors" --set-gb 60 --repeat 3 || echo "bench/device.py: exit $? (124: out of time)"
step "done"
exit 0
fi

step files
if [ $MEMORY = 1 ]; then [ -f "$DATA/m1.safetensors" ] || $PY tests/gpu/make_files.py "$DATA" 1
else [ -f "$DATA/m8.safetensors" ] || $PY tests/gpu/make_files.py "$DATA" 1 8; fi

if [ $GDS = 1 ]; then PYONLY=2; fi
if [ $PYONLY = 0 ]; then
step "exactness: ckpt load --device cuda:0 --digest equals the host load's"
for f in m1.safetensors m1.pt; do exactness $f; done
$CKPT load "$DATA/m1.safetensors" --device cuda:7; echo "cuda:7 (absent): exit $?"



step "ckpt bench --device cuda:0 (8 GiB safetensors, then torch zip)"
$CKPT bench "$DATA/m8.safetensors" --device cuda:0 --repeat 3
$CKPT bench "$DATA/m8.pt" --device cuda:0 --repeat 3
[ $QUICK = 1 ] && exit 0

step "ckpt bench --device cuda:0 (1 GiB)"
$CKPT bench "$DATA/m1.safetensors" --device cuda:0 --repeat 5

fi

if [ $PYONLY != 2 ]; then
step "Python module (built here against this Python)"
build_module

step "Python tests of device loads (module built here), and the CLI's"
CKPT_PYTHONPATH=/tmp/ckptpy CKPT_BIN=$CKPT $PY -m pytest -q -p no:cacheprovider \
  tests/python/test_device.py tests/python/test_load_into.py tests/interop/test_cli_device.py 2>&1 | tail -15

if [ $MEMORY = 1 ]; then
step "device memory: current device, CUDA errors, load_into in place (tests/gpu/memory.py)"
$PY tests/gpu/memory.py "$DATA/m1.pt"
step "device budget: --max-device-mb 16 refuses a 1 GiB load before reading (exit 7)"
$CKPT load "$DATA/m1.safetensors" --device cuda:0 --max-device-mb 16; echo "exit $?"
$CKPT load "$DATA/m1.safetensors" --device cuda --json | $PY -c 'import json,sys; d=json.load(sys.stdin); print("cuda ->", d["device"], d["tensors"], "tensors")'
step "--gds: what really happened"
$CKPT load "$DATA/m1.safetensors" --json --device cuda:0 --gds | $PY -c 'import json,sys; d=json.load(sys.stdin); print("gds:", d["gds"], "gds_bytes:", d["gds_bytes"], "of", d["bytes"])'
step "bench/load_into.py on cuda (1 GiB, in place)"
$PY bench/load_into.py --device cuda --size-mb 1024 --repeat 3 --out /tmp/ckpt-gpu-bench
step "rank plan: one rank's Shard(0) rows of 1 GiB read straight into cuda"
rank_slice "$DATA/m1.safetensors"
exit 0
fi

step "peers and ckpt's Python rows (8 GiB, warm)"
$PY tests/gpu/peers.py "$DATA/m8.pt" "$DATA/m8.safetensors"

fi
[ $PYONLY = 1 ] && exit 0
if [ $GDS = 1 ] || [ $QUICK = 0 ]; then
step "GPUDirect Storage (--gds), warm: exactness and speed"
$CKPT load "$DATA/m1.safetensors" --json --digest --device cuda:0 --gds > /tmp/gds.json
$CKPT load "$DATA/m1.safetensors" --json --digest > /tmp/host1.json
$PY - <<'PY'
import json
h, g = json.load(open("/tmp/host1.json")), json.load(open("/tmp/gds.json"))
print("m1.safetensors --gds: gds used:", g["gds"], "; digests equal:", h["digests"] == g["digests"])
PY
for i in 1 2 3; do $CKPT load "$DATA/m8.safetensors" --device cuda:0 --gds; done
for i in 1 2 3; do $CKPT load "$DATA/m8.safetensors" --device cuda:0; done
fi
step "cold page cache (8 GiB safetensors): dd, ckpt --device, safetensors"
cold() { sync; echo 3 > /proc/sys/vm/drop_caches || echo "cannot drop caches"; }
for i in 1 2; do
cold; /usr/bin/time -f "dd: %e s" dd if="$DATA/m8.safetensors" of=/dev/null bs=1M status=none
cold; /usr/bin/time -f "ckpt --device (process): %e s" $CKPT load "$DATA/m8.safetensors" --device cuda:0
cold; /usr/bin/time -f "ckpt --device --gds (process): %e s" $CKPT load "$DATA/m8.safetensors" --device cuda:0 --gds
done
cold; $PY -c "
import time, torch; from safetensors.torch import load_file
t = time.perf_counter(); d = load_file('$DATA/m8.safetensors', device='cuda:0'); torch.cuda.synchronize(); print('safetensors cold: %.2f s' % (time.perf_counter() - t))"
