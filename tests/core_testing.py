"""The test-only extension `_core_testing` (cpp/testing/), built on demand.

The fakes and hooks in cpp/testing/ are never part of the package: setup.py
builds `hvdcompat._core` only, so no wheel holds them. Tests that need them
call `load()`, which builds the module once into
build/core-testing/<key>/ (CMake with HVDCOMPAT_BUILD_TESTING=ON, against
the MPI compiler wrapper setup.py would use and this Python) and imports it
from there. Later calls rebuild only what changed (CMake's own up-to-date
check, about a second); a lock file keeps concurrent test processes from
building at once.
"""

import fcntl
import glob
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "_core_testing"
_loaded = {}


def _mpicc():
    named = os.environ.get("MPICC")
    found = shutil.which(named) if named else shutil.which("mpicc")
    if not found:
        raise RuntimeError("building _core_testing needs MPI's compiler wrapper: no `mpicc` on "
                           "PATH and no MPICC set (the same one the package was built with)")
    return os.path.realpath(found)


def _cmake():
    # The `cmake` wheel (a test requirement) puts its binary beside this Python.
    here = os.path.join(os.path.dirname(sys.executable), "cmake")
    found = here if os.access(here, os.X_OK) else shutil.which("cmake")
    if not found:
        raise RuntimeError("building _core_testing needs CMake: pip install cmake "
                           "(it comes with the test extra, '.[test]')")
    return found


def build_dir():
    mpicc = _mpicc()
    key = hashlib.sha1(f"{mpicc}\0{os.path.realpath(sys.executable)}".encode()).hexdigest()[:12]
    return os.path.join(REPO, "build", "core-testing", key)


def path():
    """Builds _core_testing if needed; returns the path of the module file."""
    import pybind11

    folder = build_dir()
    out = os.path.join(folder, "lib")
    os.makedirs(folder, exist_ok=True)
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 2)
    with open(os.path.join(folder, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(os.path.join(folder, "CMakeCache.txt")):
            _run([_cmake(), REPO, f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out}",
                  "-DCMAKE_BUILD_TYPE=Release", f"-DPython_EXECUTABLE={sys.executable}",
                  f"-Dpybind11_DIR={pybind11.get_cmake_dir()}", f"-DMPI_C_COMPILER={_mpicc()}",
                  "-DHVDCOMPAT_BUILD_TESTING=ON"], folder)
        _run([_cmake(), "--build", ".", "--target", NAME, "-j", jobs], folder)
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    found = [p for s in suffixes for p in glob.glob(os.path.join(out, NAME + s))]
    if not found:
        raise RuntimeError(f"CMake finished but no {NAME} module is in {out}")
    return found[0]


def _run(cmd, cwd):
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"building {NAME} failed ({' '.join(cmd)} in {cwd}):\n"
                           f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}")


def load():
    """The `_core_testing` module (built on first use)."""
    if NAME not in _loaded:
        spec = importlib.util.spec_from_file_location(NAME, path())
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _loaded[NAME] = module
    return _loaded[NAME]


def loader_code(var="T"):
    """Python source that binds `var` to the module in another interpreter (built here first)."""
    return (f"import importlib.util as _u\n"
            f"_s = _u.spec_from_file_location({NAME!r}, {path()!r})\n"
            f"{var} = _u.module_from_spec(_s)\n"
            f"_s.loader.exec_module({var})\n")
