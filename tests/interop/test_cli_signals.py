"""Interruption and `extract`'s folder (issue 16, points 2 and 3).

SIGINT, SIGTERM and SIGHUP sent to convert (to pt, safetensors, tensorizer), rewrite, extract and
sample, early in the run and while the output is being written: ckpt removes its temporaries and
exits 128 + the signal (130, 143, 129); the destination is absent, or, when one existed, byte
for byte what it was. (SIGKILL cannot be caught: test_crash_safety.py covers what it leaves.)

extract writes into a temporary sibling folder and renames it into place: a non-empty target is
refused without --force and replaced whole with it, parents are created, a full disk leaves
nothing, and every .npy of a finished extract reads with numpy.
"""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}
TENSORS, ROWS = 64, 1024  # 64 float32 tensors of 1024 x 1024: 256 MiB


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A 256 MiB torch state dict and a TorchScript archive of 64 MiB, written once by torch."""
    torch = pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("signals-src")
    g = torch.Generator().manual_seed(16)
    sd = {f"layers.{i}.weight": torch.randn(ROWS, ROWS, generator=g) for i in range(TENSORS)}
    src = d / "big.pt"
    torch.save(sd, src)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.ParameterList(
                [torch.nn.Parameter(torch.randn(ROWS, ROWS, generator=g)) for _ in range(16)])

        def forward(self, x):
            return x

    ts = d / "big_ts.pt"
    torch.jit.save(torch.jit.script(Model()), str(ts))
    return {"pt": src, "ts": ts}


def temporaries(folder):
    return sorted(n for n in os.listdir(folder) if ".tmp-" in n)


def bytes_in(path):
    """Size of a file, or of the files in a folder."""
    if os.path.isdir(path):
        total = 0
        for n in os.listdir(path):
            try:
                total += os.stat(os.path.join(path, n)).st_size
            except FileNotFoundError:
                pass
        return total
    return os.stat(path).st_size


def wait_until_writing(p, folder, min_bytes, timeout=60):
    """Waits until a temporary in `folder` holds min_bytes (the middle of the write)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert p.poll() is None, f"ckpt ended (exit {p.returncode}) before it was interrupted"
        for n in temporaries(folder):
            try:
                if bytes_in(os.path.join(folder, n)) >= min_bytes:
                    return
            except FileNotFoundError:
                pass
        time.sleep(0.002)
    raise AssertionError(f"no temporary of {min_bytes} bytes appeared in {folder}")


def wait_for_handlers(p, timeout=30):
    """Waits until ckpt has installed its handlers (SigCgt in /proc), the earliest point."""
    bits = sum(1 << (s - 1) for s in EXIT)
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert p.poll() is None, f"ckpt ended (exit {p.returncode}) before it was interrupted"
        try:
            with open(f"/proc/{p.pid}/status") as f:
                caught = next(int(l.split()[1], 16) for l in f if l.startswith("SigCgt:"))
        except (FileNotFoundError, StopIteration):
            caught = 0
        if caught & bits == bits:
            return
        time.sleep(0.001)
    raise AssertionError("ckpt never installed its signal handlers")


def default_signals():
    # A test run started in the background of a script inherits SIGINT ignored, and ckpt keeps
    # an ignored signal ignored (nohup): give the child the default dispositions.
    for s in EXIT:
        signal.signal(s, signal.SIG_DFL)


def snapshot(path):
    """{relative name: bytes} of a file or a folder tree; None when absent."""
    if not os.path.lexists(path):
        return None
    if os.path.isfile(path):
        with open(path, "rb") as f:
            return {"": f.read()}
    out = {}
    for root, _, files in os.walk(path):
        for n in files:
            full = os.path.join(root, n)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = f.read()
    return out


def make_old(dest, kind):
    if kind == "file":
        with open(dest, "wb") as f:
            f.write(b"the old checkpoint, which must survive an interrupted replacement\n" * 100)
    elif kind == "folder":
        os.makedirs(os.path.join(dest, "sub"))
        for n in ("old.npy", "index.json", "sub/notes.txt"):
            with open(os.path.join(dest, n), "w") as f:
                f.write(f"old {n}\n")


# (id, args builder (src, ts, dest) -> argv tail, destination name, source key, signal, point,
#  what exists at the destination before: None, "file" or "folder")
CASES = [
    ("convert-pt-int-middle", lambda s, t, d: ["convert", s, d], "out.pt", signal.SIGINT, "middle", None),
    ("convert-pt-term-early", lambda s, t, d: ["convert", s, d], "out.pt", signal.SIGTERM, "early", None),
    ("convert-pt-hup-middle-old", lambda s, t, d: ["convert", s, d], "out.pt", signal.SIGHUP, "middle", "file"),
    ("convert-st-term-middle", lambda s, t, d: ["convert", s, d], "out.safetensors", signal.SIGTERM, "middle", None),
    ("convert-st-int-middle-old", lambda s, t, d: ["convert", s, d], "out.safetensors", signal.SIGINT, "middle", "file"),
    ("convert-tz-int-middle", lambda s, t, d: ["convert", s, d], "out.tensors", signal.SIGINT, "middle", None),
    ("convert-tz-hup-early", lambda s, t, d: ["convert", s, d], "out.tensors", signal.SIGHUP, "early", None),
    ("rewrite-int-middle", lambda s, t, d: ["rewrite", t, d], "out_ts.pt", signal.SIGINT, "middle", None),
    ("rewrite-term-middle-old", lambda s, t, d: ["rewrite", t, d], "out_ts.pt", signal.SIGTERM, "middle", "file"),
    ("extract-int-middle", lambda s, t, d: ["extract", s, d], "npy", signal.SIGINT, "middle", None),
    ("extract-hup-early", lambda s, t, d: ["extract", s, d], "npy", signal.SIGHUP, "early", None),
    ("extract-term-middle-force", lambda s, t, d: ["extract", "--force", s, d], "npy", signal.SIGTERM, "middle", "folder"),
    ("sample-int-early", lambda s, t, d: ["sample", d, "--size-mb", "256"], "sample.pt", signal.SIGINT, "early", None),
    ("sample-term-middle", lambda s, t, d: ["sample", d, "--size-mb", "256"], "sample.pt", signal.SIGTERM, "middle", None),
    ("sample-hup-middle-old", lambda s, t, d: ["sample", d, "--size-mb", "256"], "sample.pt", signal.SIGHUP, "middle", "file"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_interrupt_removes_temporaries(ckpt, big, tmp_path, case):
    _, argv, dest_name, sig, point, old = case
    folder = tmp_path / "out"
    folder.mkdir()
    dest = folder / dest_name
    make_old(dest, old)
    before = snapshot(dest)
    p = subprocess.Popen([ckpt.path, *map(str, argv(big["pt"], big["ts"], dest))],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=default_signals)
    try:
        if point == "early":
            # As soon as the handlers are there: while parsing, opening the source, generating.
            wait_for_handlers(p)
        else:
            wait_until_writing(p, folder, 16 << 20)
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == EXIT[sig], (
        f"exit {p.returncode}, expected {EXIT[sig]}\nstderr: {err.decode(errors='replace')}")
    assert f"interrupted by {sig.name}".encode() in err, err
    assert temporaries(folder) == [], "temporaries left behind"
    assert snapshot(dest) == before, "the destination changed"
    assert sorted(os.listdir(folder)) == ([dest_name] if old else [])


# ---------------------------------------------------------------------------------------------
# extract's folder


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    torch = pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("extract-src")
    g = torch.Generator().manual_seed(3)
    sd = {f"block.{i}.weight": torch.randn(8, 4, generator=g) for i in range(26)}
    sd["block.0.bias"] = torch.arange(5, dtype=torch.int64)
    sd["emb"] = torch.randn(3, 3, generator=g).to(torch.bfloat16)
    src = d / "sd.pt"
    torch.save(sd, src)
    return src, sd


def check_extracted(dest, sd):
    np = pytest.importorskip("numpy")
    with open(dest / "index.json") as f:
        index = json.load(f)
    files = [t["file"] for t in index["tensors"]]
    assert sorted(os.listdir(dest)) == sorted(files + ["index.json"])
    assert len(files) == len(sd)
    for t in index["tensors"]:
        a = np.load(dest / t["file"])
        ref = sd[t["name"]]
        assert list(a.shape) == list(ref.shape), t["name"]
        if not t["raw_bits"]:
            assert (a == ref.numpy()).all(), t["name"]


def test_extract_creates_parents(ckpt, small, tmp_path):
    src, sd = small
    dest = tmp_path / "a" / "b" / "c"
    ckpt.ok("extract", src, dest)
    check_extracted(dest, sd)
    assert temporaries(dest.parent) == []


def test_extract_into_an_empty_folder(ckpt, small, tmp_path):
    src, sd = small
    dest = tmp_path / "empty"
    dest.mkdir()
    ckpt.ok("extract", src, str(dest) + "/")
    check_extracted(dest, sd)


def test_extract_refuses_a_used_folder_without_force(ckpt, small, tmp_path):
    src, sd = small
    dest = tmp_path / "used"
    make_old(dest, "folder")
    before = snapshot(dest)
    r = ckpt.run("extract", src, dest)
    assert r.returncode == 8, r.stderr
    assert "not empty" in r.stderr and "--force" in r.stderr, r.stderr
    assert snapshot(dest) == before
    assert temporaries(tmp_path) == []


def test_extract_force_replaces_the_folder_whole(ckpt, small, tmp_path):
    src, sd = small
    dest = tmp_path / "used"
    make_old(dest, "folder")
    # Stale files of a bigger extract: none may survive.
    for i in range(100):
        (dest / f"stale{i}.npy").write_bytes(b"stale")
    ckpt.ok("extract", "--force", src, dest)
    check_extracted(dest, sd)
    assert sorted(os.listdir(tmp_path)) == ["used"]


def test_extract_refuses_a_file_as_target(ckpt, small, tmp_path):
    src, _ = small
    dest = tmp_path / "file"
    dest.write_bytes(b"not a folder")
    for extra in ([], ["--force"]):
        r = ckpt.run("extract", *extra, src, dest)
        assert r.returncode == 8, r.stderr
        assert dest.read_bytes() == b"not a folder"
    assert sorted(os.listdir(tmp_path)) == ["file"]


@pytest.fixture
def small_disk():
    """A 24 MiB tmpfs (root only): a full disk."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    d = tempfile.mkdtemp(prefix="ckpt-full-")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", d],
                       capture_output=True, text=True)
    if r.returncode != 0:
        os.rmdir(d)
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", d], check=False)
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("old", [None, "folder"])
def test_extract_on_a_full_disk_leaves_nothing(ckpt, big, small_disk, old):
    dest = os.path.join(small_disk, "x", "npy")
    if old:
        make_old(dest, old)
    before = sorted(os.listdir(small_disk))
    snap = snapshot(dest)
    r = ckpt.run("extract", *(["--force"] if old else []), big["pt"], dest, timeout=120)
    assert r.returncode == 3, r.stderr  # I/O error
    assert "No space left" in r.stderr, r.stderr
    assert snapshot(dest) == snap
    # The parents it created may stay; nothing else.
    assert sorted(os.listdir(small_disk)) == before or sorted(os.listdir(small_disk)) == ["x"]
    assert temporaries(os.path.join(small_disk, "x")) == []
    assert sorted(os.listdir(os.path.join(small_disk, "x"))) == (["npy"] if old else [])


def test_convert_on_a_full_disk_leaves_nothing(ckpt, big, small_disk):
    dest = os.path.join(small_disk, "out.safetensors")
    r = ckpt.run("convert", big["pt"], dest, timeout=120)
    assert r.returncode == 3, r.stderr
    assert os.listdir(small_disk) == []
