"""Builds the extension ckpt._ckpt with CMake (the library and python/src), for pip.

    /usr/bin/python3 -m pip install --no-build-isolation --no-index --break-system-packages .

Environment: CKPT_CMAKE_BUILD_DIR (reuse a build folder), CKPT_CMAKE_ARGS (extra -D flags),
CKPT_JOBS (parallel jobs; default: the machine's cores).

pybind11: the building interpreter's own (`import pybind11`: a venv's pybind11 3.x from PyPI)
when it has one and CKPT_CMAKE_ARGS names no pybind11_DIR, else CMake's search (Debian's
pybind11-dev, 2.10). Both build the same module.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def pybind11_args(extra):
    """-Dpybind11_DIR of the building interpreter's pybind11 package, if it has one."""
    if any(a.startswith("-Dpybind11_DIR") for a in extra):
        return []
    try:
        import pybind11
    except ImportError:
        return []
    return [f"-Dpybind11_DIR={pybind11.get_cmake_dir()}"]


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        out = Path(self.get_ext_fullpath(ext.name)).resolve()
        build = Path(os.environ.get("CKPT_CMAKE_BUILD_DIR") or ROOT / "build-python")
        args = ["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                "-DCKPT_BUILD_PYTHON=ON", "-DCKPT_BUILD_TESTS=OFF", "-DCKPT_BUILD_CLI=OFF",
                "-DCKPT_INSTALL=OFF", f"-DPython_EXECUTABLE={sys.executable}"]
        if shutil.which("ninja") and not (build / "CMakeCache.txt").exists():
            args += ["-G", "Ninja"]
        extra = os.environ.get("CKPT_CMAKE_ARGS", "").split()
        args += pybind11_args(extra) + extra
        subprocess.run(args, check=True)
        jobs = os.environ.get("CKPT_JOBS") or str(os.cpu_count() or 2)
        subprocess.run(["cmake", "--build", str(build), "--target", "ckpt_python", "-j", jobs],
                       check=True)
        built = list((build / "python" / "ckpt").glob("_ckpt*.so"))
        if len(built) != 1:
            raise RuntimeError(f"expected one _ckpt*.so in {build}/python/ckpt, found {built}")
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[0], out)


setup(
    ext_modules=[Extension("ckpt._ckpt", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": str(ROOT / "build-python" / "setuptools")}},
)
