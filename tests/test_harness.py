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
