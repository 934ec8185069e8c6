"""Fixtures for tests that need several hosts: test hosts made of namespaces."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from testhosts import HostCluster, unavailable_reason  # noqa: E402

_REASON = unavailable_reason()


def need_test_hosts():
    """Skips the calling test when test hosts cannot be made here, saying why."""
    if _REASON:
        pytest.skip(f"multi-host tests skipped: {_REASON}")


@pytest.fixture(scope="session")
def cluster():
    """Two test hosts for the session (torn down at its end, also on failure)."""
    need_test_hosts()
    with HostCluster(2) as c:
        yield c


@pytest.fixture
def fresh_cluster():
    """Two test hosts of this test's own (links may be cut or limited)."""
    need_test_hosts()
    with HostCluster(2) as c:
        yield c
