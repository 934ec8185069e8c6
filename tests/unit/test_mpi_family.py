"""Which MPI: mpi4py on another library than the core, and the libmpi preload by soname."""

import pytest

import hvdcompat as hvd
from hvdcompat import _ext, basics


class _OtherMpi:
    @staticmethod
    def Get_library_version():
        return "Some Other MPI 9.9\nrelease notes\x00"


class _SameMpi:
    @staticmethod
    def Get_library_version():
        # As mpi4py returns it: the core's string, perhaps with the C terminator.
        return hvd.build_info()["mpi_library"] + "\x00"


def test_mpi4py_on_another_mpi_is_named_with_both_libraries():
    ours = " ".join(hvd.build_info()["mpi_library"].splitlines()[0].split())
    with pytest.raises(ValueError) as info:
        basics._check_same_mpi(_OtherMpi, "hvd.init(comm=...)")
    text = str(info.value)
    assert "hvd.init(comm=...)" in text and "Some Other MPI 9.9" in text and ours in text
    assert "MPICC=" in text


def test_mpi4py_on_the_same_mpi_passes():
    basics._check_same_mpi(_SameMpi, "hvd.init(comm=...)")


def test_preload_looks_only_for_the_missing_soname():
    # No MPI wheel holds this soname, and a message without one preloads nothing.
    assert _ext._preload_wheel_mpi("libmpi.so.999: cannot open shared object file") is False
    assert _ext._preload_wheel_mpi("undefined symbol: foo") is False
