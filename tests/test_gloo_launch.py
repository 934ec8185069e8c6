"""Jobs without an MPI launcher: hvdcompatrun --gloo and torchrun, at 2 and 3 ranks, running real
collectives on the Gloo controller (results from rank and size; tests/gloo_scripts/collectives.py),
a killed rank (also while another is stopped), and DDP on the engine under torchrun.

A build without the Gloo controller must say so on every rank instead (the same launches check it).
"""

import os
import re
import subprocess
import sys
import time

import pytest

from harness import REPO, report_launch, short_command
from hvdcompat.basics import gloo_built

SCRIPT = os.path.join("tests", "gloo_scripts", "collectives.py")
DDP_SCRIPT = os.path.join("tests", "ddp_scripts", "ddp_train.py")
TIMEOUT = 240
GLOO = gloo_built()
NO_GLOO = "this build has no Gloo controller"


def _env():
    env = dict(os.environ)
    for var in [v for v in env if v.startswith(("OMPI_COMM_WORLD", "PMIX_", "PMI_", "HOROVOD_",
                                                "HVDCOMPAT_CONTROLLER", "TORCHELASTIC_"))]:
        del env[var]  # the test session itself may run under a launcher
    env["PYTHONUNBUFFERED"] = "1"
    return env


def launch(argv):
    """(exit code, combined output) of `python -m argv...`; a hang fails with the output."""
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", *argv], cwd=REPO, env=_env(), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as e:
        out = e.output.decode(errors="replace") if isinstance(e.output, bytes) else e.output
        pytest.fail(f"{short_command(argv)} did not end within {TIMEOUT} s:\n{out}")
    report_launch(argv[0], short_command(argv[1:]), time.monotonic() - start, proc.returncode,
                  False)
    return proc.returncode, proc.stdout


def oks(out):
    return sorted(int(r) for r, _ in re.findall(r"gloo_collectives rank (\d+) of (\d+) ok", out))


def _check_ran(np, code, out):
    if GLOO:
        assert code == 0 and oks(out) == list(range(np)), out
    else:
        assert code != 0 and out.count(NO_GLOO) >= np, out


@pytest.mark.parametrize("np", [2, 3])
def test_collectives_under_hvdcompatrun_gloo(np):
    code, out = launch(["hvdcompat.runner.launch", "--gloo", "-np", str(np), sys.executable,
                        SCRIPT])
    _check_ran(np, code, out)


@pytest.mark.parametrize("np", [2, 3])
def test_collectives_under_torchrun(np):
    code, out = launch(["torch.distributed.run", "--standalone", f"--nproc_per_node={np}",
                        SCRIPT])
    _check_ran(np, code, out)


@pytest.mark.skipif(not GLOO, reason="needs the Gloo controller in the build")
def test_a_killed_rank_fails_the_survivors_and_the_launch():
    started = time.monotonic()
    code, out = launch(["hvdcompat.runner.launch", "--gloo", "-np", "3", sys.executable, SCRIPT,
                        "kill"])
    assert code != 0, out
    assert re.search(r"hvdcompatrun: rank 1 on host \S+ was killed by signal 9", out), out
    survivors = re.findall(r"survivor (\d+): (.*)", out)
    assert sorted(int(r) for r, _ in survivors) == [0, 2], out
    # They fail with the engine's error instead of hanging (the launcher's line names rank 1).
    assert all(why.startswith("HorovodInternalError") for _, why in survivors), survivors
    # ... naming the lost rank, not only the address of its closed socket.
    assert all(why.startswith("HorovodInternalError: rank(s) 1 on host ")
               for _, why in survivors), survivors
    assert time.monotonic() - started < 150


@pytest.mark.skipif(not GLOO, reason="needs the Gloo controller in the build")
def test_a_survivor_stopped_past_the_grace_blames_only_the_killed_rank():
    # Rank 2 stops rank 1 for 2.5 s, then dies: rank 0 ends its waits (and closes its
    # connections) 0.8 s after it finds the loss, long before rank 1 looks (Note [Who closed
    # first] in cpp/transport/gloo_watch.h).
    code, out = launch(["hvdcompat.runner.launch", "--gloo", "-np", "3", sys.executable, SCRIPT,
                        "kill-stopped"])
    assert code != 0, out
    assert re.search(r"hvdcompatrun: rank 2 on host \S+ was killed by signal 9", out), out
    survivors = dict(re.findall(r"survivor (\d+): (.*)", out))
    assert sorted(survivors) == ["0", "1"], out
    # Each names rank 2 alone: not rank 0, whose connections rank 1 also finds closed.
    assert all(why.startswith("HorovodInternalError: rank(s) 2 on host ")
               for why in survivors.values()), survivors


def test_ddp_under_torchrun_runs_on_the_engine():
    code, out = launch(["torch.distributed.run", "--standalone", "--nproc_per_node=2", DDP_SCRIPT,
                        "--accelerate"])
    routes = re.findall(r"ddp_train rank (\d+) of 2 ok backend=gloo route=(\S+)", out)
    assert code == 0 and len(routes) == 2, out
    assert {route for _, route in routes} == {"engine" if GLOO else "process_group"}, out


def test_the_hvdcompat_backend_under_torchrun():
    # The accelerate import is what registers the backend with torch.distributed here.
    code, out = launch(["torch.distributed.run", "--standalone", "--nproc_per_node=2", DDP_SCRIPT,
                        "--accelerate", "--backend", "hvdcompat"])
    if GLOO:
        assert code == 0 and len(re.findall(r"ok backend=hvdcompat", out)) == 2, out
    else:
        assert code != 0 and "not started by an MPI launcher" in out, out
