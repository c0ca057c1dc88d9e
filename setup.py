"""pip install --no-build-isolation .   (offline; in a venv made with --system-site-packages
so that it sees Debian's python3-torch and numpy)

Builds the `flowstate` Python package with the project's CMake: the extension target
`flowstate_python` in build/pip (Release), or in FLOWSTATE_BUILD_DIR when set (an already
configured build tree, e.g. build/dev: then only what changed is rebuilt). Needs cmake, a C++20
compiler and the Debian packages of scripts/install-deps.sh (pybind11-dev, python3-dev, ...).
"""
import os
import pathlib
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).parent.resolve()


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = pathlib.Path(os.environ.get("FLOWSTATE_BUILD_DIR", ROOT / "build" / "pip"))
        if not build.is_absolute():
            build = ROOT / build
        if not (build / "CMakeCache.txt").exists():
            subprocess.check_call([
                "cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                f"-DPython3_EXECUTABLE={sys.executable}", "-DFLOWSTATE_WITH_PYTHON=ON",
                "-DFLOWSTATE_BUILD_TESTS=OFF", "-DFLOWSTATE_BUILD_BENCH=OFF",
                "-DFLOWSTATE_BUILD_EXAMPLES=OFF"])
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", "--build", str(build), "--target", "flowstate_python",
                               "-j", jobs])
        built = next((build / "python" / "flowstate").glob("_flowstate*.so"))
        dest = pathlib.Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, dest)


setup(
    name="flowstate",
    version="0.1.0",
    description="Exact, resumable input pipelines: a C++20 dataflow runtime with zero-copy "
                "PyTorch tensors",
    packages=["flowstate"],
    package_dir={"flowstate": "python/flowstate"},
    ext_modules=[Extension("flowstate._flowstate", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
)
