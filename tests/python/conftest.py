"""Fixtures for the Python module's tests (tests/python).

The module is imported from $CKPT_PYTHONPATH, else <repo>/build/python (what `make python` builds),
else wherever `import ckpt` finds it (an installed copy). The torch corpus of tests/interop is
generated once per session.
"""

import os
import sys
import warnings

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_BUILT = os.environ.get("CKPT_PYTHONPATH") or os.path.join(REPO, "build", "python")
if os.path.isdir(os.path.join(_BUILT, "ckpt")):
    sys.path.insert(0, _BUILT)
sys.path.insert(0, os.path.join(REPO, "tests", "interop"))
warnings.filterwarnings("ignore", message=".*ComplexHalf support is experimental.*")
warnings.filterwarnings("ignore", message=".*TypedStorage is deprecated.*")

import corpus  # noqa: E402


@pytest.fixture(scope="session")
def built_path():
    return _BUILT


@pytest.fixture(scope="session")
def torch_corpus(tmp_path_factory):
    return corpus.generate(str(tmp_path_factory.mktemp("corpus")))


def pytest_report_header(config):
    import ckpt
    return f"ckpt module: {os.path.dirname(ckpt.__file__)}"


@pytest.fixture(scope="session")
def ckpt_bin():
    """The ckpt command: $CKPT_BIN, else <repo>/build/ckpt; skipped when not built."""
    path = os.environ.get("CKPT_BIN") or os.path.join(REPO, "build", "ckpt")
    if not os.access(path, os.X_OK):
        pytest.skip(f"ckpt binary not found at {path} (build it or set CKPT_BIN)")
    return path


@pytest.fixture(scope="session")
def nginx(tmp_path_factory):
    """A real nginx serving a tmp folder (tests/interop/test_remote.py's Nginx), once per
    session; skipped with a message where it cannot run."""
    from test_remote import NGINX, Nginx  # tests/interop (on sys.path above)
    if not os.path.exists(NGINX):
        pytest.skip("nginx is not installed (Debian package nginx)")
    try:
        n = Nginx(str(tmp_path_factory.mktemp("nginx")))
    except (RuntimeError, OSError) as e:
        pytest.skip(f"nginx cannot run here: {e}")
    yield n
    n.stop()


@pytest.fixture(scope="session")
def rgw(tmp_path_factory):
    """A single-node Ceph RGW with the bucket "ckpt" (tests/interop/rgw_server.py), once per
    session (~12 s); skipped with a message where it cannot run."""
    import shutil
    import subprocess
    import rgw_server
    if not shutil.which("curl"):
        pytest.skip("the curl tool is needed to fill the bucket")
    try:
        g = rgw_server.Rgw(str(tmp_path_factory.mktemp("rgw")))
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"Ceph RGW cannot run here: {e}")
    try:
        g.curl("PUT", "/ckpt")
        yield g
    finally:
        g.stop()
