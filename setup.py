"""pip install --no-build-isolation .   (offline; in a venv made with --system-site-packages
so that it sees Debian's python3-torch and numpy; `pip install -v ...` shows the build's
progress, which pip otherwise hides)

Builds the `flowstate` Python package with the project's CMake: the extension target
`flowstate_python` (its build writes the typed stubs) and the `flowstate` command,
and nothing else (no tests, benchmarks or examples), in build/pip (Release), or in
FLOWSTATE_BUILD_DIR when set (an already configured build tree, e.g. build/dev: then only what
changed is rebuilt). The command is installed on PATH beside the package's scripts. Needs
cmake, a C++20 compiler and the Debian packages of scripts/install-deps.sh (pybind11-dev,
python3-dev, ...). The version is the project's: `project(flowstate VERSION ...)` in
CMakeLists.txt.
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

try:
    from setuptools.command.build_scripts import build_scripts
except ImportError:  # setuptools < 67 (Debian 12's): distutils' own, which setuptools provides
    from distutils.command.build_scripts import build_scripts

ROOT = pathlib.Path(__file__).parent.resolve()
# The targets the package needs: the extension (whose build writes its stubs) and the command.
TARGETS = ["flowstate_python", "flowstate"]


def project_version():
    """The one version: project(flowstate VERSION X.Y.Z ...) in CMakeLists.txt."""
    text = (ROOT / "CMakeLists.txt").read_text()
    m = re.search(r"project\(\s*flowstate\s+VERSION\s+([0-9][0-9.]*)", text)
    if not m:
        sys.exit("setup.py: no `project(flowstate VERSION ...)` in CMakeLists.txt")
    return m.group(1)


def build_dir():
    build = pathlib.Path(os.environ.get("FLOWSTATE_BUILD_DIR") or ROOT / "build" / "pip")
    return build if build.is_absolute() else ROOT / build


def say(message):
    # pip shows a build backend's output with -v only; then these lines say what is happening.
    print(f"flowstate: {message}", flush=True)


def run(cmd):
    """Runs `cmd`, passing its output through line by line (CMake's [ NN%] lines are the
    build's progress), and fails with its status."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          bufsize=1) as p:
        for line in p.stdout:
            print(line, end="", flush=True)
    if p.returncode != 0:
        raise subprocess.CalledProcessError(p.returncode, cmd)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = build_dir()
        if not (build / "CMakeCache.txt").exists():
            say(f"configuring {build} (Release; the extension and the command only)")
            run(["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                 f"-DPython3_EXECUTABLE={sys.executable}", "-DFLOWSTATE_WITH_PYTHON=ON",
                 "-DFLOWSTATE_BUILD_TESTS=OFF", "-DFLOWSTATE_BUILD_BENCH=OFF",
                 "-DFLOWSTATE_BUILD_EXAMPLES=OFF", "-DFLOWSTATE_BUILD_FUZZERS=OFF"])
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        say(f"building {', '.join(TARGETS)} in {build} with {jobs} jobs (a first build takes "
            "minutes; `pip install -v` shows its progress)")
        run(["cmake", "--build", str(build), "--target", *TARGETS, "-j", jobs])
        package = build / "python" / "flowstate"
        built = next(package.glob("_flowstate*.so"))
        dest = pathlib.Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, dest)
        # The stubs gen_stubs.py wrote from the built package, beside it in the wheel.
        shutil.copy2(package / "__init__.pyi", dest.parent / "__init__.pyi")
        say("built")


class CommandScript(build_scripts):
    """The `flowstate` command is a program, not a Python script: copied as it is (setuptools
    would read it as text to rewrite a #! line), into the wheel's scripts, which pip installs
    on PATH (the venv's bin/) as executables."""

    def copy_scripts(self):
        self.mkpath(self.build_dir)
        outfiles = []
        # The command's MPI module (built with MPI), which it opens from its own directory
        # under an MPI launcher (cli/mpi_module.h), travels beside it.
        module = build_dir() / "cli" / "flowstate-mpi.so"
        extra = [str(module)] if module.exists() else []
        for script in list(self.scripts) + extra:
            out = os.path.join(self.build_dir, os.path.basename(script))
            self.copy_file(script, out)
            outfiles.append(out)
        return outfiles, outfiles


# Relative (setuptools takes no absolute script paths); it exists once
# build_ext, which runs before build_scripts, has built it.
COMMAND = os.path.relpath(build_dir() / "cli" / "flowstate")

setup(
    name="flowstate",
    version=project_version(),
    description="Exact, resumable input pipelines: a C++20 dataflow runtime with zero-copy "
                "PyTorch tensors",
    packages=["flowstate"],
    package_dir={"flowstate": "python/flowstate"},
    package_data={"flowstate": ["py.typed"]},
    ext_modules=[Extension("flowstate._flowstate", sources=[])],
    scripts=[COMMAND],
    cmdclass={"build_ext": CMakeBuild, "build_scripts": CommandScript},
    python_requires=">=3.9",
    # Batches are torch tensors (DLPack), so torch is required; numpy holds Python maps'
    # arrays. Both are Debian's (python3-torch, python3-numpy) in a venv made with
    # --system-site-packages; `pip install --no-deps` skips the check.
    install_requires=["numpy", "torch"],
)
