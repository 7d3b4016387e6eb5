#!/usr/bin/env bash
# Proves the wheels of scripts/build-wheels.sh (`make wheels-check`) where ckpt's libraries are
# not: each wheel is installed with pip --no-index into a fresh venv and used by
# scripts/wheel_smoke.py (ckpt.load of a file torch.save'd outside, ckpt.save to safetensors,
# `ckpt verify`, `ckpt ls https://...` and ckpt.load of that URL through the bundled libcurl and
# TLS stack, from an nginx started here with a self-signed certificate).
#   cp311: in a minimal Debian 12 root (scripts/debian-root.sh: debootstrap minbase with python3,
#          python3-venv and python3-numpy; no libcurl, libdeflate, ISA-L, libsodium or compiler),
#          chrooted into inside a mount namespace of its own (the wheel folder and the work folder
#          bound read-only, /proc, /dev, a tmpfs on /tmp: the root stays as it was), with Debian's
#          python3 3.11 and numpy 1.24; then on the host with Debian's /usr/bin/python3 and torch
#          2.15 (the torch-only venv of scripts/check-wheel.sh, ~/.cache/ckpt/torch-only-<hash>);
#   cp39, cp310, cp312, cp313: on the host, a venv of that interpreter (scripts/build-wheels.sh
#          finds them) that sees torch from PyPI: 2.15 (the peer tier's pin) for 3.12 and 3.13,
#          2.14.1 for 3.10 (torch 2.15 needs 3.11), 2.8.0 for 3.9 (the last with a cp39 wheel);
#          a cached venv per version with that torch's own wheel and its small requirements
#          (~/.cache/ckpt/torch-cpXY-<hash>, see torch_venv below): for 3.10, 3.12 and 3.13 the
#          CUDA 13 libraries hard-linked from the torch-only venv (~1.3 GB each, not 5); torch
#          2.8.0 is built for CUDA 12, which those cannot stand in for: its venv has its own
#          nvidia-*-cu12 wheels, less what only a GPU kernel loads (4.5 GiB; 5.9 with it).
# torch, where the venv has it, is imported before ckpt (scripts/wheel_smoke.py).
# Usage: scripts/check-wheels.sh [WHEEL | X.Y ...]   (default: every wheelhouse/ckpt_io-*.whl)
# Needs root (sudo) for the chroot. CKPT_WHEEL_CHROOT=0 skips the chroot.
set -euo pipefail
shopt -s inherit_errexit  # a failure inside $(torch_venv ...) stops it: no venv marked complete

root=$(cd "$(dirname "$0")/.." && pwd)
step() { echo "check-wheels: $*"; }
fail() { echo "check-wheels: FAILED: $*" >&2; exit 1; }
cache=${CKPT_PEERS_ROOT:-$HOME/.cache/ckpt}
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
source "$root/scripts/find-python.sh"
wheels=()
for a in "$@"; do  # X.Y: that version's wheel in wheelhouse/ (none needed without that Python)
  if [[ $a =~ ^3\.[0-9]+$ ]]; then
    [ -n "$(find_python "$a")" ] || { step "no CPython $a here: skipped"; continue; }
    wheels+=("$root"/wheelhouse/ckpt_io-*-cp${a/./}-*.whl)
  else
    wheels+=("$a")
  fi
done
[ $# -gt 0 ] || wheels=("$root"/wheelhouse/ckpt_io-*.whl)
for w in "${wheels[@]}"; do [ -f "$w" ] || fail "no wheel $w (make wheels first)"; done
export PIP_DISABLE_PIP_VERSION_CHECK=1

peers=$("$root/scripts/install-peers.sh")
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-wheels-check.XXXXXX")
nginx_pid=""
cleanup() {
  [ -n "$nginx_pid" ] && kill "$nginx_pid" 2>/dev/null && wait "$nginx_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
work=$tmp/work
mkdir -p "$work" "$tmp/www" "$tmp/nginx"
chmod 755 "$tmp"

# --- the file, made outside by torch 2.x, and an https server for it -------------------------
"$peers/bin/python" - "$work" <<'EOF'
import json, os, sys
import torch
work = sys.argv[1]
g = torch.Generator().manual_seed(0)
sd = {"w": torch.randn(16, 8, generator=g), "b": torch.arange(8, dtype=torch.int64),
      "h": torch.randn(3, 5, generator=g).half(), "mask": torch.tensor([True, False, True]),
      "u8": torch.arange(200, 256, dtype=torch.uint8), "step": 7, "name": "ckpt"}
torch.save(sd, os.path.join(work, "file.pt"))
expected = {k: {"dtype": str(v.numpy().dtype), "shape": list(v.shape),
                "values": v.numpy().ravel().tolist()} if isinstance(v, torch.Tensor) else v
            for k, v in sd.items()}
json.dump(expected, open(os.path.join(work, "expected.json"), "w"))
EOF
cp "$root/scripts/wheel_smoke.py" "$work/"
cp "$work/file.pt" "$tmp/www/"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=127.0.0.1 \
  -addext subjectAltName=IP:127.0.0.1 -keyout "$tmp/nginx/key.pem" -out "$work/cert.pem" \
  >/dev/null 2>&1
chmod -R a+rX "$work"
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
user=""
[ "$(id -u)" = 0 ] && user="user root;"
cat > "$tmp/nginx/nginx.conf" <<EOF
$user daemon off; worker_processes 1; pid $tmp/nginx/nginx.pid; error_log $tmp/nginx/error.log;
events { worker_connections 64; }
http { access_log off; client_body_temp_path $tmp/nginx; proxy_temp_path $tmp/nginx;
  fastcgi_temp_path $tmp/nginx; uwsgi_temp_path $tmp/nginx; scgi_temp_path $tmp/nginx;
  server { listen 127.0.0.1:$port ssl; root $tmp/www;
           ssl_certificate $work/cert.pem; ssl_certificate_key $tmp/nginx/key.pem; } }
EOF
/usr/sbin/nginx -c "$tmp/nginx/nginx.conf" -p "$tmp/nginx" -e "$tmp/nginx/error.log" &
nginx_pid=$!
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.1
done
url=https://127.0.0.1:$port/file.pt
step "file.pt made by torch $("$peers/bin/python" -c 'import torch; print(torch.__version__)'), served at $url"

# --- cp311 in a Debian 12 root that has none of ckpt's libraries -----------------------------
chroot_check() {  # $1: the wheel
  local whl=$1 droot
  droot=$("$root/scripts/debian-root.sh")
  # (python3 itself needs libssl3: the checks below see that ckpt maps its own copy)
  for lib in libcurl libdeflate libisal libsodium; do
    ! ls "$droot"/usr/lib/x86_64-linux-gnu/"$lib"* >/dev/null 2>&1 ||
      fail "the Debian root has $lib: it would not prove the wheel self-contained"
  done
  step "$(basename "$whl"): in a chroot ($droot: Debian 12 minbase, python3, python3-numpy)"
  # A mount namespace of its own: the mounts end with it, the cached root is not changed.
  $SUDO unshare --mount --propagation private /bin/bash -s "$droot" "$(dirname "$whl")" \
    "$work" "$(basename "$whl")" "$url" <<'EOF'
set -euo pipefail
droot=$1 wheels=$2 work=$3 whl=$4 url=$5
mount -t tmpfs tmpfs "$droot/tmp"
mkdir -p "$droot/tmp/wheels" "$droot/tmp/work"
for pair in "$wheels:$droot/tmp/wheels" "$work:$droot/tmp/work"; do
  mount --bind "${pair%%:*}" "${pair#*:}"
  mount -o remount,bind,ro "${pair#*:}"
done
mount -t proc proc "$droot/proc"
mount --bind /dev "$droot/dev"
chroot "$droot" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/tmp LANG=C.UTF-8 /bin/bash -euc '
  python3 -m venv --system-site-packages /tmp/venv
  /tmp/venv/bin/python -m pip install -q --no-index "/tmp/wheels/$1"
  mkdir /tmp/out && cd /tmp/out
  /tmp/venv/bin/python /tmp/work/wheel_smoke.py /tmp/work "$2" /tmp/out numpy' - "$whl" "$url"
EOF
}

# --- on the host: a fresh venv of the wheel's interpreter that sees one extra site folder ------
host_check() {  # $1: the wheel, $2: the interpreter, $3: a site-packages folder to see, $4: what,
  local whl=$1 py=$2 extra=$3 venv=$tmp/venv site start=$SECONDS  # $5: torch or numpy tensors
  rm -rf "$venv" "$tmp/out"
  step "$(basename "$whl"): on the host, $py with $4"
  "$py" -m venv "$venv"
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  echo "import site; site.addsitedir('$extra')" > "$site/extra.pth"
  "$venv/bin/python" -m pip install -q --no-index --no-deps "$whl"
  mkdir "$tmp/out"
  (cd "$tmp/out" && env -u PYTHONPATH -u CKPT_PYTHONPATH "$venv/bin/python" \
    "$work/wheel_smoke.py" "$work" "$url" "$tmp/out" "$5")
  step "$(basename "$whl"): OK in $((SECONDS - start)) s"
}

numpy_pin() {  # the newest numpy for a CPython X.Y
  case $1 in 3.9) echo 2.0.2 ;; 3.10) echo 2.2.6 ;; *) echo 2.4.6 ;; esac
}
torch_pin() {  # the torch 2.x from PyPI for a CPython X.Y
  case $1 in
    3.9) echo 2.8.0 ;;    # the last torch for 3.9; built for CUDA 12 (its own CUDA libraries)
    3.10) echo 2.14.1 ;;  # the last torch for 3.10 (2.15 needs 3.11); CUDA 13 as 2.15
    *) sed -n 's/^torch==//p' "$root/tests/peers/requirements.txt" ;;
  esac
}
torch_only_site() {  # the site-packages of the cp311 torch-only venv (torch and numpy pinned)
  local venv
  grep -E '^(torch|numpy)==' "$root/tests/peers/requirements.txt" > "$tmp/torch-only.txt"
  venv=$("$root/scripts/install-peers.sh" "$tmp/torch-only.txt" torch-only)
  "$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))'
}
# $1: X.Y, $2: its interpreter; prints the site-packages of a cached venv (once per machine,
# ~/.cache/ckpt/torch-cpXY-<hash>) holding that version's own torch wheel (--no-deps) and
# numpy, torch's small requirements, and the NVIDIA CUDA libraries (py3-none wheels, the same
# for every CPython) of the cp311 torch-only venv as hard links (no space), plus any of them that
# that torch needs and the tier lacks. triton (1 GB per CPython, only for torch.compile) is left
# out. What to install comes from pip's resolver (--dry-run --report), then each wheel alone with
# --no-deps (never more than one downloaded wheel on the disk).
# A torch built for another CUDA (2.8.0: CUDA 12) gets its own nvidia-*-cu12 wheels, less what
# only a GPU kernel would load (the checks run none): every library that `import torch` maps is
# there (libtorch_cuda.so's NEEDED), but not cuSOLVER and NVTX (dlopened by CUDA linear algebra
# and the profiler) nor cuDNN's engines (libcudnn_*.so.9, 1 GB, dlopened by libcudnn.so.9).
torch_venv() {
  local pin npin ref venv site
  pin=$(torch_pin "$1")
  npin=$(numpy_pin "$1")
  ref=$(torch_only_site)
  venv=$cache/torch-cp${1/./}-$(echo "torch==$pin numpy==$npin $ref" | sha256sum | cut -c1-16)
  if [ ! -f "$venv/.complete" ]; then
    rm -rf "$venv" "$venv.tmp"
    step "creating $venv: torch $pin, numpy $npin (once per machine)" >&2
    "$2" -m venv "$venv.tmp" >&2
    site=$("$venv.tmp/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    "$venv.tmp/bin/python" -m pip install -q --no-cache-dir --dry-run --ignore-installed \
      --report "$tmp/report.json" "torch==$pin" "numpy==$npin" >&2
    "$venv.tmp/bin/python" - "$tmp/report.json" "$ref" > "$tmp/wanted.txt" <<'PY'
# "# link" first when the tier's CUDA libraries serve this torch (it wants some of the same
# nvidia-* distributions), then what to install.
import json, os, re, sys
report, ref = sys.argv[1:3]
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
have = {norm(d.split("-")[0]) for d in os.listdir(ref) if d.endswith(".dist-info")}
want = [(item["metadata"]["name"], item["metadata"]["version"])
        for item in json.load(open(report))["install"]]
cuda = {norm(n) for n, _ in want if norm(n).startswith(("nvidia-", "cuda-toolkit"))}
link = bool(cuda & have)
if link:
    print("# link")
gpu_only = ("nvidia-cusolver", "nvidia-nvtx")
for name, version in want:
    if norm(name) == "triton" or (link and norm(name) in cuda & (have | {"cuda-toolkit"})):
        continue
    if not link and norm(name).startswith(gpu_only):
        continue
    print(f"{name}=={version}")
PY
    link=0
    grep -qx '# link' "$tmp/wanted.txt" && link=1
    # hard links: pip unlinks before it writes a file
    [ $link = 0 ] || cp -al "$ref/nvidia" "$site/nvidia"
    grep -v '^#' "$tmp/wanted.txt" | while read -r req; do
      "$venv.tmp/bin/python" -m pip install -q --no-cache-dir --no-deps "$req" >&2 </dev/null
    done
    [ $link = 1 ] || rm -f "$site"/nvidia/cudnn/lib/libcudnn_*.so.*  # cuDNN's engines
    "$venv.tmp/bin/python" - "$site/torch" "$ref/torch" >&2 <<'PY'
# torch's files that are the same as the torch-only venv's (libtorch_cuda.so, 0.5 GB, is for
# one torch version): hard links to those.
import filecmp, os, sys
new, ref = sys.argv[1:3]
saved = 0
for d, _, files in os.walk(new):
    for f in files:
        p = os.path.join(d, f)
        q = os.path.join(ref, os.path.relpath(p, new))
        if (not os.path.islink(p) and os.path.isfile(q) and os.path.getsize(p) > 1 << 16
                and os.path.getsize(p) == os.path.getsize(q) and filecmp.cmp(p, q, shallow=False)):
            os.link(q, p + ".link")
            os.replace(p + ".link", p)
            saved += os.path.getsize(p)
print(f"check-wheels: {saved / 2**20:.0f} MiB of torch/ hard-linked to the torch-only venv's")
PY
    mv "$venv.tmp" "$venv"  # only site-packages is used (by path), so the rename is harmless
    touch "$venv/.complete"
  fi
  "$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))'
}
for whl in "${wheels[@]}"; do
  tag=$(basename "$whl" | sed 's/.*-\(cp3[0-9]*\)-cp3.*/\1/')
  v=3.${tag#cp3}
  if [ "$tag" = cp311 ]; then
    [ "${CKPT_WHEEL_CHROOT:-1}" = 0 ] || chroot_check "$whl"
    site=$(torch_only_site)
    host_check "$whl" /usr/bin/python3 "$site" "torch $(torch_pin 3.11) (${site%/lib/*})" torch
  else
    py=$(find_python "$v")
    [ -n "$py" ] || fail "no CPython $v here for $(basename "$whl")"
    site=$(torch_venv "$v" "$py")
    host_check "$whl" "$py" "$site" "torch $(torch_pin "$v") (${site%/lib/*})" torch
  fi
done
step "OK: ${#wheels[@]} wheels"
