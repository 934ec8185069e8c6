import contextlib
import os
import sys

# The launcher helpers (harness.py) live beside the tests.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


import pytest  # noqa: E402

import harness  # noqa: E402

# Tests that showed launch lines; their own progress dot is left out (the lines say more).
_showed_lines = set()
_current = {"nodeid": None}


def pytest_configure(config):
    def write(line):
        """Shows `line` on the terminal now, even while pytest captures the test's output."""
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        capture = config.pluginmanager.get_plugin("capturemanager")
        paused = capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()
        with paused:
            # Under -q the dots share a line; start a fresh one.
            if getattr(getattr(reporter, "_tw", None), "width_of_current_line", 0):
                reporter.write("\n")
            reporter.write_line(line)
            reporter.flush()
        if _current["nodeid"]:
            _showed_lines.add(_current["nodeid"])

    harness.set_progress_writer(write)


def pytest_unconfigure(config):
    harness.set_progress_writer(None)


def pytest_runtest_logstart(nodeid, location):
    _current["nodeid"] = nodeid


def pytest_runtest_logfinish(nodeid, location):
    _current["nodeid"] = None


def pytest_report_teststatus(report, config):
    # A passing test that showed launch lines prints no dot under -q: a dot on
    # a line of its own between the launch lines would only add noise.
    if (report.when == "call" and report.passed and report.nodeid in _showed_lines
            and config.get_verbosity() <= 0):
        return "passed", "", "PASSED"
    return None


@pytest.fixture(scope="session")
def fake_gpu_lib(tmp_path_factory):
    """Path of the host-only fake libcudart+libnccl (tests/gpu_fake), built once."""
    from gpu_fake.build import build_fake_gpu

    path = build_fake_gpu(tmp_path_factory.mktemp("fakegpu"))
    if path is None:
        pytest.skip("no C++ compiler to build the fake CUDA/NCCL library")
    return path
