"""Our CUDA runtime / NCCL declarations (third_party/) against the vendors' headers and libraries.

The header checks compile tests/gpu_abi/*.cc (static_asserts on enum values,
struct sizes and every function type) against the vendors' headers, found in
this order: ``HVDCOMPAT_TEST_GPU_WHEELS`` (a ``pip install --target`` folder
of the NVIDIA wheels), the header cache of tests/gpu_abi/fetch_headers.py
(filled on first use unless ``HVDCOMPAT_TEST_GPU_HEADERS=off``; a header
that cannot be had is then a failure, not a skip), the installed
``nvidia.*`` packages, a CUDA toolkit. The library check loads real
libcudart/libnccl when their wheels are present (CUDA 12 and CUDA 13
layouts).
"""

import glob
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

import core_testing
from harness import REPO, mpi_env

ABI_DIR = os.path.join(REPO, "tests", "gpu_abi")
# Fetching is the default (the README's test command and CI check the real
# headers); HVDCOMPAT_TEST_GPU_HEADERS=off skips what no local header covers.
FETCH = os.environ.get("HVDCOMPAT_TEST_GPU_HEADERS", "fetch") == "fetch"
# CUDA 12 wheels install nvidia/cuda_runtime/, CUDA 13 ones nvidia/cu13/.
RUNTIME_COMPONENTS = ("cuda_runtime", "cu13")
_header_root = []


def _cached_headers():
    """The header cache's root ('' when absent and not asked to fetch)."""
    if not _header_root:
        sys.path.insert(0, ABI_DIR)
        try:
            import fetch_headers
        finally:
            sys.path.remove(ABI_DIR)
        root = os.path.join(fetch_headers.default_cache_dir(), fetch_headers._key())
        if FETCH:
            root = fetch_headers.fetch_headers()
        _header_root.append(root if os.path.exists(os.path.join(root, "complete")) else "")
    return _header_root[0]


def _nvidia_roots(headers=False):
    roots = []
    if os.environ.get("HVDCOMPAT_TEST_GPU_WHEELS"):
        roots.append(os.path.join(os.environ["HVDCOMPAT_TEST_GPU_WHEELS"], "nvidia"))
    if headers and _cached_headers():
        roots.append(os.path.join(_cached_headers(), "nvidia"))
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        roots += list(spec.submodule_search_locations or [])
    return roots


def _include_dirs(components, header, system):
    dirs = [os.path.join(root, c, "include") for root in _nvidia_roots(headers=True)
            for c in components]
    dirs += system
    return [d for d in dirs if os.path.exists(os.path.join(d, header))]


def _cuda_includes():
    """cuda_runtime_api.h plus what it includes: crt/ (nvcc's wheel) and nv/target (CCCL's)."""
    found = _include_dirs(RUNTIME_COMPONENTS, "cuda_runtime_api.h",
                          ["/usr/local/cuda/include", "/usr/include"])
    if not found:
        return []
    extra = []
    for component, probe in (("cuda_nvcc", "crt"), ("cuda_cccl", "nv")):
        if os.path.exists(os.path.join(found[0], probe)):
            continue  # a toolkit's (or CUDA 13's) include folder has it already
        extra += _include_dirs([component], probe, ["/usr/local/cuda/include"])[:1]
    return found[:1] + extra


def _compile(source, includes):
    cxx = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    cmd = [cxx, "-std=c++17", "-fsyntax-only", "-I", os.path.join(REPO, "third_party"),
           "-I", ABI_DIR] + [f"-I{d}" for d in includes] + [os.path.join(ABI_DIR, source)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, "declarations differ from the vendor header:\n" + r.stderr


def test_cuda_runtime_declarations_match_the_toolkit_header():
    includes = _cuda_includes()
    assert includes or not FETCH, "HVDCOMPAT_TEST_GPU_HEADERS=fetch, yet no cuda_runtime_api.h"
    if not includes:
        pytest.skip("no cuda_runtime_api.h here (set HVDCOMPAT_TEST_GPU_WHEELS)")
    _compile("check_cuda_abi.cc", includes)


def test_cuda_runtime_declarations_match_the_cuda13_headers():
    root = _cached_headers()
    include = os.path.join(root, "nvidia", "cu13", "include") if root else ""
    found = include and os.path.exists(os.path.join(include, "cuda_runtime_api.h"))
    assert found or not FETCH, "HVDCOMPAT_TEST_GPU_HEADERS=fetch, yet no CUDA 13 headers"
    if not found:
        pytest.skip("no CUDA 13 headers cached (HVDCOMPAT_TEST_GPU_HEADERS=fetch fetches them)")
    _compile("check_cuda_abi.cc", [include])


def test_nccl_declarations_match_nccl_h():
    nccl = _include_dirs(["nccl"], "nccl.h", ["/usr/include", "/usr/local/include"])
    cuda = _cuda_includes()
    assert (nccl and cuda) or not FETCH, "HVDCOMPAT_TEST_GPU_HEADERS=fetch, yet no nccl.h"
    if not nccl or not cuda:
        pytest.skip("no nccl.h (and cuda_runtime_api.h) here (set HVDCOMPAT_TEST_GPU_WHEELS)")
    _compile("check_nccl_abi.cc", nccl[:1] + cuda)


def _libs(component, pattern):
    out = []
    for root in _nvidia_roots():
        out += sorted(glob.glob(os.path.join(root, component, "lib", pattern)))
    return out


def test_the_real_libraries_load_with_every_required_symbol():
    cudart = _libs("cuda_runtime", "libcudart.so.*") + _libs("cu13", "libcudart.so.*")
    nccl = _libs("nccl", "libnccl.so.*")
    if not cudart or not nccl:
        pytest.skip("no NCCL/CUDA runtime wheels here (set HVDCOMPAT_TEST_GPU_WHEELS)")
    env = mpi_env()
    env.pop("HVDCOMPAT_NCCL_LIB", None)
    env.pop("HVDCOMPAT_CUDART_LIB", None)
    code = (core_testing.loader_code("T") +
            f"info = T.load_gpu_libraries({cudart[:1]!r}, {nccl[:1]!r})\n"
            "assert info['cuda_loaded'] and info['nccl_loaded'], info\n"
            "assert info['nccl_version'] > 20700 and info['cuda_runtime_version'] > 11000, info\n"
            "print(info['nccl_version_string'])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().count(".") == 2
