"""The parallel-test launcher turns failures and hangs into prompt, explained failures."""

import time

import pytest

from harness import run_pytest_ranks


def test_failing_rank_aborts_the_job_and_shows_every_rank():
    start = time.monotonic()
    with pytest.raises(AssertionError) as info:
        run_pytest_ranks(2, "tests/harness_cases/test_deliberate_failure.py", timeout=120)
    # The abort ends the job long before the timeout.
    assert time.monotonic() - start < 60
    message = str(info.value)
    assert "exited with code" in message
    assert "deliberate failure on rank 1" in message
    assert "rank 0 reached the test" in message and "rank 1 reached the test" in message
    assert "rank 1: aborting the job" in message


def test_hang_becomes_a_timeout_with_stacks_of_every_rank():
    with pytest.raises(AssertionError) as info:
        run_pytest_ranks(2, "tests/harness_cases/test_deliberate_hang.py", timeout=15)
    message = str(info.value)
    assert "timed out after 15 s" in message
    assert "rank 0 reached the test" in message and "rank 1 reached the test" in message
    # faulthandler's dump from both ranks: rank 1 sleeps, rank 0 waits in synchronize.
    assert message.count("test_deliberate_hang.py\", line") >= 2, message


def test_only_a_launcher_that_failed_before_any_rank_ran_is_retried_and_each_retry_counted(
        monkeypatch):
    import harness

    startup = "PMIx server's listener thread failed to start"
    results = [harness.LaunchResult(1, f"mpirun: {startup}\n", 0.1, False, "mpirun"),
               harness.LaunchResult(0, "[1,0]<stdout>: ok\n", 0.1, False, "mpirun"),
               # A rank ran and failed: the same text must not earn a rerun.
               harness.LaunchResult(1, f"[1,1]<stderr>: boom\n{startup}\n", 0.1, False, "mpirun")]
    calls, shown = [], []
    monkeypatch.setattr(harness, "_launch", lambda *a: (calls.append(a), results.pop(0))[1])
    monkeypatch.setattr(harness, "LAUNCHER_RETRIES", [])
    monkeypatch.setattr(harness, "_progress_writer", shown.append)
    assert harness.run_ranks(2, ["python", "x.py"], timeout=5).returncode == 0
    assert len(calls) == 2 and len(harness.LAUNCHER_RETRIES) == 1
    assert (f"[mpirun -np 2] python x.py: the MPI launcher failed to start before any rank ran "
            f"({startup!r}); retrying, attempt 2 of 3") in shown
    with pytest.raises(AssertionError, match="boom"):
        harness.run_ranks(2, ["python", "x.py"], timeout=5)
    assert len(calls) == 3 and len(harness.LAUNCHER_RETRIES) == 1
