"""hvdcompatrun's failure line: rank supervisor reports, the output relay, the summary."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

from hvdcompat.runner import exit_report
from hvdcompat.runner.hosts import Host
from hvdcompat.runner.rank_supervisor import MARKER

SUPERVISOR = os.path.join(os.path.dirname(exit_report.__file__), "rank_supervisor.py")


def _supervise(code, env=None):
    return subprocess.run([sys.executable, SUPERVISOR, sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OMPI_COMM_WORLD_RANK": "3", **(env or {})})


def test_supervisor_passes_the_status_through_and_reports_how_the_rank_ended():
    ok = _supervise("print('hi')")
    assert ok.returncode == 0 and ok.stdout == "hi\n"
    assert json.loads(ok.stderr.split(MARKER, 1)[1])["status"] == 0
    failed = _supervise("import sys; sys.exit(7)")
    assert failed.returncode == 7
    line = [l for l in failed.stderr.splitlines() if l.startswith(MARKER)]
    report = json.loads(line[0][len(MARKER):])
    assert report["rank"] == 3 and report["status"] == 7 and report["signal"] is None


def test_supervisor_gives_the_rank_horovods_place_variables():
    show = ("import json, os; print(json.dumps({k: os.environ.get(k) for k in "
            "('HOROVOD_RANK', 'HOROVOD_SIZE', 'HOROVOD_LOCAL_RANK', 'HOROVOD_LOCAL_SIZE', "
            "'HOROVOD_HOSTNAME')}))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    base = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "HVDCOMPAT_ELASTIC_HOST": "node7"}
    r = subprocess.run([sys.executable, SUPERVISOR, sys.executable, "-c", show],
                       capture_output=True, text=True, timeout=60,
                       env={**env, "OMPI_COMM_WORLD_RANK": "3", **base})
    assert json.loads(r.stdout) == {"HOROVOD_RANK": "3", "HOROVOD_SIZE": "4",
                                    "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2",
                                    "HOROVOD_HOSTNAME": "node7"}
    # What the launching environment already says is kept.
    r = subprocess.run([sys.executable, SUPERVISOR, sys.executable, "-c", show],
                       capture_output=True, text=True, timeout=60,
                       env={**env, "OMPI_COMM_WORLD_RANK": "3", **base, "HOROVOD_RANK": "9"})
    assert json.loads(r.stdout)["HOROVOD_RANK"] == "9"


def test_supervisor_dies_of_the_ranks_signal_and_forwards_signals():
    killed = _supervise("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert killed.returncode == -signal.SIGKILL
    report = json.loads(killed.stderr.split(MARKER, 1)[1].splitlines()[0])
    assert report["signal"] == signal.SIGKILL and report["status"] is None
    proc = subprocess.Popen([sys.executable, SUPERVISOR, sys.executable, "-c",
                             "import signal, sys, time\n"
                             "signal.signal(signal.SIGTERM, lambda *a: sys.exit(5))\n"
                             "print('ready', flush=True)\ntime.sleep(60)"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 5  # the rank's own handler ran


def _relay(chunks):
    r, w = os.pipe()
    out_r, out_w = os.pipe()
    relay = exit_report.OutputRelay([(os.fdopen(r, "rb"), out_w)])
    for c in chunks:
        os.write(w, c)
    os.close(w)
    relay.join(timeout=10)
    os.close(out_w)
    with os.fdopen(out_r, "rb") as f:
        return relay, f.read()


def test_relay_removes_reports_even_when_split_across_reads():
    report = MARKER.encode() + json.dumps({"rank": 2, "host": "n2", "time": 1.0,
                                           "status": 7, "signal": None}).encode() + b"\n"
    relay, out = _relay([b"before\npartial line", b" done\n", report[:10], report[10:],
                         b"after\n"])
    assert out == b"before\npartial line done\nafter\n"
    assert relay.reports == [{"rank": 2, "host": "n2", "time": 1.0, "status": 7,
                              "signal": None}]


def test_relay_notices_a_lost_host():
    relay, out = _relay([b"PRTE has lost communication with a remote daemon.\n"
                         b"  HNP daemon   : [prterun-n1-1@0,0] on node n1\n"
                         b"  Remote daemon: [prterun-n1-1@0,1] on node n2\n"])
    assert b"Remote daemon" in out and relay.lost_hosts[-1] == "n2"


def test_summary_names_the_earliest_failure():
    reports = [{"rank": 0, "host": "n1", "time": 5.2, "status": 14, "signal": None},
               {"rank": 3, "host": "n2", "time": 5.0, "status": 7, "signal": None},
               {"rank": 2, "host": "n2", "time": 5.1, "status": None, "signal": 9}]
    line = exit_report.summary(7, reports, [])
    assert line.startswith("hvdcompatrun: rank 3 on host n2 exited with status 7, the first")
    assert "2 other rank(s)" in line
    killed = exit_report.summary(137, reports[2:], [])
    assert "rank 2 on host n2 was killed by signal 9 (SIGKILL)" in killed
    assert exit_report.summary(0, reports, []) is None


def test_summary_names_a_lost_host_and_its_ranks():
    placement = exit_report.expected_placement([Host("n1", 2), Host("n2", 2)], 4)
    assert placement == {"n1": [0, 1], "n2": [2, 3]}
    line = exit_report.summary(1, [], ["n2"], placement)
    assert "lost contact with host n2 (rank(s) 2, 3)" in line
    assert exit_report.expected_placement([Host("a", 2), Host("b", 2)], 3) == {"a": [0, 1],
                                                                               "b": [2]}


def test_engine_error_names_lost_ranks_and_survivors_done_waits_for_the_others():
    line = (b"[hvdcompat rank 0] ERROR: rank(s) 3 on host n2 (which also runs rank(s) 2) failed "
            b"(the process exited, was killed, or lost its connection)\n")
    relay, _ = _relay([line])
    assert relay.lost_hosts == ["n2"] and relay.lost_ranks == {2, 3}
    assert not relay.survivors_done(4)  # ranks 0 and 1 still run
    relay.reports = [{"rank": 0, "status": 0}, {"rank": 1, "status": 0}]
    assert relay.survivors_done(4)
    assert exit_report.first_failure_code(relay.reports) == 0
    relay.reports.append({"rank": 1, "status": None, "signal": 9, "time": 0})
    assert exit_report.first_failure_code(relay.reports) == 137


def test_with_the_secret_lost_ranks_come_only_as_the_engines_reports():
    token = "7a" * 16
    genuine = exit_report.report_marker(token)
    printed = (b"[hvdcompat rank 0] ERROR: rank(s) 3 on host n2 (which also runs rank(s) 2) "
               b"failed (the process exited, was killed, or lost its connection)\n")
    r, w = os.pipe()
    out_r, out_w = os.pipe()
    relay = exit_report.OutputRelay([(os.fdopen(r, "rb"), out_w)], token=token)
    os.write(w, printed)  # a rank's output (or a copy of the engine's log line): no loss
    time.sleep(0.2)
    assert relay.lost_hosts == [] and relay.lost_ranks == set()
    report = {"kind": "lost", "rank": 0, "ranks": [3], "hosts": ["n2"]}
    os.write(w, (genuine + json.dumps(report) + "\n").encode())
    os.close(w)
    relay.join(timeout=10)
    os.close(out_w)
    with os.fdopen(out_r, "rb") as f:
        assert f.read() == printed  # the report was taken out, the output left as it was
    assert relay.lost_hosts == ["n2"] and relay.lost_ranks == {3}
    assert relay.reports == []  # a loss is not a rank's exit


def test_the_supervisor_passes_the_engines_lost_ranks_on_as_a_report():
    token = "3c" * 16
    code = ("import json, os\n"
            "fd = int(os.environ['HVDCOMPAT_REPORT_FD'])\n"
            "os.write(fd, json.dumps({'ranks': [2, 3], 'hosts': ['n2']}).encode() + b'\\n')\n")
    ran = _supervise(code, env={"HVDCOMPAT_REPORT_TOKEN": token})
    marker = exit_report.report_marker(token)
    reports = [json.loads(l[len(marker):]) for l in ran.stderr.splitlines()
               if l.startswith(marker)]
    assert {"kind": "lost", "rank": 3, "ranks": [2, 3], "hosts": ["n2"]} in reports, ran.stderr
    assert reports[-1]["status"] == 0, ran.stderr  # the exit report comes last


def test_a_rank_mpi_aborted_after_a_peer_failed_is_not_named_first():
    relay, _ = _relay([b"[n1:00000] *** An error occurred in Socket closed\n",
                       b"[n1:00000] *** reported by process [412155905,1]\n"])
    assert relay.mpi_aborted == {1}
    reports = [{"rank": 1, "host": "n1", "time": 4.9, "status": 14, "signal": None},
               {"rank": 2, "host": "n2", "time": 5.0, "status": None, "signal": 9}]
    line = exit_report.summary(14, reports, [], mpi_aborted=relay.mpi_aborted)
    assert line.startswith("hvdcompatrun: rank 2 on host n2 was killed by signal 9"), line
    # Alone, an aborted rank is still named.
    assert "rank 1 on host n1" in exit_report.summary(14, reports[:1], [], mpi_aborted={1})


def test_with_the_launchs_secret_only_its_reports_and_its_jobs_daemons_count():
    token = "5e" * 16
    genuine = exit_report.report_marker(token)
    start = (genuine + json.dumps({"kind": "start", "rank": 0,
                                   "namespace": "prterun-n1-77@1"}) + "\n").encode()
    forged = [
        # What a rank printing the old marker, a made-up secret, or an old log would write.
        MARKER + json.dumps({"rank": 0, "host": "n1", "time": 1.0, "status": 3}) + "\n",
        exit_report.report_marker("0" * 32) + json.dumps({"rank": 1, "status": 4}) + "\n",
        "PRTE has lost communication with a remote daemon.\n",
        "  HNP daemon   : [prterun-old-1@0,0] on node old1\n",
        "  Remote daemon: [prterun-old-1@0,1] on node n2\n",
        "rank 1 says: Remote daemon: [prterun-n1-77@0,1] on node n2\n",  # not at a line start
    ]
    ended = (genuine + json.dumps({"rank": 0, "host": "n1", "time": 2.0, "status": 0,
                                   "signal": None}) + "\n").encode()
    r, w = os.pipe()
    out_r, out_w = os.pipe()
    relay = exit_report.OutputRelay([(os.fdopen(r, "rb"), out_w)], token=token)
    os.write(w, start + "".join(forged).encode() + ended)
    os.close(w)
    relay.join(timeout=10)
    os.close(out_w)
    with os.fdopen(out_r, "rb") as f:
        out = f.read()
    assert out == "".join(forged).encode()  # the rank's lines are its output, unchanged
    assert relay.reports == [{"rank": 0, "host": "n1", "time": 2.0, "status": 0, "signal": None}]
    assert relay.namespaces == {"prterun-n1-77"}
    assert relay.lost_hosts == [] and not relay.survivors_done(2, {"n2": [1]})
    assert exit_report.first_failure_code(relay.reports) == 0
    # This job's own daemon, as prterun reports its loss, still counts.
    relay._scan(b"  Remote daemon: [prterun-n1-77@0,1] on node n2\n")
    assert relay.lost_hosts == ["n2"] and relay.survivors_done(2, {"n2": [1]})


def test_a_rank_printing_report_and_lost_daemon_lines_changes_nothing_in_a_real_job(tmp_path):
    from harness import mpi_env

    script = tmp_path / "spoof.py"
    script.write_text(
        "import json, os, sys, time\n"
        "rank = int(os.environ['OMPI_COMM_WORLD_RANK'])\n"
        "print('secret seen by the rank:', os.environ.get('HVDCOMPAT_REPORT_TOKEN'), flush=True)\n"
        "if rank == 1:\n"
        f"    line = {MARKER!r} + json.dumps({{'rank': 1, 'host': 'x', 'time': 0.0, "
        "'status': 3, 'signal': None})\n"
        "    print(line, flush=True)\n"
        "    print(line, file=sys.stderr, flush=True)\n"
        "    sys.stderr.write('PRTE has lost communication with a remote daemon.\\n'\n"
        "                     '  Remote daemon: [prterun-old-1@0,1] on node localhost\\n')\n"
        "    sys.stderr.flush()\n"
        "else:\n"
        "    time.sleep(1)\n")
    out = subprocess.run([sys.executable, "-m", "hvdcompat.runner.launch", "-np", "2",
                          sys.executable, str(script)], capture_output=True, text=True,
                         env=mpi_env(), timeout=120)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "hvdcompatrun: rank" not in text and "lost contact" not in text, text
    assert text.count("secret seen by the rank: None") == 2, text
    # The supervisors' own reports (with the secret) were taken out; the rank's lines stay.
    assert "hvdcompatrun-rank-exit-" not in text, text
    assert text.count(MARKER) == 2, text
    assert text.count('"status": 3') == 2 and "on node localhost" in text, text


def test_under_gloo_too_a_rank_printing_report_lines_changes_nothing(tmp_path):
    # hvdcompatrun --gloo gives its supervisors the launch's secret as well:
    # a rank that prints a failure report of its own is only output.
    script = tmp_path / "spoof.py"
    script.write_text(
        "import json, os, sys, time\n"
        "rank = int(os.environ['HOROVOD_RANK'])\n"
        "print('secret seen by the rank:', os.environ.get('HVDCOMPAT_REPORT_TOKEN'), flush=True)\n"
        "if rank == 1:\n"
        f"    line = {MARKER!r} + json.dumps({{'rank': 1, 'host': 'x', 'time': 0.0, "
        "'status': 3, 'signal': None})\n"
        "    print(line, file=sys.stderr, flush=True)\n"
        "else:\n"
        "    time.sleep(1)\n")
    out = subprocess.run([sys.executable, "-m", "hvdcompat.runner.launch", "--gloo", "-np", "2",
                          sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "hvdcompatrun: rank" not in text, text
    assert text.count("secret seen by the rank: None") == 2, text
    assert "hvdcompatrun-rank-exit-" not in text, text
    assert text.count(MARKER) == 1 and '"status": 3' in text, text

    # A rank that really fails is still named, with its exit code.
    script.write_text("import os, sys\nsys.exit(5 if os.environ['HOROVOD_RANK'] == '1' else 0)\n")
    out = subprocess.run([sys.executable, "-m", "hvdcompat.runner.launch", "--gloo", "-np", "2",
                          sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 5 and "rank 1" in out.stderr, out.stdout + out.stderr


def _relay_with_reports(reports, token="5e" * 16):
    """A relay that read these supervisor reports (each a dict), as a launch with `token` does."""
    r, w = os.pipe()
    out_r, out_w = os.pipe()
    relay = exit_report.OutputRelay([(os.fdopen(r, "rb"), out_w)], token=token)
    marker = exit_report.report_marker(token)
    for report in reports:
        os.write(w, (marker + json.dumps(report) + "\n").encode())
    os.close(w)
    relay.join(timeout=10)
    os.close(out_w)
    os.close(out_r)
    return relay


# Both sides of a network split report the other lost (the launcher reached both).
_SPLIT = [{"kind": "lost", "rank": 0, "ranks": [2, 3], "hosts": ["n2", "n2"]},
          {"kind": "lost", "rank": 2, "ranks": [0, 1], "hosts": ["n1", "n1"]}]
_PLACEMENT = {"n1": [0, 1], "n2": [2, 3]}


def test_a_split_job_waits_only_on_the_ranks_of_the_hosts_taken_as_lost():
    relay = _relay_with_reports(_SPLIT)
    assert relay.lost_reporters == {0, 2}
    assert relay.lost_named_by == {"n2": {0}, "n1": {2}}
    assert not relay.survivors_done(4, _PLACEMENT)  # every rank reported lost by someone
    assert not relay.survivors_done(4, _PLACEMENT, ["n2"])  # ranks 0 and 1 still run
    relay.reports = [{"rank": 0, "status": 0}, {"rank": 1, "status": 1}]
    assert relay.survivors_done(4, _PLACEMENT, ["n2"])
    assert not relay.survivors_done(4, _PLACEMENT, ["n1"])  # 2 and 3 run, they are not lost


def test_the_gloo_launch_names_the_host_its_own_ranks_lost():
    from hvdcompat.runner.gloo_run import RankSpec, failure_line

    specs = [RankSpec(rank=r, host=f"n{r // 2 + 1}", local_rank=r % 2, local_size=2,
                      cross_rank=r // 2, cross_size=2, local=r < 2) for r in range(4)]
    # The ranks that reported a loss failed (0, 2), the others exited 0: the far host is named.
    ended = [{"rank": r, "host": f"n{r // 2 + 1}", "time": 5.0 - r, "status": int(r in (0, 2))}
             for r in range(4)]
    relay = _relay_with_reports(_SPLIT + ended)
    code, line = failure_line(exit_report.first_failure_code(relay.reports, relay.lost_reporters),
                              relay, specs)
    assert code == 1 and line.startswith("hvdcompatrun: lost contact with host n2 "
                                         "(rank(s) 2, 3)"), line
    # ... and the job fails even when every rank exited 0.
    relay = _relay_with_reports(_SPLIT + [{**e, "status": 0} for e in ended])
    assert failure_line(0, relay, specs)[0] == 1
    # A rank that failed of its own accord (killed; it reported no loss) is named instead.
    killed = {"rank": 3, "host": "n2", "time": 6.0, "status": None, "signal": 9}
    relay = _relay_with_reports([_SPLIT[0], killed, ended[0]])
    code, line = failure_line(exit_report.first_failure_code(relay.reports, relay.lost_reporters),
                              relay, specs)
    assert code == 137 and line.startswith(
        "hvdcompatrun: rank 3 on host n2 was killed by signal 9 (SIGKILL)"), line


def test_a_survivor_that_exits_first_is_not_taken_for_a_lost_host():
    # Rank 1 saw rank 3 (on n2) and then rank 0 fail: rank 0 had finished and exited,
    # which under ULFM is a failed process too. Once ranks 0 and 1 have ended, n1 is
    # not lost (its supervisors reported), n2 is, and the job may end.
    relay = _relay_with_reports([
        {"kind": "lost", "rank": 0, "ranks": [3, 2], "hosts": ["n2", "n2"]},
        {"kind": "lost", "rank": 1, "ranks": [3, 0], "hosts": ["n2", "n1"]}])
    assert relay.lost_hosts == ["n2", "n1"]
    assert not relay.survivors_done(4, _PLACEMENT)  # ranks 0 and 1 still run
    relay.reports = [{"rank": 0, "status": 0}]
    assert not relay.survivors_done(4, _PLACEMENT)  # rank 1 still runs
    relay.reports.append({"rank": 1, "status": 0})
    assert relay.survivors_done(4, _PLACEMENT)
    assert relay.survivors_done(4)  # without the placement: the ranks the engines named
    assert not relay.survivors_done(5)  # a rank nobody reported on
