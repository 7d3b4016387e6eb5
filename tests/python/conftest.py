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
