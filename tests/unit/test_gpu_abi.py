"""Our CUDA runtime / NCCL declarations (third_party/) against the vendors' headers and libraries.

Runs what this machine allows: the header checks compile tests/gpu_abi/*.cc
(static_asserts on enum values, struct sizes and every function type) when a
toolkit header is found; the library check loads real libcudart/libnccl when
present. Point HVDCOMPAT_TEST_GPU_WHEELS at a directory made with
``pip install --target DIR nvidia-nccl-cu12 nvidia-cuda-runtime-cu12`` to run
them all on a machine without CUDA.
"""

import glob
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

from harness import REPO, mpi_env

ABI_DIR = os.path.join(REPO, "tests", "gpu_abi")


def _nvidia_roots():
    roots = []
    if os.environ.get("HVDCOMPAT_TEST_GPU_WHEELS"):
        roots.append(os.path.join(os.environ["HVDCOMPAT_TEST_GPU_WHEELS"], "nvidia"))
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        roots += list(spec.submodule_search_locations or [])
    return roots


def _include_dirs(component, header, system):
    dirs = [os.path.join(root, component, "include") for root in _nvidia_roots()]
    dirs += system
    return [d for d in dirs if os.path.exists(os.path.join(d, header))]


def _cuda_includes():
    found = _include_dirs("cuda_runtime", "cuda_runtime_api.h",
                          ["/usr/local/cuda/include", "/usr/include"])
    # A wheel's headers lack crt/; a toolkit's provide it.
    crt = [d for d in ["/usr/local/cuda/include"] if os.path.isdir(os.path.join(d, "crt"))]
    return (found[:1] + crt) if found else []


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
    if not includes:
        pytest.skip("no cuda_runtime_api.h here (set HVDCOMPAT_TEST_GPU_WHEELS)")
    _compile("check_cuda_abi.cc", includes)


def test_nccl_declarations_match_nccl_h():
    nccl = _include_dirs("nccl", "nccl.h", ["/usr/include", "/usr/local/include"])
    cuda = _cuda_includes()
    if not nccl or not cuda:
        pytest.skip("no nccl.h (and cuda_runtime_api.h) here (set HVDCOMPAT_TEST_GPU_WHEELS)")
    _compile("check_nccl_abi.cc", nccl[:1] + cuda)


def _libs(component, pattern):
    out = []
    for root in _nvidia_roots():
        out += sorted(glob.glob(os.path.join(root, component, "lib", pattern)))
    return out


def test_the_real_libraries_load_with_every_required_symbol():
    cudart, nccl = _libs("cuda_runtime", "libcudart.so.*"), _libs("nccl", "libnccl.so.*")
    if not cudart or not nccl:
        pytest.skip("no NCCL/CUDA runtime wheels here (set HVDCOMPAT_TEST_GPU_WHEELS)")
    env = mpi_env()
    env.pop("HVDCOMPAT_NCCL_LIB", None)
    env.pop("HVDCOMPAT_CUDART_LIB", None)
    code = ("import hvdcompat.basics as b\n"
            f"info = b._core.testing.load_gpu_libraries({cudart[:1]!r}, {nccl[:1]!r})\n"
            "assert info['cuda_loaded'] and info['nccl_loaded'], info\n"
            "assert info['nccl_version'] > 20700 and info['cuda_runtime_version'] > 11000, info\n"
            "print(info['nccl_version_string'])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().count(".") == 2
