"""The files of elastic training: the ranks' notices to the driver and the restart state.

Without communication: the world is faked (rank patched, collectives replaced
by what they return on the ranks played here).
"""

import io
import os

import pytest
import torch

from hvdcompat.elastic import ObjectState
from hvdcompat.elastic import loop as loop_mod
from hvdcompat.runner.elastic.driver import EXIT_ELASTIC_STOP
from hvdcompat.runner.elastic.mpi_driver import MpiElasticDriver
from hvdcompat.runner.hosts import Host


@pytest.fixture
def rank0(tmp_path, monkeypatch):
    """Rank 0 of 2 in an elastic launch whose driver's directory is tmp_path."""
    monkeypatch.setenv("HVDCOMPAT_ELASTIC_DIR", str(tmp_path))
    monkeypatch.setenv("HVDCOMPAT_ELASTIC_HOST", "hostA")
    monkeypatch.delenv("HVDCOMPAT_ELASTIC_RESET_LIMIT", raising=False)
    monkeypatch.setattr(loop_mod.basics, "rank", lambda: 0)
    monkeypatch.setattr(loop_mod.basics, "size", lambda: 2)
    monkeypatch.setattr(loop_mod.basics, "_exit_as_failed_rank", lambda: None)
    monkeypatch.setattr(loop_mod, "_NOTICE_RETRY_PAUSES", (0.0, 0.0), raising=False)
    monkeypatch.setattr("hvdcompat.functions.broadcast_object", lambda obj, **kw: obj)
    # Rank 1 (host hostB) sees the directory as rank 0 does.
    monkeypatch.setattr("hvdcompat.functions.allgather_object",
                        lambda obj, **kw: [obj, (obj[0], obj[1], "hostB")])
    (tmp_path / "driver").write_text("1\n")
    return tmp_path


def _state():
    return ObjectState(bcast_object=lambda obj: obj, get_rank=lambda: 0, epoch=0, batch=0)


def _flaky_open(failures):
    """open() whose first `failures` writes fail with EIO (reads work)."""
    calls = []

    def fake(path, mode="r", *args, **kwargs):
        if "w" not in mode and "a" not in mode:
            return open(path, mode, *args, **kwargs)
        calls.append(path)
        if len(calls) <= failures:
            raise OSError(5, "Input/output error", path)
        return open(path, mode, *args, **kwargs)
    return fake, calls


def test_a_transient_write_failure_of_a_notice_is_retried(rank0, monkeypatch):
    fake, calls = _flaky_open(2)
    monkeypatch.setattr(loop_mod, "open", fake, raising=False)
    assert loop_mod._report_lost([0, 1, 2], [0, 2]) == [0, 2]
    assert len(calls) == 3  # two failures, then written
    assert (rank0 / "lost").read_text().split()[1] == "1"
    fake, calls = _flaky_open(1)
    monkeypatch.setattr(loop_mod, "open", fake, raising=False)
    loop_mod._mark_finished()
    assert (rank0 / "finished.0").read_text() == "2\n" and len(calls) == 2


def test_a_lasting_write_failure_is_logged_and_the_rank_trains_on(rank0, monkeypatch, capsys):
    fake, calls = _flaky_open(100)
    monkeypatch.setattr(loop_mod, "open", fake, raising=False)
    assert loop_mod._report_lost([0, 1, 2], [0, 2]) == [0, 2]
    err = capsys.readouterr().err
    assert f"hvdcompat: rank 0 on host hostA could not write {rank0 / 'lost'}" in err, err
    assert "after 3 tries; hvdcompatrun will not blacklist the hosts of lost rank(s) 1" in err
    loop_mod._mark_finished()
    assert "exit code will be mpirun's" in capsys.readouterr().err
    assert len(calls) == 6 and not (rank0 / "lost").exists()
    # The whole loop: training finishes although its mark cannot be written.
    assert loop_mod.run_fn(lambda state: "done", lambda: [0, 1])(_state()) == "done"


@pytest.mark.parametrize("case", ["missing", "another file system"])
def test_a_rank_that_cannot_use_the_directory_stops_every_rank_at_the_start(rank0, monkeypatch,
                                                                           case):
    if case == "missing":
        monkeypatch.setenv("HVDCOMPAT_ELASTIC_DIR", str(rank0 / "not-here"))
        where, why = "rank 0 on host hostA", "it does not exist on this host"
    else:  # rank 1's host has a directory of that name, not the driver's
        monkeypatch.setattr("hvdcompat.functions.allgather_object",
                            lambda obj, **kw: [obj, (None, False, "hostB")])
        where, why = "rank 1 on host hostB", "hvdcompatrun's mark is not there"
    ran = []
    with pytest.raises(RuntimeError) as info:
        loop_mod.run_fn(lambda state: ran.append(1), lambda: [0, 1])(_state())
    msg = str(info.value)
    assert msg.startswith("hvd.elastic.run: HVDCOMPAT_ELASTIC_DIR=") and "not usable" in msg
    assert f"{where}: {why}" in msg, msg
    assert "every host shares with the machine running hvdcompatrun" in msg, msg
    assert not ran


def _save_restart(directory, state, resets, saved_at):
    torch.save({"state": state.saved_values(),
                "meta": {"resets": resets, "hosts_updated_at": 1.0, "saved_at": saved_at,
                         "size": 2}}, os.path.join(directory, "restart.pt"))


def test_a_restart_continues_from_the_saved_state_and_reset_count(rank0):
    old = _state()
    old.epoch, old.batch = 3, 7
    old.save()
    _save_restart(rank0, old, 4, 123.5)
    (rank0 / "restart.expected").write_text("123.500000\n")
    new = _state()
    seen = []
    loop_mod.run_fn(lambda state: seen.append((state.epoch, state.batch)), lambda: [0, 1])(new)
    assert seen == [(3, 7)] and loop_mod.last_restart()["resets"] == 4


@pytest.mark.parametrize("case", ["the writer's host is gone", "an older state"])
def test_a_restart_that_finds_no_saved_state_fails_loudly(rank0, case):
    (rank0 / "restart.expected").write_text("123.500000\n")
    if case == "an older state":
        _save_restart(rank0, _state(), 1, 99.0)
    ran = []
    with pytest.raises(RuntimeError) as info:
        loop_mod.run_fn(lambda state: ran.append(1), lambda: [0, 1])(_state())
    msg = str(info.value)
    assert ("the job was restarted on new hosts to continue from its last commit, but rank 0 "
            "(host hostA) cannot read the saved state") in msg, msg
    assert ("restart.pt is missing" if case.startswith("the writer") else
            "was saved at 99.000000, not at 123.500000") in msg, msg
    assert "The job stops rather than train again from the initial state" in msg
    assert not ran  # never from scratch


def _args():
    from hvdcompat.runner import launch

    parser = launch.build_parser()
    options, _ = launch.split_command(parser, ["-np", "2", "--min-np", "1", "python", "t.py"])
    return parser.parse_args(options)


@pytest.mark.parametrize("state_left", [True, False])
def test_the_driver_relaunches_only_with_the_saved_state_and_says_it_expects_it(
        tmp_path, monkeypatch, state_left):
    monkeypatch.setenv("HVDCOMPAT_ELASTIC_DIR", str(tmp_path))
    out = io.StringIO()
    launches = []
    with MpiElasticDriver(_args(), out=out) as driver:
        assert open(os.path.join(driver.dir, "driver")).read().strip() == str(os.getpid())
        monkeypatch.setattr(driver, "next_hosts", lambda: [Host("hostB", 1), Host("hostC", 1)])

        def run(cmd, env, placement, np, abort, summarize):
            launches.append(os.path.exists(os.path.join(driver.dir, "restart.expected")) and
                            open(os.path.join(driver.dir, "restart.expected")).read())
            if len(launches) == 1:  # rank 0 (on the host then removed) asks for a restart
                if state_left:
                    open(os.path.join(driver.dir, "restart.pt"), "w").close()
                with open(os.path.join(driver.dir, "restart"), "w") as f:
                    f.write("1700000000.250000\n")
                return 75
            for r in range(2):
                with open(os.path.join(driver.dir, f"finished.{r}"), "w") as f:
                    f.write("2\n")
            return 0

        code = driver.supervise(lambda env, hosts=None: (["mpirun"], env), run)
    log = out.getvalue()
    if state_left:
        assert code == 0 and launches == [False, "1700000000.250000\n"], log
        assert "restarting the job from its last commit on hostB:1, hostC:1" in log
    else:
        assert code == EXIT_ELASTIC_STOP and launches == [False], log
        assert ("rank 0 asked for a restart on new hosts (its mark of 1700000000.250000), but "
                "its saved state") in log and "restart.pt is not there; the job stops" in log
        assert "restarting" not in log
