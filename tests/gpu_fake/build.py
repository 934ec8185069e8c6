"""Builds the fake CUDA runtime + NCCL (tests/gpu_fake/*.cc) into one shared library."""

import os
import shutil
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

__all__ = ["build_fake_gpu"]


def build_fake_gpu(out_dir):
    """Compiles the fake CUDA runtime + NCCL into `out_dir`; returns its path, or None
    when no C++ compiler is available."""
    cxx = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if cxx is None:
        return None
    out = os.path.join(str(out_dir), "libfakegpu.so")
    sources = [os.path.join(HERE, f) for f in ("fake_cudart.cc", "fake_nccl.cc")]
    subprocess.run([cxx, "-std=c++17", "-O1", "-shared", "-fPIC", "-pthread", "-Wall", "-I",
                    os.path.join(REPO, "third_party"), *sources, "-o", out],
                   check=True, capture_output=True, text=True, timeout=300)
    return out
