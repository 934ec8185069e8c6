import contextlib
import os
import sys
import time

# The launcher helpers (harness.py) live beside the tests.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


import pytest  # noqa: E402

import harness  # noqa: E402

# Progress lines in the terminal, beside pytest's own: one per launch of
# several ranks (harness.report_launch, at every verbosity) and, under -q, one
# per test file as it ends (outcomes and seconds), so a session of many
# minutes says where it is. Tests that showed launch lines print no dot.
_showed_lines = set()
_current = {"nodeid": None}
_file = {"counts": {}, "start": None}


def _show(config, line):
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


def pytest_configure(config):
    def write(line):
        _show(config, line)
        if _current["nodeid"]:
            _showed_lines.add(_current["nodeid"])

    harness.set_progress_writer(write)


def pytest_terminal_summary(terminalreporter):
    # Every rerun of a launch is listed: only an MPI launcher that failed to
    # start before any rank ran is rerun (harness.run_ranks).
    retries = harness.LAUNCHER_RETRIES
    terminalreporter.write_line(f"MPI launcher start-up retries: {len(retries)}")
    for line in retries:
        terminalreporter.write_line("  " + line)
    removed = harness.SESSION_DIRS_REMOVED
    terminalreporter.write_line("Open MPI session directories left by killed launchers, "
                                f"removed after their test: {len(removed)}")
    for test_id, path in removed:
        terminalreporter.write_line(f"  {path} ({test_id})")


def pytest_unconfigure(config):
    harness.set_progress_writer(None)


def pytest_runtest_logstart(nodeid, location):
    _current["nodeid"] = nodeid
    if _file["start"] is None:
        _file["start"] = time.monotonic()


def pytest_runtest_logfinish(nodeid, location):
    _current["nodeid"] = None


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":  # a setup error or skip counts too
        outcome = "error" if report.failed and report.when != "call" else report.outcome
        _file["counts"][outcome] = _file["counts"].get(outcome, 0) + 1


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    yield
    if nextitem is None or nextitem.path != item.path:
        if item.config.option.verbose < 0 and _file["counts"]:
            counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(_file["counts"].items()))
            _show(item.config, f"{item.nodeid.split('::')[0]}: {counts} "
                               f"({time.monotonic() - _file['start']:.1f} s)")
        _file["counts"], _file["start"] = {}, None


def pytest_report_teststatus(report, config):
    # A passing test that showed launch lines prints no dot under -q: a dot on
    # a line of its own between the launch lines would only add noise.
    if (report.when == "call" and report.passed and report.nodeid in _showed_lines
            and config.option.verbose <= 0):
        return "passed", "", "PASSED"
    return None


@pytest.fixture(autouse=True)
def _session_dirs_removed(request):
    # What a test's killed launchers leave, the test removes (harness.py).
    before = harness.session_dirs()
    yield
    harness.remove_left_session_dirs(before, request.node.nodeid)


@pytest.fixture(scope="session")
def fake_gpu_lib(tmp_path_factory):
    """Path of the host-only fake libcudart+libnccl (tests/gpu_fake), built once."""
    from gpu_fake.build import build_fake_gpu

    path = build_fake_gpu(tmp_path_factory.mktemp("fakegpu"))
    if path is None:
        pytest.skip("no C++ compiler to build the fake CUDA/NCCL library")
    return path
