"""Hostile and broken files raise ckpt.Error subclasses naming the file; the interpreter lives."""

import os
import subprocess
import sys
import zipfile

import pytest
import torch

import ckpt


def test_missing_file(tmp_path):
    p = str(tmp_path / "nope.pt")
    for f in (lambda: ckpt.load(p), lambda: ckpt.load(p, mmap=True), lambda: ckpt.safe_open(p),
              lambda: ckpt.open(p)):
        with pytest.raises(ckpt.NotFoundError) as e:
            f()
        assert p in str(e.value) and e.value.source == p and e.value.code == "not_found"
        assert isinstance(e.value, ckpt.Error)


def test_empty_and_garbage(tmp_path):
    p = tmp_path / "e.pt"
    p.write_bytes(b"")
    with pytest.raises(ckpt.TruncatedError):
        ckpt.load(p)
    p.write_bytes(b"\x00garbage" * 50)
    with pytest.raises(ckpt.Error) as e:
        ckpt.load(p, mmap=True)
    assert str(p) in str(e.value)


def test_truncated_and_corrupt(tmp_path):
    good = tmp_path / "g.pt"
    torch.save({"w": torch.randn(64, 64), "b": torch.randn(64)}, good)
    data = good.read_bytes()
    for cut in (10, len(data) // 3, len(data) // 2, len(data) - 30):
        p = tmp_path / f"t{cut}.pt"
        p.write_bytes(data[:cut])
        with pytest.raises(ckpt.Error):
            ckpt.load(p)
    # A flipped byte inside a tensor's bytes: verify names the record and its offset.
    raw = bytearray(data)
    with zipfile.ZipFile(good) as z:
        info = z.getinfo([n for n in z.namelist() if n.endswith("data/0")][0])
    h = info.header_offset
    name_len, extra_len = int.from_bytes(raw[h + 26:h + 28], "little"), \
        int.from_bytes(raw[h + 28:h + 30], "little")
    off = h + 30 + name_len + extra_len + 5
    raw[off] ^= 0xFF
    bad = tmp_path / "bad.pt"
    bad.write_bytes(bytes(raw))
    with pytest.raises(ckpt.CorruptError) as e:
        ckpt.load(bad, verify=True)
    assert "data/0" in str(e.value)
    with pytest.raises(ckpt.CorruptError):
        ckpt.open(bad).verify()


def test_hostile_pickles_in_subprocess(tmp_path):
    # Deep nesting and other hostile pickles, in a child: a crash would not take pytest down.
    code = r'''
import io, pickle, struct, sys, zipfile
sys.path.insert(0, sys.argv[1])
import ckpt
def pt(pkl):
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w") as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/version", "3\n")
    return b.getvalue()
cases = {
  "deep": pt(b"\x80\x02" + b"]" * 200000 + b"a" * 199999 + b"."),
  "deep_dict": pt(b"\x80\x02}" + b"X\x01\x00\x00\x00a}" * 5000 + b"s" * 5000 + b"."),
  "bad_opcode": pt(b"\x80\x02\xff."),
  "stack_underflow": pt(b"\x80\x02s."),
  "huge_binunicode": pt(b"\x80\x02X\xff\xff\xff\x7f."),
  "unhashable_key": pt(b"\x80\x02}](K\x01e]s."),
}
for name, data in cases.items():
    try:
        ckpt.load(io.BytesIO(data))
        print(name, "loaded")
    except ckpt.Error as e:
        print(name, type(e).__name__)
        print(name, e, file=sys.stderr)
    except RecursionError:
        print(name, "RecursionError")
'''
    from conftest import _BUILT
    r = subprocess.run([sys.executable, "-c", code, _BUILT], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert set(lines) == {"deep", "deep_dict", "bad_opcode", "stack_underflow", "huge_binunicode",
                          "unhashable_key"}, r.stdout
    for name, what in lines.items():
        assert what.endswith("Error") and what != "RecursionError", (name, what)


def test_error_codes_cover_the_library():
    names = {"io", "not_found", "truncated", "corrupt", "unsupported", "limit_exceeded",
             "invalid_argument", "auth"}
    from ckpt import _errors
    assert {c for c in _errors._BY_CODE} == names
    for n in names:
        assert issubclass(_errors.class_for(n), ckpt.Error)


MUTATE = r'''
import io, random, sys, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, sys.argv[1])
import ckpt
random.seed(int(sys.argv[2]))
other = 0
for path in sys.argv[3:]:
    data = open(path, "rb").read()
    for i in range(60):
        b = bytearray(data)
        if i % 3 == 0:
            b = b[:random.randrange(len(b))]
        else:
            for _ in range(1 + i % 4):
                b[random.randrange(len(b))] = random.randrange(256)
        for mmap in (False, True):
            p = path + ".mut"
            open(p, "wb").write(bytes(b))
            try:
                ckpt.load(p, mmap=mmap)
                with ckpt.safe_open(p) as f:
                    for k in f.keys():
                        f.get_tensor(k)
            except ckpt.Error:
                pass
            except Exception as e:  # anything else is a binding bug
                other += 1
                print("OTHER", type(e).__name__, e, file=sys.stderr)
print("other", other)
'''


def test_mutated_files_raise_ckpt_errors(torch_corpus, tmp_path, built_path):
    # Random byte flips and truncations of real files, in a child process: a crash would show as
    # a signal, and any exception that is not a ckpt.Error is counted.
    import shutil
    paths = []
    for fid in ("module_sd", "quant_per_channel", "nested.legacy", "views"):
        dst = tmp_path / (fid + ".pt")
        shutil.copy(torch_corpus["files"][fid], dst)
        paths.append(str(dst))
    st = tmp_path / "m.safetensors"
    ckpt.save_file({"a": torch.randn(8, 8), "b": torch.arange(10)}, st)
    tz = tmp_path / "m.tensors"
    ckpt.save({"a": torch.randn(8, 8), "b": torch.arange(10)}, tz)
    paths += [str(st), str(tz)]
    r = subprocess.run([sys.executable, "-c", MUTATE, built_path, "7", *paths],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "other 0", r.stderr[-3000:]


def test_string_not_utf8():
    import io
    import zipfile
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02X\x02\x00\x00\x00\xff\xfe.")
        z.writestr("archive/version", "3\n")
    with pytest.raises(ckpt.CorruptError):
        ckpt.load(io.BytesIO(b.getvalue()))


def test_namespace_state_with_dunder_is_a_ckpt_error(tmp_path):
    # argparse.Namespace whose pickled state sets __class__ to builtins.int: setattr would raise
    # TypeError (or, for another dunder, change what the object is).
    pkl = (b"\x80\x02}X\x04\x00\x00\x00argscargparse\nNamespace\n)\x81}"
           b"X\x09\x00\x00\x00__class__cbuiltins\nint\nsbs.")
    p = tmp_path / "ns.pt"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/version", "3\n")
    with pytest.raises(ckpt.Error) as e:
        ckpt.load(p)
    assert "__class__" in str(e.value)


def test_import_ckpt_leaves_the_rest_for_first_use():
    """`import ckpt` imports neither pickle (ForbiddenGlobalError's base: the class is made on
    first use, and is then still a pickle.UnpicklingError) nor the modules of loading across
    ranks and in place."""
    code = ("import sys, ckpt\n"
            "late = {'pickle', '_pickle', 'datetime', 'contextlib', 'ckpt._ranks',"
            " 'ckpt._load_into'} & set(sys.modules)\n"
            "assert not late, late\n"
            "import pickle\n"
            "assert issubclass(ckpt.ForbiddenGlobalError, pickle.UnpicklingError)\n"
            "assert ckpt.ForbiddenGlobalError is ckpt._errors.class_for("
            "'unsupported', \"global 'os.system' is not allowed\")\n"
            "assert ckpt.Shard(0).dim == 0 and callable(ckpt.load_into)\n")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(ckpt.__file__)))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
