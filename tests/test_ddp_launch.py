"""DDP scripts under every launcher: mpirun (bootstrap), torchrun, torch.distributed.launch."""

import os
import re
import socket
import subprocess
import sys
import time

import pytest

from harness import REPO, mpi_env, report_launch, run_ranks, short_command
from hvdcompat.basics import gloo_built

SCRIPT = os.path.join("tests", "ddp_scripts", "ddp_train.py")
BENCHMARK = os.path.join("examples", "pytorch_ddp_benchmark.py")
TIMEOUT = 240


def oks(output):
    return re.findall(r"ddp_train rank (\d+) of (\d+) ok backend=(\S+) route=(\S+)", output)


def torch_launch(argv, extra_env=None):
    """Runs a torch launcher command in the repository; returns its combined output."""
    env = mpi_env(extra_env)
    for var in [v for v in env if v.startswith(("OMPI_COMM_WORLD", "PMIX_", "PMI_"))]:
        del env[var]  # the test session itself may run under an MPI launcher
    # Run once: a failure is a failure. (An abort at exit, "terminate called
    # without an active exception", was seen when a rank destroyed its gloo
    # group while its peer still used its own; the scripts now free the DDP
    # model and meet at a barrier before destroying the group.)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", *argv], cwd=REPO, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=TIMEOUT)
    report_launch(argv[0], short_command(argv[1:]), time.monotonic() - start, proc.returncode,
                  False)
    assert proc.returncode == 0, proc.stdout
    return proc.stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("np", [2, 3])
def test_unmodified_env_script_runs_under_mpirun(np):
    out = run_ranks(np, [sys.executable, "-m", "hvdcompat.ddp", SCRIPT], timeout=TIMEOUT).output
    found = oks(out)
    assert sorted(int(r) for r, *_ in found) == list(range(np)), out
    assert {(n, b, route) for _, n, b, route in found} == {(str(np), "gloo", "ddp")}, out


def test_unmodified_script_on_the_hvdcompat_backend_under_mpirun():
    out = run_ranks(2, [sys.executable, "-m", "hvdcompat.ddp", SCRIPT, "--backend", "hvdcompat"],
                    timeout=TIMEOUT).output
    assert {(b, route) for _, _, b, route in oks(out)} == {("hvdcompat", "ddp")}, out
    assert len(oks(out)) == 2, out


def test_accelerate_under_mpirun_uses_the_engine():
    out = run_ranks(2, [sys.executable, SCRIPT, "--accelerate"], timeout=TIMEOUT).output
    assert {route for *_, route in oks(out)} == {"engine"} and len(oks(out)) == 2, out
    assert out.count("hvdcompat.ddp.accelerate:") == 1, out


def test_accelerate_under_torchrun_standalone():
    out = torch_launch(["torch.distributed.run", "--standalone", "--nproc_per_node=2", SCRIPT,
                        "--accelerate"])
    # With the Gloo controller the engine spans torchrun's ranks (tests/test_gloo_launch.py).
    want = "engine" if gloo_built() else "process_group"
    assert {route for *_, route in oks(out)} == {want} and len(oks(out)) == 2, out
    assert out.count("hvdcompat.ddp.accelerate:") == 1, out
    assert gloo_built() or "not started by an MPI launcher" in out, out


def test_accelerate_with_fp16_under_torch_distributed_launch_use_env():
    out = torch_launch(["torch.distributed.launch", "--nproc_per_node=2", "--nnodes=1",
                        "--node_rank=0", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
                        "--use_env", SCRIPT, "--accelerate", "--tolerance", "5e-3"],
                       {"HVDCOMPAT_DDP_COMPRESSION": "fp16"})
    assert len(oks(out)) == 2, out
    assert "compression: fp16" in out, out


def _table_rows(out):
    return re.findall(r"^(gloo|hvdcompat backend|gloo \+ accelerate \(\w+\))\s+(\S+)\s+([\d.]+)",
                      out, flags=re.M)


# The benchmark under hvdcompatrun (mpirun) runs in tests/test_examples.py.
SMALL = ["--warmup", "1", "--iters", "2", "--rounds", "1", "--hidden", "64", "--layers", "2"]


def test_benchmark_under_torch_distributed_launch_as_documented():
    # USERS.md section 2 step 3: no --use_env, so the script gets --local-rank.
    out = torch_launch(["torch.distributed.launch", "--nproc_per_node=2", "--nnodes=1",
                        "--node_rank=0", "--master_addr=localhost", f"--master_port={free_port()}",
                        BENCHMARK, *SMALL])
    rows = _table_rows(out)
    # The hvdcompat backend runs under torch's launchers only on the Gloo controller.
    backend = ["hvdcompat backend"] if gloo_built() else []
    assert [r[0] for r in rows] == ["gloo"] + backend + ["gloo + accelerate (none)",
                                                         "gloo + accelerate (fp16)"], out
    assert gloo_built() or "hvdcompat backend: skipped" in out, out
    # With the Gloo controller the backend and the accelerate hook run on the engine.
    if gloo_built():
        assert [r[1] for r in rows[1:]] == ["engine"] * (len(rows) - 1), out
