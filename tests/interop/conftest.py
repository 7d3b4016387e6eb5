"""Fixtures for the ckpt <-> PyTorch interop tests.

The ckpt binary is build/ckpt under the repository root, or $CKPT_BIN.  When it
is missing every test that needs it is skipped (the suite still collects).
The torch corpus is generated once per session into a pytest tmp dir.
"""

import json
import os
import shutil
import subprocess
import warnings

import pytest
import helpers

warnings.filterwarnings("ignore", message=".*ComplexHalf support is experimental.*")

import corpus  # noqa: E402  (tests/interop is on sys.path: rootdir-relative conftest)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 60

# File ids known at collection time (no torch.save needed to parametrize).
ZIP_IDS = [c.name for c in corpus.CASES]
LEGACY_IDS = [f"{c.name}.legacy" for c in corpus.CASES if c.legacy]
ALL_IDS = ZIP_IDS + LEGACY_IDS
REFUSE_IDS = [f"{n}{s}" for n in corpus.REFUSE for s in ("", ".legacy")]
BYTE_IDENTITY_IDS = [c.name for c in corpus.CASES if c.byte_identity]
# The workplace's DCP folder written by torch 2.11 (one process), when it is here.
DCP_FIXTURE = next((os.path.join(d, "torch2", "dcp_model") for d in (
    os.environ.get("CKPT_FIXTURES"),
    os.path.join(REPO, "..", "shared", "fixtures"),
    "/work/shared/fixtures") if d and os.path.isdir(os.path.join(d, "torch2", "dcp_model"))), "")


def ckpt_path():
    return os.environ.get("CKPT_BIN") or os.path.join(REPO, "build", "ckpt")


class Ckpt:
    def __init__(self, path):
        self.path = path

    def run(self, *args, timeout=TIMEOUT):
        """Run ckpt; returns CompletedProcess with text stdout/stderr."""
        return subprocess.run([self.path, *map(str, args)], capture_output=True, text=True,
                              timeout=timeout, errors="replace")

    def ok(self, *args, timeout=TIMEOUT):
        r = self.run(*args, timeout=timeout)
        assert r.returncode == 0, (f"ckpt {' '.join(map(str, args))} exited {r.returncode}\n"
                                   f"stderr: {r.stderr}\nstdout: {r.stdout[:2000]}")
        return r

    def json(self, *args):
        r = self.ok(*args)
        try:
            return json.loads(r.stdout)
        except json.JSONDecodeError as e:
            raise AssertionError(f"ckpt {' '.join(map(str, args))}: stdout is not JSON ({e}): {r.stdout[:2000]}")


@pytest.fixture(scope="session")
def ckpt():
    path = ckpt_path()
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.skip(f"ckpt binary not found at {path} (build it or set CKPT_BIN)")
    return Ckpt(path)


@pytest.fixture(scope="session")
def corpus_files(tmp_path_factory):
    """{"files": {file_id: path}, "refuse": {file_id: (path, global)}, "marker": path}."""
    return corpus.generate(str(tmp_path_factory.mktemp("corpus")))


class Cache:
    """Per-session memo of expensive results (torch.load, ckpt ls/convert)."""

    def __init__(self, ckpt, files, workdir):
        self.ckpt, self.files, self.workdir = ckpt, files, workdir
        self._loaded, self._ls, self._converted = {}, {}, {}

    def path(self, file_id):
        return self.files["files"][file_id]

    def load(self, path):
        import torch
        if path not in self._loaded:
            self._loaded[path] = helpers.torch_load(path)
        return self._loaded[path]

    def ls(self, file_id):
        if file_id not in self._ls:
            self._ls[file_id] = self.ckpt.json("ls", self.path(file_id), "--json")
        return self._ls[file_id]

    def converted(self, file_id):
        """ckpt convert <file> -> <workdir>/conv/<file_id>.pt (default alignment)."""
        if file_id not in self._converted:
            out_dir = os.path.join(self.workdir, "conv")
            os.makedirs(out_dir, exist_ok=True)
            out = os.path.join(out_dir, f"{file_id.replace('.', '_')}.pt")
            self.ckpt.ok("convert", self.path(file_id), out)
            self._converted[file_id] = out
        return self._converted[file_id]


@pytest.fixture(scope="session")
def cache(ckpt, corpus_files, tmp_path_factory):
    return Cache(ckpt, corpus_files, str(tmp_path_factory.mktemp("work")))


def one_error_line(r):
    """Assert a failed run ended cleanly: non-zero exit (not a signal), exactly
    one line on stderr, no crash markers."""
    assert r.returncode > 0, f"expected a clean non-zero exit, got {r.returncode}; stderr: {r.stderr!r}"
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}: {r.stderr!r}"
    for marker in ("Traceback", "terminate called", "Assertion", "AddressSanitizer", "Segmentation"):
        assert marker not in r.stderr, f"crash marker {marker!r} in stderr: {r.stderr!r}"
    return lines[0]


# ---------------------------------------------------------------------------------------------
# Shared by several files, started or made once per session.

@pytest.fixture(scope="session")
def rgw(tmp_path_factory):
    import rgw_server
    if not shutil.which("curl"):
        pytest.skip("the curl tool is needed to fill the bucket")
    g, err = None, None
    for _ in range(2):  # a second try: a cluster of an earlier session may still be exiting
        try:
            g = rgw_server.Rgw(str(tmp_path_factory.mktemp("rgw")))
            break
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            err = e
    if g is None:
        pytest.skip(f"Ceph RGW cannot run here: {err}")
    try:
        g.curl("PUT", "/ckpt")
        yield g
    finally:
        g.stop()


@pytest.fixture(scope="session")
def dcp_dirs(tmp_path_factory):
    try:
        import torch.distributed.checkpoint  # noqa: F401
    except ImportError:
        pytest.skip("torch.distributed is not available")
    import dcp_make

    dirs = dcp_make.make_folders(str(tmp_path_factory.mktemp("dcp")))
    if DCP_FIXTURE:
        dirs["fixture"] = DCP_FIXTURE
    return dirs
