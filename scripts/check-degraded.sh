#!/usr/bin/env bash
# Checks that ckpt builds and works with each optional library missing (docs/library.md
# "Dependencies"): for each of libcurl, libsodium, libisal, libdeflate, openssl, yaml-cpp, and for
# all of them at once, configures build-degraded-<name>/ with -DCKPT_PRETEND_MISSING, builds the CLI
# (ckpt_cli only), then:
#   - `ckpt --version` lists the features, with the missing one off;
#   - ls, load and convert of a torch.save file and a safetensors file (made by the peer venv's
#     torch when it exists, else by `ckpt sample`), of the torch file re-zipped with deflated
#     records (the inflate path), and of a tensorizer file; the conversions are byte-identical to
#     those of the full build, and the written .pt loads in torch (when the venv exists);
#   - the missing feature is refused with exit status 6 and a message naming its package:
#     a URL without libcurl, an encrypted tensorizer file (read and write) without libsodium,
#     `ckpt digest` without any SHA-256 provider (with libsodium alone, digests match OpenSSL's),
#     a YAML transform recipe without yaml-cpp (a JSON one works; with yaml-cpp both give the
#     full build's file).
# Usage: scripts/check-degraded.sh [FULL_BUILD_DIR] (default build/: an all-features build whose
# ckpt makes the reference outputs; it is brought up to date first). CKPT_DEGRADED="libcurl all"
# picks the variants; CKPT_DEGRADED_CMAKE_FLAGS adds configure flags.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
full=$(cd "${1:-$root/build}" && pwd)
jobs=$(nproc 2>/dev/null || echo 2)
variants=${CKPT_DEGRADED:-libcurl libsodium libisal libdeflate openssl yaml-cpp all}
all="libcurl;libsodium;libisal;libdeflate;openssl;yaml-cpp"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
launcher=()
if [ -z "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ] && command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
vpy=$("$root/scripts/install-peers.sh" --path 2>/dev/null)/bin/python || true
[ -x "$vpy" ] || vpy=

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-degraded.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
step() { echo "check-degraded: $*"; }
fail() { echo "check-degraded: FAILED: $*" >&2; exit 1; }

# expect_refusal NAME PACKAGE CMD...: CMD exits 6 and its stderr names PACKAGE.
expect_refusal() {
  local name=$1 pkg=$2
  shift 2
  local rc=0
  "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
  [ "$rc" = 6 ] || fail "$name: '$*' exited $rc, not 6: $(head -c 400 "$tmp/err")"
  grep -q -- "$pkg" "$tmp/err" || fail "$name: '$*' does not name $pkg: $(head -c 400 "$tmp/err")"
}

# --- inputs and reference outputs from the full build ---------------------------------------
step "building the full build $full"
cmake --build "$full" -j "$jobs" --target ckpt_cli >/dev/null
ref=$full/ckpt
in=$tmp/in
mkdir -p "$in"
if [ -n "$vpy" ]; then
  step "inputs from the peer venv's torch and safetensors"
  "$vpy" - "$in" <<'EOF'
import sys, torch, safetensors.torch as st
d = sys.argv[1]
g = torch.Generator().manual_seed(7)
sd = {"emb.weight": torch.randn(64, 32, generator=g), "fc.bias": torch.arange(32, dtype=torch.int64),
      "fc.weight": torch.randn(32, 32, generator=g).to(torch.bfloat16), "scale": torch.tensor(0.5)}
torch.save(sd, f"{d}/model.pt")
st.save_file({k: v.contiguous() for k, v in sd.items()}, f"{d}/model.safetensors")
EOF
else
  step "inputs from ckpt sample (no peer venv)"
  "$ref" sample "$in/model.pt" --size-mb 1 >/dev/null
  "$ref" sample "$in/model.safetensors" --size-mb 1 >/dev/null
fi
# The torch zip re-written with deflated records: torch reads these, and so must ckpt (inflate).
/usr/bin/env python3 - "$in/model.pt" "$in/deflated.pt" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as a, zipfile.ZipFile(sys.argv[2], "w", zipfile.ZIP_DEFLATED) as b:
    for i in a.infolist():
        b.writestr(i.filename, a.read(i.filename))
EOF
"$ref" convert "$in/model.safetensors" "$in/model.tensors" >/dev/null
printf '%064d\n' 7 >"$in/key.hex"
chmod 600 "$in/key.hex"
"$ref" convert "$in/model.safetensors" "$in/enc.tensors" --encrypt-key "$in/key.hex" >/dev/null
mkdir -p "$tmp/ref"
for f in model.pt deflated.pt model.safetensors model.tensors; do
  "$ref" convert "$in/$f" "$tmp/ref/$f.safetensors" >/dev/null
done
"$ref" convert "$in/model.safetensors" "$tmp/ref/back.pt" >/dev/null
"$ref" digest "$in/model.safetensors" >"$tmp/ref/digest.txt"
printf '{"strip_prefix": "fc.", "drop": ["scale"], "cast": "fp16"}\n' >"$in/recipe.json"
printf '# the same rules\nstrip_prefix: fc.\ndrop: [scale]\ncast: fp16\n' >"$in/recipe.yaml"
"$ref" convert "$in/model.safetensors" "$tmp/ref/recipe.safetensors" --recipe "$in/recipe.json" \
  >/dev/null 2>&1

# --- one degraded build ------------------------------------------------------------------------
check_variant() {
  local name=$1 missing=$1
  [ "$name" = all ] && missing=$all
  local b=$root/build-degraded-$name
  step "$name: configuring and building $b"
  cmake -S "$root" -B "$b" "${gen[@]}" "${launcher[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCKPT_BUILD_TESTS=OFF -DCKPT_BUILD_PYTHON=OFF -DCKPT_PRETEND_MISSING="$missing" \
    ${CKPT_DEGRADED_CMAKE_FLAGS:-} >"$tmp/configure.log" || { cat "$tmp/configure.log"; fail "$name: configure"; }
  local m
  for m in ${missing//;/ }; do
    grep -q "($m): OFF\|($m not found\|ON through libsodium (openssl not found" "$tmp/configure.log" ||
      fail "$name: the configure summary does not show $m off"
  done
  cmake --build "$b" -j "$jobs" --target ckpt_cli >"$tmp/build.log" 2>&1 ||
    { tail -n 40 "$tmp/build.log"; fail "$name: build"; }
  local ck=$b/ckpt out=$tmp/$name
  mkdir -p "$out"
  "$ck" --version | grep -q '^features: ' || fail "$name: --version lists no features"
  step "$name: $("$ck" --version | tail -n 1)"

  # What every build does.
  local f
  for f in model.pt deflated.pt model.safetensors model.tensors; do
    "$ck" ls "$in/$f" >/dev/null || fail "$name: ls $f"
    "$ck" load "$in/$f" >/dev/null || fail "$name: load $f"
    "$ck" convert "$in/$f" "$out/$f.safetensors" >/dev/null || fail "$name: convert $f"
    cmp -s "$out/$f.safetensors" "$tmp/ref/$f.safetensors" ||
      fail "$name: convert $f differs from the full build's"
  done
  "$ck" convert "$in/model.safetensors" "$out/back.pt" >/dev/null || fail "$name: convert to .pt"
  cmp -s "$out/back.pt" "$tmp/ref/back.pt" || fail "$name: the written .pt differs from the full build's"
  "$ck" load --verify "$out/back.pt" >/dev/null || fail "$name: load --verify of the written .pt"
  if [ -n "$vpy" ]; then
    "$vpy" -c "import sys, torch; sd = torch.load(sys.argv[1], weights_only=True); assert len(sd) == 4" \
      "$out/back.pt" || fail "$name: torch cannot load the written .pt"
  fi

  # The missing features.
  case ";$missing;" in *";libcurl;"*)
    expect_refusal "$name" libcurl4-openssl-dev "$ck" ls http://127.0.0.1:1/x.pt
    expect_refusal "$name" libcurl4-openssl-dev "$ck" convert "$in/model.safetensors" s3://bucket/x.safetensors
    ;;
  esac
  case ";$missing;" in *";libsodium;"*)
    expect_refusal "$name" libsodium-dev "$ck" convert "$in/enc.tensors" "$out/dec.safetensors" \
      --decrypt-key "$in/key.hex"
    expect_refusal "$name" libsodium-dev "$ck" convert "$in/model.safetensors" "$out/enc.tensors" \
      --encrypt-key "$in/key.hex"
    [ ! -e "$out/enc.tensors" ] || fail "$name: a refused encrypted write left $out/enc.tensors"
    ;;
  *)
    "$ck" convert "$in/enc.tensors" "$out/dec.safetensors" --decrypt-key "$in/key.hex" >/dev/null ||
      fail "$name: decrypting convert"
    cmp -s "$out/dec.safetensors" "$tmp/ref/model.tensors.safetensors" ||
      fail "$name: the decrypted conversion differs from the full build's"
    ;;
  esac
  case ";$missing;" in
  *";openssl;"*";libsodium;"* | *";libsodium;"*";openssl;"*)
    expect_refusal "$name" libssl-dev "$ck" digest "$in/model.safetensors"
    ;;
  *)
    "$ck" digest "$in/model.safetensors" >"$out/digest.txt" || fail "$name: digest"
    cmp -s "$out/digest.txt" "$tmp/ref/digest.txt" || fail "$name: digest differs from OpenSSL's"
    ;;
  esac
  "$ck" convert "$in/model.safetensors" "$out/recipe.safetensors" --recipe "$in/recipe.json" \
    >/dev/null 2>&1 || fail "$name: convert --recipe recipe.json"
  cmp -s "$out/recipe.safetensors" "$tmp/ref/recipe.safetensors" ||
    fail "$name: the JSON recipe's conversion differs from the full build's"
  case ";$missing;" in *";yaml-cpp;"*)
    expect_refusal "$name" libyaml-cpp-dev "$ck" convert "$in/model.safetensors" \
      "$out/yaml.safetensors" --recipe "$in/recipe.yaml"
    [ ! -e "$out/yaml.safetensors" ] || fail "$name: a refused YAML recipe left an output"
    ;;
  *)
    "$ck" convert "$in/model.safetensors" "$out/yaml.safetensors" --recipe "$in/recipe.yaml" \
      >/dev/null 2>&1 || fail "$name: convert --recipe recipe.yaml"
    cmp -s "$out/yaml.safetensors" "$tmp/ref/recipe.safetensors" ||
      fail "$name: the YAML recipe's conversion differs from the JSON one's"
    ;;
  esac
  step "$name: OK"
}

for v in $variants; do
  check_variant "$v"
done
step "all OK ($variants)"
