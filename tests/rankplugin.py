"""pytest plugin loaded (``-p rankplugin``) inside every rank of a parallel test run.

hvd.init() happens once per rank; a failing test prints its report and
aborts the whole job so the other ranks cannot hang waiting for it; SIGUSR1
dumps every thread's stack (the launcher sends it on timeout).
"""

import faulthandler
import os
import signal
import sys

import pytest

faulthandler.register(signal.SIGUSR1, all_threads=True)
if os.environ.get("HVDCOMPAT_TEST_PIDDIR"):
    open(os.path.join(os.environ["HVDCOMPAT_TEST_PIDDIR"], str(os.getpid())), "w").close()

import hvdcompat as hvd  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def hvd_session():
    hvd.init()
    if os.environ.get("HVDCOMPAT_TEST_CONTROLLER") == "gloo":
        # Launched to run on the Gloo controller: it must (not MPI, as a one-rank job).
        assert hvd.gloo_enabled() and not hvd.mpi_enabled() and hvd.size() > 1, (
            "expected the Gloo controller", hvd.gloo_enabled(), hvd.size())
    yield
    hvd.shutdown()


def pytest_runtest_logreport(report):
    if report.failed:
        rank = hvd.rank() if hvd.is_initialized() else "?"
        sys.stderr.write(f"\n===== rank {rank}: {report.nodeid} FAILED ({report.when}) =====\n"
                         f"{report.longreprtext}\n===== rank {rank}: aborting the job =====\n")
        sys.stderr.flush()
        sys.stdout.flush()
        hvd.basics._core.abort(1)
