"""Whether CUDA tensors can run through hvdcompat on this machine.

This build's core runs host (CPU) tensors only; both queries answer for it.
"""

__all__ = ["nccl_version", "cuda_available"]


def nccl_version():
    """NCCL version code the core can use, or 0."""
    return 0


def cuda_available():
    """Whether the core can run collectives on CUDA tensors."""
    return False
