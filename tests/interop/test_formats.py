"""safetensors and tensorizer through the ckpt CLI (issue 4).

- The real tensorizer 2.11.1 fixtures (docs/formats/tensorizer.md "tensorizer", **Fixtures**;
  skipped when absent) read bit-exact against their
  manifest.json: `ckpt ls --json` metadata and the SHA-256 of every `ckpt extract` payload.
- Corrupted copies: a flipped data byte (exit 5), a truncated file (exit 4), a wrong key or
  password and tampered ciphertext (exit 9), each one line on stderr.
- Round trips over the torch corpus: pt -> safetensors -> tensorizer -> pt, with `ckpt verify`
  on the tensorizer file ckpt wrote and torch.load comparing the last file with the original
  (names, dtypes, shapes, bytes); what a target cannot hold fails with a clear message.
- Encryption round trips (random key file, password file), `--align 4096`, tied and shared
  tensors (`--copy-shared`), non-tensor values reported on stderr, no progress output when
  stderr is not a terminal (and a progress line when it is).
- Files ckpt writes against the real `safetensors` package, when it is installed (Debian has
  no python3-safetensors today, so that test skips).
"""

import hashlib
import json
import os
import pty
import re
import shutil
import struct
import subprocess

import pytest

import corpus
import helpers
from conftest import LEGACY_IDS, ZIP_IDS, one_error_line

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fixture_dir():
    for d in (os.path.join(REPO, "..", "shared", "fixtures", "tensorizer"),
              os.path.join(REPO, "shared", "fixtures", "tensorizer"),
              "/work/shared/fixtures/tensorizer"):
        if os.path.isfile(os.path.join(d, "manifest.json")):
            return os.path.abspath(d)
    return None


FIXTURES = _fixture_dir()
MANIFEST = json.load(open(os.path.join(FIXTURES, "manifest.json")))["files"] if FIXTURES else {}
needs_fixtures = pytest.mark.skipif(FIXTURES is None, reason="tensorizer 2.11.1 fixtures not found "
                                    "(docs/formats/tensorizer.md, tensorizer, Fixtures)")

# ---------------------------------------------------------------------------
# helpers


def fixture(name):
    return os.path.join(FIXTURES, name)


_PRIVATE_SECRETS = {}


def _private_copy(path):
    """A 0600 copy of a shared fixture's key or password file, as a user keeps secrets (the CLI
    warns about secret files that others can read)."""
    if path not in _PRIVATE_SECRETS:
        import atexit
        import tempfile
        d = tempfile.mkdtemp(prefix="ckpt-secrets-")
        atexit.register(shutil.rmtree, d, True)
        dst = os.path.join(d, os.path.basename(path))
        shutil.copyfile(path, dst)
        os.chmod(dst, 0o600)
        _PRIVATE_SECRETS[path] = dst
    return _PRIVATE_SECRETS[path]


def key_args(name):
    """--decrypt-* options a fixture needs."""
    stem = name[:-len(".tensors")]
    if os.path.exists(fixture(stem + ".key")):
        return ["--decrypt-key", _private_copy(fixture(stem + ".key"))]
    if os.path.exists(fixture(stem + ".password")):
        return ["--decrypt-password-file", _private_copy(fixture(stem + ".password"))]
    return []


def extract(ckpt, path, out, *args):
    """{name: (index entry, payload bytes)} from `ckpt extract`."""
    ckpt.ok("extract", path, out, *args)
    with open(os.path.join(out, "index.json")) as f:
        index = json.load(f)
    result = {}
    for e in index["tensors"]:
        _, header, payload = helpers.read_npy(os.path.join(out, e["file"]))
        assert tuple(header["shape"]) == tuple(e["shape"]), e["name"]
        result[e["name"]] = (e, payload)
    return result


def all_tensor_paths(obj):
    """[(path, tensor)] for every place a tensor appears (tied weights under each of their
    names), in the `ls` naming rule."""
    return helpers.flatten(obj, every_path=True)


def non_tensor_paths(obj):
    """What a flat format drops: non-tensor leaves, empty containers, dict attributes."""
    out = []

    def walk(x, path):
        if helpers.is_tensor(x):
            return
        if isinstance(x, dict):
            attrs = getattr(x, "__dict__", {})
            if not x and not attrs:
                if path:
                    out.append(".".join(path))
                return
            for k, v in x.items():
                walk(v, path + [str(k)])
            # Module.state_dict()'s `_metadata` (module versions) alone is not reported
            # (docs/cli.md, convert: Notes).
            if attrs and set(attrs) != {"_metadata"}:
                out.append(".".join(path + [f"<attributes of {type(x).__name__}>"]))
        elif isinstance(x, (list, tuple)):
            if not x and path:
                out.append(".".join(path))
            for i, v in enumerate(x):
                walk(v, path + [str(i)])
        else:
            out.append(".".join(path) or "<root>")

    walk(obj, [])
    return out


def is_quantized_case(file_id):
    return corpus.file_case(file_id).name.startswith("quant_")


def safetensors_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return n, json.loads(f.read(n))


ST_ELEMENT_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
                   "U8": 1, "BOOL": 1, "C64": 8}

# ---------------------------------------------------------------------------
# real tensorizer output against manifest.json


@needs_fixtures
@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_fixture_bit_exact(ckpt, name, tmp_path):
    want = MANIFEST[name]["tensors"]
    ls = ckpt.json("ls", fixture(name), "--json", *key_args(name))
    assert ls["format"] == "tensorizer"
    got = {t["name"]: t for t in ls["tensors"]}
    assert sorted(got) == sorted(want)
    for tname, w in want.items():
        t = got[tname]
        assert t["dtype"] == w["dtype"] and t["shape"] == w["shape"], tname
        assert bool(t.get("meta")) == bool(w.get("meta")), tname
        if not w.get("meta"):
            assert t["nbytes"] == w["nbytes"], tname

    # Meta tensors have no bytes: extract refuses them unless --meta says what to write.
    meta = ["--meta=zeros"] if any(w.get("meta") for w in want.values()) else []
    if meta:
        r = ckpt.run("extract", fixture(name), tmp_path / "refused", *key_args(name))
        assert r.returncode == 6 and "meta tensor" in r.stderr, r.stderr
    extracted = extract(ckpt, fixture(name), tmp_path / "x", *key_args(name), *meta)
    assert sorted(extracted) == sorted(want)
    for tname, w in want.items():
        entry, payload = extracted[tname]
        assert entry["dtype"] == w["dtype"] and entry["shape"] == w["shape"], tname
        if entry["dtype"] in ("bfloat16", "complex32"):
            assert entry["raw_bits"], tname
        if w.get("meta"):
            # Meta tensors have no bytes in the file: --meta=zeros writes zeros of their size.
            numel = 1
            for d in w["shape"]:
                numel *= d
            assert payload == bytes(numel * helpers.ELEMENT_SIZE[w["dtype"]]), tname
        else:
            assert len(payload) == w["nbytes"], tname
            assert hashlib.sha256(payload).hexdigest() == w["sha256"], f"{name}: {tname}: bytes differ"

    r = ckpt.ok("verify", fixture(name), *key_args(name))
    assert r.stdout.startswith("OK"), r.stdout


def _copy(src, dst):
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o644)
    return dst


def _flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


@needs_fixtures
def test_fixture_flipped_data_byte(ckpt, tmp_path):
    name = "v1_numpy_dtypes.tensors"
    big = next(t for t in ckpt.json("ls", fixture(name), "--json")["tensors"] if t["name"] == "big")
    bad = _copy(fixture(name), tmp_path / name)
    _flip(bad, big["offset"] + 12345)
    r = ckpt.run("verify", bad)
    line = one_error_line(r)
    assert r.returncode == 5 and "big" in line, line


@needs_fixtures
def test_fixture_truncated(ckpt, tmp_path):
    name = "v1_numpy_dtypes.tensors"
    with open(fixture(name), "rb") as f:
        data = f.read()
    # The u64 zero at the very end is not needed to read (tensorizer and ckpt go by the index),
    # so the last cut takes the last tensor's final byte too.
    for cut in (50, 400000, len(data) - 9):
        bad = tmp_path / f"cut{cut}.tensors"
        bad.write_bytes(data[:cut])
        for cmd in (["verify", bad], ["extract", bad, tmp_path / f"x{cut}"]):
            r = ckpt.run(*cmd)
            line = one_error_line(r)
            assert r.returncode == 4, f"cut at {cut}: {cmd[0]}: {line}"


@needs_fixtures
def test_fixture_wrong_key_and_password(ckpt, tmp_path):
    wrong_key = tmp_path / "wrong.key"
    wrong_key.write_text("00" * 32 + "\n")
    wrong_pw = tmp_path / "wrong.password"
    wrong_pw.write_text("not the password\n")
    for secret in (wrong_key, wrong_pw):
        secret.chmod(0o600)  # else the CLI warns, on a second stderr line, that others can read it
    cases = [
        ("v3_encrypted_random_key.tensors", ["--decrypt-key", wrong_key]),
        ("v3_encrypted_password.tensors", ["--decrypt-password-file", wrong_pw]),
        ("v3_encrypted_random_key.tensors", []),  # no key at all
    ]
    for name, args in cases:
        for cmd in ("verify", "extract"):
            extra = [tmp_path / f"x-{cmd}-{len(args)}"] if cmd == "extract" else []
            r = ckpt.run(cmd, fixture(name), *extra, *args)
            line = one_error_line(r)
            assert r.returncode == 9, f"{name} {args}: {cmd}: {line}"


@needs_fixtures
def test_fixture_tampered_ciphertext(ckpt, tmp_path):
    name = "v3_encrypted_random_key.tensors"
    ls = ckpt.json("ls", fixture(name), "--json", *key_args(name))
    # Encrypted tensors are not stored raw (no offset); the file ends with the last tensor's
    # ciphertext and a u64 zero.
    assert all(t["offset"] is None for t in ls["tensors"])
    last = ls["tensors"][-1]["name"]
    bad = _copy(fixture(name), tmp_path / name)
    _flip(bad, os.path.getsize(bad) - 8 - 5)
    r = ckpt.run("verify", bad, *key_args(name))
    line = one_error_line(r)
    assert r.returncode == 9 and last in line, line


@needs_fixtures
@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_fixture_to_safetensors_and_back(ckpt, name, tmp_path):
    """Fixture -> safetensors -> pt keeps every tensor's bytes (complex128/complex32 have no
    safetensors code: those files must fail naming the tensor)."""
    want = MANIFEST[name]["tensors"]
    out = tmp_path / "f.safetensors"
    # safetensors has no meta tensors: --meta=zeros writes them as zeros (without it: refused,
    # test_real_meta.py).
    meta = ["--meta=zeros"] if any(w.get("meta") for w in want.values()) else []
    r = ckpt.run("convert", fixture(name), out, *key_args(name), *meta)
    unsupported = [n for n, w in want.items() if w["dtype"] in ("complex128", "complex32")]
    if unsupported:
        line = one_error_line(r)
        assert r.returncode == 6 and "safetensors" in line, line
        assert any(n in line for n in unsupported), line
        assert not out.exists()
        return
    assert r.returncode == 0, r.stderr
    pt = tmp_path / "f.pt"
    ckpt.ok("convert", out, pt)
    import torch
    loaded = helpers.torch_load(pt)
    assert sorted(loaded) == sorted(want)
    for tname, w in want.items():
        t = loaded[tname]
        assert helpers.dtype_name(t) == w["dtype"] and list(t.shape) == w["shape"], tname
        if not w.get("meta"):
            assert hashlib.sha256(helpers.tensor_bytes(t)).hexdigest() == w["sha256"], tname


# ---------------------------------------------------------------------------
# round trips over the torch corpus

UNSUPPORTED = {"dtype_complex128": "safetensors", "single_tensor": None}
CHAIN_IDS = [f for f in ZIP_IDS + LEGACY_IDS
             if not is_quantized_case(f) and corpus.file_case(f).name not in UNSUPPORTED]


def _check_same_tensors(original, loaded, where):
    """loaded (a flat name -> tensor dict) holds every tensor of original under every path it
    had, with the same dtype, shape and bytes."""
    want = all_tensor_paths(original)
    names = [p for p, _ in want]
    assert sorted(loaded) == sorted(names), f"{where}: names differ"
    for path, t in want:
        got = loaded[path]
        assert got.dtype == t.dtype, f"{where}: {path}: dtype {got.dtype} != {t.dtype}"
        assert got.shape == t.shape, f"{where}: {path}: shape {tuple(got.shape)} != {tuple(t.shape)}"
        assert helpers.tensor_bytes(got) == helpers.tensor_bytes(t), f"{where}: {path}: bytes differ"


@pytest.mark.parametrize("file_id", CHAIN_IDS)
def test_chain_pt_safetensors_tensorizer_pt(ckpt, cache, file_id, tmp_path):
    import torch
    original = cache.load(cache.path(file_id))
    st, tz, pt = tmp_path / "a.safetensors", tmp_path / "b.tensors", tmp_path / "c.pt"

    r = ckpt.ok("convert", cache.path(file_id), st, "--copy-shared")
    dropped = non_tensor_paths(original)
    if dropped:
        # Reported, never silently dropped: the count and (up to 20) the paths.
        m = re.search(r"safetensors cannot hold non-tensor values; not written \((\d+)\)", r.stderr)
        assert m, f"non-tensor values not reported: {r.stderr!r}"
        assert int(m.group(1)) == len(dropped), r.stderr
        listed = [l.strip() for l in r.stderr.splitlines()[1:]]
        for p in dropped[:20]:
            assert p in listed, f"{p!r} not reported: {r.stderr!r}"
    else:
        assert "non-tensor" not in r.stderr, r.stderr

    n, header = safetensors_header(st)
    names = sorted(k for k in header if k != "__metadata__")
    assert names == sorted(p for p, _ in all_tensor_paths(original))
    ls_st = ckpt.json("ls", st, "--json")
    assert ls_st["format"] == "safetensors"

    r = ckpt.ok("convert", st, tz)
    assert "non-tensor" not in r.stderr
    assert ckpt.ok("verify", tz).stdout.startswith("OK")
    ls_tz = ckpt.json("ls", tz, "--json")
    assert ls_tz["format"] == "tensorizer"
    assert sorted(t["name"] for t in ls_tz["tensors"]) == names

    ckpt.ok("convert", tz, pt)
    loaded = helpers.torch_load(pt)
    _check_same_tensors(original, loaded, file_id)
    loaded = torch.load(pt, weights_only=True)
    _check_same_tensors(original, loaded, f"{file_id} (weights_only)")


def test_complex128_via_tensorizer(ckpt, cache, tmp_path):
    """safetensors has no complex128, tensorizer has: pt -> tensorizer -> pt keeps it."""
    import torch
    for file_id in ("dtype_complex128", "dtype_complex128.legacy"):
        tz, pt = tmp_path / f"{file_id}.tensors", tmp_path / f"{file_id}.pt"
        ckpt.ok("convert", cache.path(file_id), tz)
        assert ckpt.ok("verify", tz).stdout.startswith("OK")
        ckpt.ok("convert", tz, pt)
        _check_same_tensors(cache.load(cache.path(file_id)), helpers.torch_load(pt), file_id)


def test_unsupported_targets_fail_clearly(ckpt, cache, tmp_path):
    cases = [("dtype_complex128", "safetensors", 6, ["complex128", "safetensors", "t"]),
             ("single_tensor", "safetensors", 8, ["unnamed", "pt"]),
             ("single_tensor", "tensors", 8, ["unnamed", "pt"])]
    for file_id in ZIP_IDS + LEGACY_IDS:
        if is_quantized_case(file_id):
            first = helpers.flatten(cache.load(cache.path(file_id)))[0][0]
            for ext in ("safetensors", "tensors"):
                cases.append((file_id, ext, 6, ["quantized", first]))
    for file_id, ext, code, words in cases:
        out = tmp_path / f"{file_id}.{ext}"
        r = ckpt.run("convert", cache.path(file_id), out)
        line = one_error_line(r)
        assert r.returncode == code, f"{file_id} -> {ext}: {line}"
        for w in words:
            assert w in line, f"{file_id} -> {ext}: {w!r} not in {line!r}"
        assert not out.exists(), f"{file_id} -> {ext}: output left behind"
        assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p], "temporary file left behind"


# ---------------------------------------------------------------------------
# tied and shared tensors


@pytest.mark.parametrize("file_id", ["tied", "tied.legacy", "shared_storage", "views", "view_only"])
def test_shared_needs_copy_shared(ckpt, cache, file_id, tmp_path):
    import torch
    out = tmp_path / "s.safetensors"
    r = ckpt.run("convert", cache.path(file_id), out)
    if file_id.startswith("tied"):
        # One tensor under two names: the alias is left out, as safetensors' save_model does
        # (test_transforms.py compares the names kept with safetensors').
        assert r.returncode == 0 and "tied names left out" in r.stderr, r.stderr
        out.unlink()
    else:
        line = one_error_line(r)
        assert r.returncode == 8 and "--copy-shared" in line, line
        assert not out.exists()

    ckpt.ok("convert", cache.path(file_id), out, "--copy-shared")
    pt = tmp_path / "s.pt"
    ckpt.ok("convert", out, pt)
    _check_same_tensors(cache.load(cache.path(file_id)), helpers.torch_load(pt), file_id)

    # tensorizer cannot express sharing either: it writes copies and says so.
    tz = tmp_path / "s.tensors"
    r = ckpt.ok("convert", cache.path(file_id), tz)
    assert "separate copies" in r.stderr, r.stderr
    assert ckpt.ok("verify", tz).stdout.startswith("OK")


# ---------------------------------------------------------------------------
# ckpt-written tensorizer: verification, corruption, encryption


def test_written_tensorizer_corruption(ckpt, cache, tmp_path):
    tz = tmp_path / "big.tensors"
    ckpt.ok("convert", cache.path("big"), tz)
    big = next(t for t in ckpt.json("ls", tz, "--json")["tensors"] if t["name"] == "big")
    bad = _copy(tz, tmp_path / "bad.tensors")
    _flip(bad, big["offset"] + 4 * 1000)
    r = ckpt.run("verify", bad)
    line = one_error_line(r)
    assert r.returncode == 5 and "big" in line, line
    data = tz.read_bytes()
    cut = tmp_path / "cut.tensors"
    cut.write_bytes(data[:len(data) // 2])
    r = ckpt.run("verify", cut)
    one_error_line(r)
    assert r.returncode == 4, r.stderr


def _bytes_by_name(ckpt, path, tmp_path, *args):
    return {n: p for n, (e, p) in extract(ckpt, path, tmp_path / f"x{len(os.listdir(tmp_path))}", *args).items()}


def test_encryption_random_key(ckpt, cache, tmp_path):
    src = cache.path("plain_sd")
    key = tmp_path / "new.key"
    out = tmp_path / "enc.tensors"
    r = ckpt.ok("convert", src, out, "--encrypt-key", key)
    assert "wrote a new random key" in r.stderr
    hexkey = key.read_text().strip()
    assert re.fullmatch(r"[0-9a-f]{64}", hexkey), hexkey
    # A key is a secret: the new file is the owner's alone, and a shared one is warned about.
    assert (key.stat().st_mode & 0o777) == 0o600, oct(key.stat().st_mode)
    assert "warning" not in r.stderr
    shared = tmp_path / "shared.key"
    shared.write_text(hexkey + "\n")
    shared.chmod(0o644)
    r = ckpt.ok("ls", out, "--decrypt-key", shared)
    assert "readable by others (mode 644)" in r.stderr, r.stderr
    assert ckpt.ok("verify", out, "--decrypt-key", key).stdout.startswith("OK")
    want = _bytes_by_name(ckpt, src, tmp_path)
    assert _bytes_by_name(ckpt, out, tmp_path, "--decrypt-key", key) == want

    # The same key file again: reused, not replaced.
    out2 = tmp_path / "enc2.tensors"
    r = ckpt.ok("convert", src, out2, "--encrypt-key", key)
    assert "new random key" not in r.stderr and key.read_text().strip() == hexkey
    assert _bytes_by_name(ckpt, out2, tmp_path, "--decrypt-key", key) == want

    # Back to pt through the decryption options of convert.
    pt = tmp_path / "dec.pt"
    ckpt.ok("convert", out, pt, "--decrypt-key", key)
    import torch
    _check_same_tensors(cache.load(src), helpers.torch_load(pt), "decrypted")

    wrong = tmp_path / "wrong.key"
    wrong.write_text(hexkey[::-1] + "\n")
    wrong.chmod(0o600)
    for cmd in (["verify", out], ["extract", out, tmp_path / "w"], ["convert", out, tmp_path / "w.pt"]):
        r = ckpt.run(*cmd, "--decrypt-key", wrong)
        line = one_error_line(r)
        assert r.returncode == 9, f"{cmd[0]}: {line}"
    assert not (tmp_path / "w.pt").exists()


def test_encryption_password(ckpt, cache, tmp_path):
    src = cache.path("dtype_bfloat16")
    pw = tmp_path / "pw"
    pw.write_text("correct horse battery staple\n")
    out = tmp_path / "enc.tensors"
    ckpt.ok("convert", src, out, "--encrypt-password-file", pw)
    assert ckpt.ok("verify", out, "--decrypt-password-file", pw).stdout.startswith("OK")
    assert _bytes_by_name(ckpt, out, tmp_path, "--decrypt-password-file", pw) == \
        _bytes_by_name(ckpt, src, tmp_path)
    wrong = tmp_path / "wrong"
    wrong.write_text("correct horse battery stapler\n")
    wrong.chmod(0o600)
    r = ckpt.run("verify", out, "--decrypt-password-file", wrong)
    line = one_error_line(r)
    assert r.returncode == 9, line


def test_encryption_only_for_tensorizer(ckpt, cache, tmp_path):
    for ext in ("pt", "safetensors"):
        r = ckpt.run("convert", cache.path("plain_sd"), tmp_path / f"o.{ext}", "--encrypt-key",
                     tmp_path / "k")
        line = one_error_line(r)
        assert r.returncode == 8 and "tensorizer" in line, line
        assert not (tmp_path / "k").exists()


# ---------------------------------------------------------------------------
# safetensors layout


@pytest.mark.parametrize("align", [None, 4096])
def test_safetensors_alignment(ckpt, cache, align, tmp_path):
    out = tmp_path / "a.safetensors"
    # adam mixes float32 and int64 (and 0-d) tensors; plain_sd adds float16.
    for file_id in ("adam", "plain_sd", "scalars_0d"):
        args = ["--align", align] if align else []
        ckpt.ok("convert", cache.path(file_id), out, *args)
        n, header = safetensors_header(out)
        assert (8 + n) % (align or 8) == 0, f"{file_id}: data starts at {8 + n}"
        end = 0
        for name, e in sorted(((k, v) for k, v in header.items() if k != "__metadata__"),
                              key=lambda kv: kv[1]["data_offsets"][0]):
            start, stop = e["data_offsets"]
            assert start == end, f"{file_id}: {name}: gap or overlap"
            assert (8 + n + start) % ST_ELEMENT_SIZE[e["dtype"]] == 0, f"{file_id}: {name}: misaligned"
            end = stop
        assert os.path.getsize(out) == 8 + n + end
        assert ckpt.json("ls", out, "--json")["format"] == "safetensors"


# ---------------------------------------------------------------------------
# progress output


def test_no_progress_without_terminal(ckpt, cache, tmp_path):
    """stderr is a pipe here: nothing but real notes may appear there."""
    for ext in ("pt", "safetensors", "tensors"):
        r = ckpt.ok("convert", cache.path("big"), tmp_path / f"big.{ext}")
        assert r.stderr == "", f"{ext}: {r.stderr!r}"
        assert r.stdout.startswith("wrote "), r.stdout
    pw = tmp_path / "pw"
    pw.write_text("pw\n")
    pw.chmod(0o600)
    r = ckpt.ok("convert", cache.path("big"), tmp_path / "enc.tensors", "--encrypt-password-file", pw)
    assert r.stderr == "", r.stderr


def test_progress_on_terminal(ckpt, cache, tmp_path):
    """With stderr on a terminal, a conversion that takes a while (the Argon2id key derivation
    takes ~0.5 s) draws one updating line ending in 100% and a newline."""
    pw = tmp_path / "pw"
    pw.write_text("pw\n")
    pw.chmod(0o600)
    master, slave = pty.openpty()
    try:
        r = subprocess.run([ckpt.path, "convert", cache.path("big"), str(tmp_path / "e.tensors"),
                            "--encrypt-password-file", str(pw)],
                           stdout=subprocess.PIPE, stderr=slave, timeout=60)
    finally:
        os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        err += chunk
    os.close(master)
    assert r.returncode == 0
    text = err.decode()
    assert "\r" in text and "/s  " in text and "100%" in text, repr(text)
    assert text.endswith("\n") and text.count("\n") == 1, repr(text)
    assert r.stdout.startswith(b"wrote "), r.stdout


# ---------------------------------------------------------------------------
# the real safetensors package


def test_real_safetensors_cross_check(ckpt, cache, tmp_path):
    st = pytest.importorskip("safetensors.torch", reason="python3-safetensors is not installed "
                             "(not packaged in Debian)")
    import torch
    for file_id in ("plain_sd", "module_sd", "dtype_bfloat16", "dtype_bool", "scalars_0d", "empty"):
        original = cache.load(cache.path(file_id))
        out = tmp_path / f"{file_id}.safetensors"
        ckpt.ok("convert", cache.path(file_id), out)
        _check_same_tensors(original, st.load_file(str(out)), f"{file_id} (safetensors.torch)")
        ref = tmp_path / f"{file_id}.ref.safetensors"
        st.save_file({p: t.contiguous() for p, t in all_tensor_paths(original)}, str(ref))
        pt = tmp_path / f"{file_id}.ref.pt"
        ckpt.ok("convert", ref, pt)
        _check_same_tensors(original, helpers.torch_load(pt), f"{file_id} (from safetensors.torch)")
