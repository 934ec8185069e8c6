import os
import sys

# The launcher helpers (harness.py) live beside the tests.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def fake_gpu_lib(tmp_path_factory):
    """Path of the host-only fake libcudart+libnccl (tests/gpu_fake), built once."""
    from gpu_fake.build import build_fake_gpu

    path = build_fake_gpu(tmp_path_factory.mktemp("fakegpu"))
    if path is None:
        pytest.skip("no C++ compiler to build the fake CUDA/NCCL library")
    return path
