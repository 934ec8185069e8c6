"""Elastic training losing ranks, on one machine: 3 ranks under hvdcompatrun's elastic flags.

Each run is examples/pytorch_elastic.py (generated MNIST-shaped data, a
committed per-sample tally) with a failure injected mid-epoch. The "hosts"
are this machine's slots; the same runs take -H/--host-discovery-script on
real or namespaced hosts.

Sizes are chosen so that no epoch needs padding: 144 samples, 4 per rank per
batch; 3 ranks commit 2 batches (24 samples) of epoch 0 before the failure,
the 2 survivors then share the remaining 120, and all 144 of epoch 1.
"""

import json
import os
import signal
import subprocess
import sys

import pytest

from harness import REPO, launcher_failed_to_start, mpi_env, note_launcher_retry

from hvdcompat import _core

TIMEOUT = 240
ARGS = ["--samples", "144", "--batch-size", "4", "--epochs", "2"]


def hvdcompatrun(flags, script_args, tmp_path):
    """Runs the example under hvdcompatrun; returns (exit code, output, reports by first rank)."""
    for attempt in range(3):
        reports = tmp_path / f"reports{attempt}"
        reports.mkdir()
        cmd = [sys.executable, "-m", "hvdcompat.runner.launch", *flags, sys.executable,
               os.path.join("examples", "pytorch_elastic.py"), *ARGS, *script_args,
               "--report-dir", str(reports)]
        proc = subprocess.Popen(cmd, cwd=REPO, env=mpi_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            pytest.fail(f"{' '.join(cmd)} timed out after {TIMEOUT} s:\n{out}")
        # Open MPI's launcher failing before any rank started (nothing of ours
        # ran) is tried again, counted and shown, as tests/harness.py does.
        reason = None if proc.returncode == 0 else launcher_failed_to_start(
            out, ranks_ran=any(reports.glob("rank*.json")))
        if reason is None or attempt == 2:
            break
        note_launcher_retry("hvdcompatrun", " ".join(flags + script_args), reason, attempt + 1, 3)
    found = {}
    for p in reports.glob("rank*.json"):
        r = json.loads(p.read_text())
        found[r["first_rank"]] = r
    return proc.returncode, out, found


@pytest.mark.parametrize("mode", ["exception", "sigkill"])
def test_survivors_continue_from_the_last_commit(mode, tmp_path):
    code, out, reports = hvdcompatrun(["-np", "3", "--min-np", "2"],
                                      ["--inject-failure", f"1:0:2:{mode}"], tmp_path)
    assert code == 0, out  # the final world finished; the lost rank's code is not the job's
    assert "training finished on 2 of 3 rank(s)" in out, out
    assert sorted(reports) == [0, 2], out  # rank 1 was lost
    # The oldest survivor is rank 0; relative order is kept.
    assert [(r["rank"], r["size"]) for _, r in sorted(reports.items())] == [(0, 2), (1, 2)]
    assert reports[0]["checksum"] == reports[2]["checksum"], out  # identical models
    for r in reports.values():
        assert [(e["epoch"], e["size"], e["exactly_once"]) for e in r["epochs"]] == \
            [(0, 2, True), (1, 2, True)], out
        assert r["recovery"] is not None and r["recovery"] > 0, out
    assert "every sample seen exactly once: True" in out
    assert "recovery from the death to training resumed" in out


def test_a_removed_host_leaves_at_the_next_commit(tmp_path):
    # Ranks 0 and 1 are on "hostA", rank 2 on "hostB"; discovery drops hostB during epoch 0.
    code, out, reports = hvdcompatrun(
        ["-np", "3", "--min-np", "2"],
        ["--simulate-hosts", "hostA,hostA,hostB", "--remove-host", "0:1:hostB"], tmp_path)
    assert code == 0, out
    assert "host hostB was removed by host discovery; rank 2 leaves the job" in out, out
    assert sorted(reports) == [0, 1], out
    assert reports[0]["checksum"] == reports[1]["checksum"], out
    for r in reports.values():
        assert [(e["epoch"], e["size"], e["exactly_once"]) for e in r["epochs"]] == \
            [(0, 2, True), (1, 2, True)], out


def test_every_rank_failing_ends_the_job_with_an_error(tmp_path):
    code, out, reports = hvdcompatrun(["-np", "3", "--min-np", "1"],
                                      ["--inject-failure", "all:0:2:exception"], tmp_path)
    assert code != 0 and not reports, out
    for r in range(3):
        assert f"injected failure on rank {r} at epoch 0 batch 2" in out, out


def test_fewer_survivors_than_min_np_is_a_clear_error(tmp_path):
    code, out, reports = hvdcompatrun(["-np", "3", "--min-np", "3"],
                                      ["--inject-failure", "1:0:2:sigkill"], tmp_path)
    assert code != 0 and not reports, out
    assert "only 2 rank(s) are left" in out and "fewer than --min-np 3" in out, out


# Each rank runs under sh, which prints how the rank's own process exited.
_EXIT_WRAPPER = ('"$0" tests/scripts/elastic_exit.py "$1" "$2"; c=$?; '
                 'echo "RANK EXIT world rank ${OMPI_COMM_WORLD_RANK:-$HOROVOD_RANK}: $c"; exit $c')


@pytest.mark.parametrize("controller, end, code", [
    ("mpi", "exit:3", 3), ("mpi", "raise", 1),
    pytest.param("gloo", "exit:3", 3, marks=pytest.mark.skipif(
        not getattr(_core, "gloo_built", bool)(), reason="needs the Gloo controller"))])
def test_survivors_exit_code_after_a_lossy_reset_is_the_jobs(controller, end, code):
    # World rank 1 fails in hvd.elastic.run; ranks 0 and 2 reset, finish and end by `end`.
    flags = ["--gloo"] if controller == "gloo" else []
    cmd = [sys.executable, "-m", "hvdcompat.runner.launch", *flags, "-np", "3",
           "--min-np", "2", "sh", "-c", _EXIT_WRAPPER, sys.executable, "1", end]
    proc = subprocess.run(cmd, cwd=REPO, env=mpi_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace", timeout=TIMEOUT)
    out = proc.stdout
    assert "RANK EXIT world rank 1: 1" in out, out  # the failed rank
    for first, rank in ((0, 0), (2, 1)):
        assert f"SURVIVOR world rank {first} is rank {rank} of 2, total 10.0" in out, out
    # Once one survivor has exited non-zero mpirun may stop the other before it reports.
    survivors = [line for line in out.splitlines()
                 if line.startswith(("RANK EXIT world rank 0:", "RANK EXIT world rank 2:"))]
    assert survivors and all(line.endswith(f": {code}") for line in survivors), out
    assert proc.returncode == code, out
    assert f"they exited with {code} (world ranks [0, 2])" in out, out
