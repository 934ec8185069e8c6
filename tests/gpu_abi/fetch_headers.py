"""Fetches the CUDA runtime and NCCL headers from NVIDIA's wheels into a cache folder.

The ABI checks (tests/unit/test_gpu_abi.py) compile our declarations in
third_party/ against the vendors' headers. A machine without a CUDA toolkit
gets those headers from wheels: the runtime (cuda_runtime_api.h), nvcc's or,
for CUDA 13, crt's (crt/, which cuda_runtime_api.h includes), CCCL
(nv/target) and NCCL (nccl.h), for CUDA 12 and CUDA 13. Only their include folders are kept (a few MB); the wheels
themselves (NCCL's is ~350 MB, the others ~50 MB together) are downloaded with
``pip download --no-deps`` into a temporary folder and deleted.

Usage: ``python tests/gpu_abi/fetch_headers.py [CACHE_DIR]`` prints the root
of the cached tree (``<root>/nvidia/<component>/include``). The versions are
pinned so the cache key is known before anything is downloaded.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

__all__ = ["WHEELS", "default_cache_dir", "fetch_headers"]

# (distribution, version, include subtree kept)
WHEELS = (
    ("nvidia-cuda-runtime-cu12", "12.9.79", "nvidia/cuda_runtime/include/"),
    ("nvidia-cuda-nvcc-cu12", "12.9.86", "nvidia/cuda_nvcc/include/crt/"),
    ("nvidia-cuda-cccl-cu12", "12.9.27", "nvidia/cuda_cccl/include/nv/"),
    ("nvidia-nccl-cu12", "2.32.3", "nvidia/nccl/include/"),
    # CUDA 13 wheels share one tree, nvidia/cu13/include (NCCL's header is the same file).
    ("nvidia-cuda-runtime", "13.5.37", "nvidia/cu13/include/"),
    ("nvidia-cuda-crt", "13.5.37", "nvidia/cu13/include/crt/"),
    ("nvidia-cuda-cccl", "13.3.5.0.6", "nvidia/cu13/include/nv/"),
)


def default_cache_dir():
    """``$HVDCOMPAT_GPU_HEADER_CACHE``, else ``~/.cache/hvdcompat/gpu-headers``."""
    env = os.environ.get("HVDCOMPAT_GPU_HEADER_CACHE")
    if env:
        return env
    return os.path.join(os.path.expanduser("~"), ".cache", "hvdcompat", "gpu-headers")


def _key():
    return "_".join(name.replace("nvidia-", "").replace("cuda-", "") + version
                    for name, version, _ in WHEELS)


def fetch_headers(cache_dir=None, timeout=600):
    """Returns the root holding ``nvidia/*/include``, downloading once per pinned set.

    Args:
        cache_dir: where cached trees live (default: :func:`default_cache_dir`).
        timeout: seconds allowed for ``pip download``.

    Raises:
        RuntimeError: pip could not download a wheel (offline, no index); the
            message carries pip's output.
    """
    cache_dir = cache_dir or default_cache_dir()
    root = os.path.join(cache_dir, _key())
    if os.path.exists(os.path.join(root, "complete")):
        return root
    os.makedirs(cache_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="hvdcompat-gpu-wheels-", dir=cache_dir)
    try:
        specs = [f"{name}=={version}" for name, version, _ in WHEELS]
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", work] + specs
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError("pip download of the NVIDIA header wheels failed:\n"
                               + r.stdout + r.stderr)
        staging = os.path.join(work, "tree")
        wheels = [f for f in os.listdir(work) if f.endswith(".whl")]
        for name, _, subtree in WHEELS:
            stem = name.replace("-", "_") + "-"
            match = [w for w in wheels if w.startswith(stem)]
            if not match:
                raise RuntimeError(f"pip download did not produce a {name} wheel: {wheels}")
            with zipfile.ZipFile(os.path.join(work, match[0])) as z:
                members = [m for m in z.namelist() if m.startswith(subtree)]
                if not members:
                    raise RuntimeError(f"{match[0]} has no {subtree}")
                z.extractall(staging, members)
        open(os.path.join(staging, "complete"), "w").close()
        shutil.rmtree(root, ignore_errors=True)
        os.replace(staging, root)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return root


if __name__ == "__main__":
    print(fetch_headers(sys.argv[1] if len(sys.argv) > 1 else None))
