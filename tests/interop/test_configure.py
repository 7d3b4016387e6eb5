"""Configure-time checks (cmake/ckpt_dependencies.cmake): a missing dependency stops CMake at
once, before anything compiles, naming the packages that provide it on Debian/Ubuntu, Fedora and
conda-forge. CKPT_PRETEND_MISSING hides a dependency the machine has."""

import os
import shutil
import subprocess
import time

import pytest

from conftest import REPO

CASES = {
    "cli11": ["libcli11-dev", "cli11-devel", "conda-forge", "CLI/CLI.hpp"],
    "dlpack": ["libdlpack-dev", "Fedora has no package", "CKPT_DLPACK_INCLUDE_DIR"],
    "zlib": ["zlib1g-dev", "zlib-devel"],
    "gtest": ["libgtest-dev", "gtest-devel"],
}


@pytest.mark.skipif(shutil.which("cmake") is None, reason="no cmake")
@pytest.mark.parametrize("dep", sorted(CASES))
def test_a_missing_dependency_stops_configure_with_its_packages(dep, tmp_path):
    start = time.monotonic()
    r = subprocess.run(["cmake", "-S", REPO, "-B", str(tmp_path / "b"), "-G", "Ninja",
                        "-DCKPT_BUILD_PYTHON=ON", f"-DCKPT_PRETEND_MISSING={dep}"],
                       capture_output=True, text=True, timeout=300)
    took = time.monotonic() - start
    assert r.returncode != 0
    text = " ".join((r.stdout + r.stderr).split())
    for word in CASES[dep]:
        assert word in text, (word, text[-2000:])
    assert "Debian/Ubuntu" in text and "Fedora" in text
    assert not (tmp_path / "b" / "build.ninja").exists()  # nothing was generated, nothing built
    assert took < 120


@pytest.mark.skipif(shutil.which("cmake") is None, reason="no cmake")
def test_a_missing_optional_library_is_a_feature_turned_off(tmp_path):
    r = subprocess.run(["cmake", "-S", REPO, "-B", str(tmp_path / "b"), "-G", "Ninja",
                        "-DCKPT_BUILD_PYTHON=OFF", "-DCKPT_BUILD_TESTS=OFF",
                        "-DCKPT_PRETEND_MISSING=libcurl;libsodium;yaml-cpp"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    text = r.stdout + r.stderr
    assert "HTTP/S3 (libcurl): OFF" in text and "libcurl4-openssl-dev" in text
    assert "libsodium): OFF" in text and "libsodium-dev" in text
    assert "YAML recipes (yaml-cpp): OFF" in text
    assert "libyaml-cpp-dev / yaml-cpp-devel / yaml-cpp" in text
