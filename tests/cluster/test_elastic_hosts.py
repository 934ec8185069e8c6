"""Elastic training across test hosts: hosts added and removed, failures, blacklisting, limits.

Every launch is examples/pytorch_elastic.py under hvdcompatrun on the first
test host (48 generated samples, 4 per rank per batch, a commit after every
batch). At the end of each epoch the example logs, in its committed state
(so the log survives a restart on new hosts), the world size, whether the
per-sample tally of the epoch is all ones (every sample exactly once), and
whether the model's checksum is the same on every rank. ``--hold-at`` makes
the job wait, committing, at a known batch until the hosts change; the
discovery scripts below change their answer when the hold file appears, so
the schedule of sizes is fixed.
"""

import json
import os
import re
import stat
import sys

from cluster_harness import host_list, run_hvdcompatrun

TIMEOUT = 200
EXAMPLE = os.path.join("examples", "pytorch_elastic.py")
ARGS = ["--samples", "48", "--batch-size", "4"]


def _launch(cluster, flags, script_args, tmp_path):
    """(exit code, output, {rank at the start of the last launch: report})."""
    reports = tmp_path / "reports"
    reports.mkdir()
    result = run_hvdcompatrun(
        cluster, [*flags, "--mpi-args", " ".join(cluster.mpi_args()), sys.executable, EXAMPLE,
                  *ARGS, *script_args, "--report-dir", str(reports)],
        timeout=TIMEOUT, check=False)
    assert not result.timed_out, result.output
    found = {}
    for p in reports.glob("rank*.json"):
        r = json.loads(p.read_text())
        found[r["first_rank"]] = r
    return result.returncode, result.output, found


def _discovery(tmp_path, hold_dir, steps):
    """A discovery script printing steps[i][1] once hold file steps[i][0] exists (last wins)."""
    lines = ["#!/bin/sh"]
    for i, (hold, hosts) in enumerate(reversed(steps)):
        test = f"[ -e {hold_dir}/{hold} ]" if hold else "true"
        lines.append(f"{'if' if i == 0 else 'elif'} {test}; then printf '%s\\n' "
                     + " ".join(hosts))
    lines.append("fi")
    path = tmp_path / "discover.sh"
    path.write_text("\n".join(lines) + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _schedule(report):
    return [(e["epoch"], e["size"]) for e in report["epochs"]]


def _all_good(report):
    return all(e["exactly_once"] and e["identical"] for e in report["epochs"])


def test_hosts_added_then_removed(cluster, tmp_path):
    a, b = cluster.names
    hold = tmp_path / "hold"
    hold.mkdir()
    # a alone; b joins at the hold before epoch 0 batch 6; b leaves at epoch 2 batch 3.
    script = _discovery(tmp_path, hold, [(None, [f"{a}:1"]), ("hold-0.6", [f"{a}:1", f"{b}:1"]),
                                         ("hold-2.3", [f"{a}:1"])])
    code, out, reports = _launch(cluster, ["--min-np", "1", "--host-discovery-script", script],
                                 ["--epochs", "3", "--hold-at", "0:6,2:3", "--hold-dir",
                                  str(hold)], tmp_path)
    assert code == 0, out
    assert f"host(s) {b} added; the job restarts with them" in out, out
    assert f"restarting the job from its last commit on {a}:1, {b}:1" in out, out
    assert f"host {b} was removed by discovery" in out, out
    assert sorted(reports) == [0], out  # the last launch's rank 1 left with host b
    r = reports[0]
    # Epoch 0 ends on 2 ranks (b joined mid-epoch), epoch 2 on 1 (b left mid-epoch).
    assert _schedule(r) == [(0, 2), (1, 2), (2, 1)], out
    assert _all_good(r), out
    assert r["restarted"] and r["grown"] > 0, out
    m = re.search(r"recovery from hosts added to training resumed ([\d.]+) s", out)
    assert m, out
    print(f"MEASURED host added -> training resumed: {m.group(1)} s")


def test_a_killed_rank_blacklists_its_host_which_rejoins_after_the_cooldown(cluster, tmp_path):
    a, b = cluster.names
    # Rank 1 (on b) is SIGKILLed before epoch 0 batch 2; rank 0 goes on alone; b is
    # blacklisted for 2-3 s, then rejoins while rank 0 holds before batch 4.
    code, out, reports = _launch(
        cluster, ["-H", host_list(cluster, [1, 1]), "--min-np", "1",
                  "--blacklist-cooldown-range", "2", "3"],
        ["--epochs", "2", "--inject-failure", "1:0:2:sigkill", "--hold-at", "0:4"], tmp_path)
    assert code == 0, out
    assert re.search(rf"host {b} is blacklisted: its rank\(s\) 1 failed; it may rejoin in "
                     r"[23]\.\d s", out), out
    assert f"host {b}'s blacklist cooldown is over" in out, out
    assert f"restarting the job from its last commit on {a}:1, {b}:1" in out, out
    assert sorted(reports) == [0, 1], out
    assert reports[0]["checksum"] == reports[1]["checksum"], out
    for r in reports.values():
        assert _schedule(r) == [(0, 2), (1, 2)] and _all_good(r), out
    m = re.search(r"recovery from the death to training resumed ([\d.]+) s", out)
    assert m, out
    g = re.search(r"recovery from hosts added to training resumed ([\d.]+) s", out)
    assert g, out
    print(f"MEASURED death -> training resumed: {m.group(1)} s; host back -> resumed: "
          f"{g.group(1)} s")


def test_every_listed_host_blacklisted_stops_the_job(cluster, tmp_path):
    a, b = cluster.names
    hold = tmp_path / "hold"
    hold.mkdir()
    # Rank 1 (on b) raises before epoch 0 batch 2: b is blacklisted for good and rank 0
    # goes on alone from the last commit. At the hold before batch 4 discovery drops a and
    # offers only b: every host it lists is blacklisted, and the job stops.
    script = _discovery(tmp_path, hold, [(None, [f"{a}:1", f"{b}:1"]), ("hold-0.4", [f"{b}:1"])])
    code, out, reports = _launch(
        cluster, ["--min-np", "1", "--host-discovery-script", script],
        ["--epochs", "2", "--inject-failure", "1:0:2:exception", "--hold-at", "0:4",
         "--hold-dir", str(hold)], tmp_path)
    assert code != 0 and not reports, out
    assert "injected failure on rank 1 at epoch 0 batch 2" in out, out
    assert "recovery from the death to training resumed" in out, out
    assert f"host {b} is blacklisted: its rank(s) 1 failed; for the rest of the job" in out, out
    assert re.search(rf"hvdcompatrun: every host is blacklisted \({b} \(for good\)\); the job "
                     r"stops\. Repair or replace the hosts", out), out


def test_fewer_than_min_np_slots_past_the_timeout_stops_the_job(cluster, tmp_path):
    a, b = cluster.names
    hold = tmp_path / "hold"
    hold.mkdir()
    script = _discovery(tmp_path, hold, [(None, [f"{a}:1", f"{b}:1"]), ("hold-0.3", [f"{a}:1"])])
    code, out, reports = _launch(
        cluster, ["--min-np", "2", "--host-discovery-script", script, "--elastic-timeout", "3"],
        ["--epochs", "2", "--hold-at", "0:3", "--hold-dir", str(hold)], tmp_path)
    assert code != 0 and not reports, out
    assert ("only 1 usable slot(s), fewer than --min-np 2; waiting up to --elastic-timeout 3 s"
            in out), out
    assert re.search(rf"hvdcompatrun: only 1 usable slot\(s\) \(discovery lists {a}:1; "
                     r"blacklisted: none\), fewer than --min-np 2, for --elastic-timeout 3 s; "
                     r"the job stops\. Add hosts, or lower --min-np\.", out), out


def test_the_reset_limit_stops_the_job(cluster, tmp_path):
    code, out, reports = _launch(
        cluster, ["-H", host_list(cluster, [1, 1]), "--min-np", "1", "--reset-limit", "0"],
        ["--epochs", "1", "--inject-failure", "1:0:2:exception"], tmp_path)
    assert code != 0 and not reports, out
    assert ("elastic training reached the reset limit (--reset-limit 0) after 0 reset(s) and "
            "stops" in out), out


def test_a_restart_whose_saved_state_is_gone_stops_instead_of_starting_from_scratch(cluster,
                                                                                    tmp_path):
    """Host b joins (a restart); the discovery script, run by the driver every second, removes
    restart.pt as soon as rank 0's restart mark is there, as the host that wrote it would take a
    host-local file with it. The job must stop (the driver, or every relaunched rank, says why),
    not train again from epoch 0 with the reset count at 0."""
    a, b = cluster.names
    hold = tmp_path / "hold"
    hold.mkdir()
    base = tmp_path / "elastic"
    base.mkdir()
    script = _discovery(tmp_path, hold, [(None, [f"{a}:1"]), ("hold-0.6", [f"{a}:1", f"{b}:1"])])
    with open(script) as f:
        body = f.read()
    with open(script, "w") as f:
        f.write(body.replace("#!/bin/sh\n", "#!/bin/sh\nfor d in " + str(base) + "/*/; do "
                             "{ [ -e \"$d/restart\" ] || [ -e \"$d/restart.expected\" ]; } && "
                             "rm -f \"$d/restart.pt\"; done\n"))
    reports = tmp_path / "reports"
    reports.mkdir()
    result = run_hvdcompatrun(
        cluster, ["--min-np", "1", "--host-discovery-script", script, "--mpi-args",
                  " ".join(cluster.mpi_args()), sys.executable, EXAMPLE, *ARGS, "--epochs", "2",
                  "--hold-at", "0:6", "--hold-dir", str(hold), "--report-dir", str(reports)],
        timeout=TIMEOUT, check=False, env={"HVDCOMPAT_ELASTIC_DIR": str(base)})
    out = result.output
    assert not result.timed_out and result.returncode != 0, out
    by_driver = re.search(r"hvdcompatrun: rank 0 asked for a restart on new hosts \(its mark of "
                          r"[\d.]+\), but its saved state \S+restart.pt is not there; the job "
                          r"stops rather than start again from the initial state", out)
    by_ranks = ("the job was restarted on new hosts to continue from its last commit, but rank 0 "
                f"(host {a}) cannot read the saved state: FileNotFoundError") in out
    assert by_driver or by_ranks, out
    assert by_driver or f"restarting the job from its last commit on {a}:1, {b}:1" in out, out
    assert "training finished" not in out and not list(reports.glob("rank*.json")), out


def test_gloo_job_gains_a_host_in_place_and_loses_it(cluster, tmp_path):
    """hvdcompatrun --gloo: b joins while a's worker keeps running (same process, no
    re-import), then discovery drops b and its worker leaves at the next commit."""
    a, b = cluster.names
    hold = tmp_path / "hold"
    hold.mkdir()
    reports = tmp_path / "reports"
    reports.mkdir()
    # a alone; b joins at the hold before epoch 0 batch 6; b leaves at epoch 1 batch 3.
    script = _discovery(tmp_path, hold, [(None, [f"{a}:1"]), ("hold-0.6", [f"{a}:1", f"{b}:1"]),
                                         ("hold-1.3", [f"{a}:1"])])
    result = run_hvdcompatrun(
        cluster, ["--gloo", "--min-np", "1", "--host-discovery-script", script, sys.executable,
                  EXAMPLE, *ARGS, "--epochs", "2", "--hold-at", "0:6,1:3", "--hold-dir",
                  str(hold), "--report-dir", str(reports)],
        timeout=TIMEOUT, check=False,
        env={"PATH": cluster.tmpdir + os.pathsep + os.environ["PATH"]})  # the ssh stand-in
    out = result.output
    assert not result.timed_out and result.returncode == 0, out
    assert f"host {b} added: started 1 worker(s) there (1)" in out, out
    assert f"host {b}: 1 new worker(s) ready after" in out, out
    assert f"host {b} was removed by discovery" in out, out
    assert "restarts" not in out and "restarting" not in out, out  # no relaunch
    # Two processes ever started: a's, which trained throughout, and b's, which joined.
    starts = [line.split() for line in (reports / "starts").read_text().splitlines()]
    assert [host for _, host, _ in starts] == [a, b], starts
    found = {int(p.stem[len("rank"):]): json.loads(p.read_text())
             for p in reports.glob("rank*.json")}
    assert sorted(found) == [0], out  # b's worker left with its host
    r = found[0]
    assert r["pid"] == int(starts[0][0]) and f"{r['started']:.3f}" == starts[0][2], (r, starts)
    # Epoch 0 ends on 2 ranks (b joined mid-epoch), epoch 1 on 1 (b left mid-epoch); every
    # sample once per epoch, the same model on every rank at each epoch's end.
    assert _schedule(r) == [(0, 2), (1, 1)], out
    assert _all_good(r), out
    assert not r["restarted"], out
    m = re.search(r"rank 0: reset done, now rank 0 of 2 \(reset took ([\d.]+) s\)", out)
    assert m, out
    print(f"MEASURED Gloo: reset taking in the new worker {m.group(1)} s")
