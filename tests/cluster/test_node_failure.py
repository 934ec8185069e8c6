"""Node failure drills on test hosts: a host's link is cut, or its ranks are killed.

hvdcompatrun runs 2 ranks on each of 2 hosts; the second host is lost while
the ranks train. Under --fault-tolerant every survivor's pending op and the
next one raise HorovodInternalError naming the lost ranks and their host
within 30 s; under the default launch the job ends within 30 s, non-zero,
and hvdcompatrun names the first failed rank (or the lost host). On the Gloo
controller (--gloo) a cut host is noticed by its silence (Note [Silent peers
on Gloo]) within HVDCOMPAT_GLOO_PEER_TIMEOUT_SECONDS, after its ranks first
stayed away from collectives for longer than that, alive.
"""

import glob
import os
import re
import sys
import threading
import time

import pytest

from cluster_harness import host_list, run_hvdcompatrun

BOUND = 30  # seconds, from the loss to the survivors' error / the job's end
SCRIPT = os.path.join("tests", "cluster", "scripts", "lose_host.py")
_LOST = re.compile(r"rank\(s\) ([\d, ]+) on host (\S+)(?: \(which also runs rank\(s\) ([\d, ]+)\))?")


def _survivor_raised_naming_the_lost_host(rank, text, lost, lost_host, result):
    """Checks survivor `rank`'s report: HorovodInternalError naming ranks 2 and 3 on
    `lost_host`, and the rank went on past it; returns seconds from the loss to the error."""
    m = re.search(r"SURVIVOR \d+ ([\d.]+) (\w+): (.*)", text)
    assert m, f"rank {rank} reported nothing:\n{text}\n{result.output}"
    assert m.group(2) == "HorovodInternalError", f"{text}\n{result.output}"
    named = _LOST.search(m.group(3))
    assert named and named.group(2) == lost_host, text
    ranks = {int(x) for x in re.findall(r"\d+", named.group(1) + " " + (named.group(3) or ""))}
    assert ranks == {2, 3}, text
    assert f"AFTER {rank} HorovodInternalError" in text, text
    return float(m.group(1)) - lost


def _drill(cluster, how, fault_tolerant, out, gloo_env=None):
    os.makedirs(out)
    if how == "cut":
        def cut_when_ready():
            deadline = time.monotonic() + 120
            while len(glob.glob(os.path.join(out, "ready-*"))) < 4:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.1)
            time.sleep(1)  # the ranks are back inside their allreduces
            with open(os.path.join(out, "lost-cut"), "w") as f:
                f.write(f"{time.time():.3f}\n")
            cluster.cut(1)
        threading.Thread(target=cut_when_ready, daemon=True).start()
    mpi_args = cluster.mpi_args()
    if fault_tolerant:
        # ULFM's detector says (in every rank's output) when a heartbeat was sent
        # late and which rank it suspects: a failure shows whether a live rank
        # was starved rather than lost.
        mpi_args = [*mpi_args, "--mca", "mpi_ft_verbose", "1"]
    args = ["-H", host_list(cluster, [2, 2]), "--mpi-args", " ".join(mpi_args)]
    if fault_tolerant:
        args.append("--fault-tolerant")
    env = {"DRILL": how, "DRILL_HOSTNAME": cluster.names[1], "DRILL_OUT": out,
           "DRILL_SURVIVORS": "2" if fault_tolerant else "0"}
    if gloo_env is not None:
        # hvdcompatrun --gloo reaches the second host with `ssh`: the stand-in, first on PATH.
        args = ["--gloo", "-H", host_list(cluster, [2, 2])]
        env.update(gloo_env, PATH=cluster.tmpdir + os.pathsep + os.environ["PATH"])
    result = run_hvdcompatrun(cluster, [*args, sys.executable, SCRIPT], timeout=150, check=False,
                              env=env)
    ended = time.time()
    lost = [float(open(p).read()) for p in glob.glob(os.path.join(out, "lost-*"))]
    assert lost, f"the host was never lost:\n{result.output}"
    reports = {int(os.path.basename(p)): open(p).read()
               for p in glob.glob(os.path.join(out, "[0-9]*"))}
    return result, min(lost), ended, reports


# The cut variant once failed 3 of 5 runs, in two ways (ULFM's messages on,
# above): the survivors' exits raced (a survivor that exits is a failed
# process to ULFM; the script now waits for every survivor's report before
# exiting, DRILL_SURVIVORS), and rank 0's op, waiting on rank 2 across hosts
# (cut off, suspected only one detector timeout after rank 3), did not end
# when rank 3's failure was known; it does now (Note [A known failure ends
# every wait], cpp/transport/request_wait.h).
@pytest.mark.parametrize("how", ["cut", "kill"])
def test_fault_tolerant_survivors_are_told_which_host_was_lost(fresh_cluster, how, tmp_path):
    result, lost, ended, reports = _drill(fresh_cluster, how, True, str(tmp_path / "out"))
    assert not result.timed_out, result.output
    lost_host = fresh_cluster.names[1]
    for rank in (0, 1):  # the survivors, on the first host
        text = reports.get(rank, "")
        took = _survivor_raised_naming_the_lost_host(rank, text, lost, lost_host, result)
        assert took < BOUND, (took, text)
        print(f"MEASURED fault-tolerant {how}: rank {rank} raised "
              f"{took:.1f} s after the loss; the job ended "
              f"{ended - lost:.1f} s after it")
    assert result.returncode != 0, result.output
    assert re.search(rf"hvdcompatrun: (rank [23] on host {lost_host}|lost contact with host "
                     rf"{lost_host})", result.output), result.output


@pytest.mark.parametrize("how", ["cut", "kill"])
def test_default_launch_ends_naming_the_first_failure(fresh_cluster, how, tmp_path):
    result, lost, ended, _ = _drill(fresh_cluster, how, False, str(tmp_path / "out"))
    assert not result.timed_out and result.returncode != 0, result.output
    assert ended - lost < BOUND, (ended - lost, result.output)
    print(f"MEASURED default launch {how}: the job ended {ended - lost:.1f} s after the loss, "
          f"exit code {result.returncode}")
    lost_host = fresh_cluster.names[1]
    lines = [l for l in result.output.splitlines() if l.startswith("hvdcompatrun: ")]
    assert len(lines) == 1, result.output
    if how == "kill":
        assert re.match(rf"hvdcompatrun: rank [23] on host {lost_host} was killed by signal 9 "
                        rf"\(SIGKILL\), the first rank of the job to fail", lines[0]), lines
    else:
        assert lines[0].startswith(f"hvdcompatrun: lost contact with host {lost_host} "
                                   "(rank(s) 2, 3)"), lines


GLOO_PEER_TIMEOUT = 6  # seconds (HVDCOMPAT_GLOO_PEER_TIMEOUT_SECONDS; 20 by default)
BUSY = 10  # seconds the lost host's ranks first spend away from collectives, alive


def test_gloo_survivors_name_a_host_that_went_silent(fresh_cluster, tmp_path):
    result, lost, ended, reports = _drill(
        fresh_cluster, "cut", False, str(tmp_path / "out"),
        gloo_env={"HVDCOMPAT_GLOO_PEER_TIMEOUT_SECONDS": str(GLOO_PEER_TIMEOUT),
                  "DRILL_BUSY": str(BUSY)})
    assert not result.timed_out and result.returncode != 0, result.output
    # A host whose ranks were busy for longer than the timeout was not taken for lost.
    waited = {int(r): float(t) for r, t in
              re.findall(r"rank (\d) waited ([\d.]+) s on a busy host", result.output)}
    assert sorted(waited) == [0, 1, 2, 3] and min(waited.values()) > BUSY - 1, result.output
    lost_host = fresh_cluster.names[1]
    for rank in (0, 1):  # the survivors, on the first host
        text = reports.get(rank, "")
        took = _survivor_raised_naming_the_lost_host(rank, text, lost, lost_host, result)
        # Noticed by the silence: not before the timeout, and soon after it.
        assert GLOO_PEER_TIMEOUT - 2 < took < GLOO_PEER_TIMEOUT + 8, (took, text)
        print(f"MEASURED Gloo cut (peer timeout {GLOO_PEER_TIMEOUT} s): rank {rank} raised "
              f"{took:.1f} s after the loss; the job ended {ended - lost:.1f} s after it")
    lines = [l for l in result.output.splitlines() if l.startswith("hvdcompatrun: ")]
    assert len(lines) == 1 and lines[0].startswith(
        f"hvdcompatrun: lost contact with host {lost_host} (rank(s) 2, 3)"), result.output
