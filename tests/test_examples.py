"""Runs every examples/*.py under `hvdcompatrun -np 2` with short settings.

Each example needs an entry in SHORT_SETTINGS (a list of runs: arguments, and
checks of its output: strings it must contain or functions that assert); an example without one fails the test, so a
new example is never left unrun. ``{tmp}`` in an argument is a per-example
temporary directory shared by its runs (the MNIST example resumes from the
checkpoint of its first run).
"""

import glob
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

import hvdcompat as hvd
from harness import REPO, mpi_env, report_launch, run_ranks, short_command

TIMEOUT = int(os.environ.get("HVDCOMPAT_TEST_TIMEOUT", "300"))

def _loss_falls(out):
    losses = [float(x) for x in re.findall(r"Epoch \d+: train loss ([0-9.]+)", out)]
    assert len(losses) == 2 and losses[1] < losses[0], f"training loss did not fall:\n{out}"


_EPOCH_LOSS = re.compile(r"epoch (\d+) loss ([0-9.]+)")
_first_multi_model_losses = {}


def _multi_model_first_run(out):
    losses = {int(e): float(v) for e, v in _EPOCH_LOSS.findall(out)}
    assert sorted(losses) == [0, 1, 2], out  # only rank 0 logs
    assert losses[2] < losses[0], f"loss did not fall:\n{out}"
    _first_multi_model_losses.update(losses)


def _multi_model_resumed(out):
    assert "resumed from" in out and "at epoch 3" in out, out
    resumed = {int(e): float(v) for e, v in _EPOCH_LOSS.findall(out)}
    assert sorted(resumed) == [3, 4], out
    assert max(resumed.values()) < _first_multi_model_losses[0], out


def _efficiency_from_measured_baseline(out):
    baseline = float(re.search(r"Baseline img/sec \(one process, no hvdcompat\): ([0-9.]+)",
                               out).group(1))
    total = float(re.search(r"Total img/sec on 2 rank\(s\): ([0-9.]+)", out).group(1))
    shown = re.search(r"Scaling efficiency vs one process \(([0-9.]+) img/sec, measured in this "
                      r"job\): (\d+)%", out)
    assert shown, f"no scaling efficiency against the measured baseline:\n{out}"
    assert float(shown.group(1)) == baseline, out
    # The printed figures are rounded; the script divides the unrounded ones.
    assert abs(int(shown.group(2)) - 100 * total / (2 * baseline)) <= 1, out


def _fraction_of_ceiling(out):
    ceiling = float(re.search(r"\| no communication \(ceiling\) \| ([0-9.]+) ±", out).group(1))
    dist = float(re.search(r"\| DistributedOptimizer \| ([0-9.]+) ± [0-9.]+ \| ([0-9.]+) \|",
                           out).group(1))
    shown = float(re.search(r"\| DistributedOptimizer \| [0-9.]+ ± [0-9.]+ \| ([0-9.]+) \|",
                            out).group(1))
    assert ceiling > 0 and dist > 0, out
    # Printed rounded; the script divides the unrounded figures.
    assert abs(shown - dist / ceiling) <= 0.01 + 0.05 * dist / ceiling, out


_BENCH_SHORT = ["--batch-size", "4", "--num-warmup-batches", "1", "--num-batches-per-iter", "1",
                "--num-iters", "2"]

SHORT_SETTINGS = {
    "pytorch_multi_model.py": [
        (["--samples", "512", "--checkpoint-dir", "{tmp}", "--epochs", "3"],
         [_multi_model_first_run]),
        (["--samples", "512", "--checkpoint-dir", "{tmp}", "--epochs", "5"],
         [_multi_model_resumed]),
    ],
    "train_small.py": [(["--steps", "5"], ["done: final loss"])],
    "pytorch_elastic.py": [
        (["--samples", "480", "--batch-size", "8", "--epochs", "2"],
         ["epoch 0: 2 ranks", "epoch 1: 2 ranks", "every sample seen exactly once: True",
          "done, model checksum"]),
    ],
    "pytorch_ddp_benchmark.py": [
        (["--warmup", "1", "--iters", "2", "--rounds", "1", "--hidden", "64", "--layers", "2"],
         ["2 ranks (MPI launcher)", "hvdcompat backend            engine",
          "gloo + accelerate (none)     engine", "gloo + accelerate (fp16)"]),
    ],
    # {port}: a free port for rank 0's TCPStore (fixed ports collide with other jobs).
    "gloo_allreduce_benchmark.py": [
        (["--sizes", "4KiB,1MiB", "--iters", "2", "--rounds", "1", "--port", "{port}"],
         ["| size | hvdcompat Gloo controller | torch.distributed gloo | hvdcompat MPI",
          "| 4KiB |", "| 1MiB |", "sums checked on every rank: Gloo controller, torch gloo, "
          "MPI controller"]),
    ],
    "allreduce_benchmark.py": [
        (["--sizes", "4KiB,1MiB", "--iters", "3", "--warmup", "1", "--resnet-iters", "1"],
         ["hvdcompat ms", "ResNet-50 gradient set: 161 tensors, 25,557,032 floats",
          "raw MPI, one Allreduce per tensor", "gloo, async per tensor",
          "hvdcompat out of place (async, fused)", "out of place / in place"]),
        (["--sizes", "4KiB", "--iters", "2", "--warmup", "1", "--resnet-iters", "1", "--no-gloo",
          "--mpi4py-first", "--pool-compare", "--pool-rounds", "1"],
         ["# MPI started by mpi4py, before hvdcompat", "out of place ms",
          "hvdcompat (async, fused)", "pool off: in ms", "ResNet-50 |"]),
        # One host, shared-memory nodes: the hierarchical engine falls back (0 calls).
        (["--sizes", "64KiB", "--iters", "2", "--warmup", "1", "--resnet-iters", "1",
          "--no-gloo", "--hierarchical"],
         ["hier ms", "hvdcompat hierarchical (async, fused)",
          "hierarchical MPI calls in the last engine: 0 "]),
    ],
    "pytorch_synthetic_benchmark.py": [
        (["--model", "resnet", "--image-size", "16", "--measure-baseline", *_BENCH_SHORT],
         ["| rank | img/sec", "Total img/sec on 2 rank(s)", _efficiency_from_measured_baseline]),
        (["--model", "resnet", "--resnet-width", "8", "--image-size", "16", "--mpi4py-first",
          "--measure-ceiling", "--ceiling-rounds", "1", *_BENCH_SHORT],
         ["MPI started by: mpi4py, before hvdcompat", "| no communication (ceiling) |",
          "| DistributedOptimizer |", _fraction_of_ceiling, "| rank 0, ms per batch |",
          "| tail: waiting after backward for the last reductions |",
          "| CPU: main (training) |"]),
        (["--model", "transformer", "--seq-len", "16", "--fp16-allreduce",
          "--baseline-img-sec", "10", *_BENCH_SHORT],
         ["Total samples/sec on 2 rank(s)", "Scaling efficiency"]),
        # The search runs to its end (3 configurations, 1 step per sample), then both engines.
        (["--model", "mlp", "--image-size", "8", *_BENCH_SHORT, "--autotune",
          "--autotune-warmup-samples", "0", "--autotune-steps-per-sample", "1",
          "--autotune-bayes-opt-max-samples", "3", "--autotune-rounds", "1"],
         ["search ended after", "| default | fusion 128 MiB", "| autotuned | fusion"]),
    ],
    "pytorch_mnist.py": [
        (["--epochs", "2", "--train-size", "640", "--test-size", "200", "--batch-size", "32",
          "--lr", "0.05", "--momentum", "0.9", "--checkpoint-dir", "{tmp}"],
         ["Epoch 2: train loss", "checkpoint-2.pt", _loss_falls]),
        (["--epochs", "3", "--train-size", "640", "--test-size", "200", "--batch-size", "32",
          "--lr", "0.05", "--momentum", "0.9", "--checkpoint-dir", "{tmp}"],
         ["Resuming from", "(epoch 2 done)", "Epoch 3: train loss"]),
    ],
}


# Every file in examples/ is an example (the benchmarks' helpers live in scripts/benchmark_helpers/).
EXAMPLES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(REPO, "examples", "*.py")))


def _missing_api(name):
    with open(os.path.join(REPO, "examples", name), encoding="utf-8") as f:
        used = set(re.findall(r"\bhvd\.([A-Za-z_][A-Za-z0-9_]*)", f.read()))
    return sorted(n for n in used if not hasattr(hvd, n))


def launch(args, timeout=TIMEOUT):
    """Runs hvdcompatrun with ``args``; returns (exit code, output)."""
    cmd = [sys.executable, "-m", "hvdcompat.runner.launch", *args]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, env=mpi_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # hvdcompatrun passes it on to mpirun and the ranks
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        report_launch("hvdcompatrun", short_command(args), time.monotonic() - start,
                      proc.returncode, True)
        pytest.fail(f"{' '.join(args)} timed out after {timeout} s:\n{out}")
    report_launch("hvdcompatrun", short_command(args), time.monotonic() - start,
                  proc.returncode, False)
    return proc.returncode, out


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_settings_name_existing_examples():
    stale = sorted(set(SHORT_SETTINGS) - set(EXAMPLES))
    assert not stale, f"SHORT_SETTINGS has entries for examples that do not exist: {stale}"


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs_on_two_ranks(name, tmp_path):
    if name not in SHORT_SETTINGS:
        pytest.fail(f"examples/{name} has no entry in SHORT_SETTINGS (tests/test_examples.py); "
                    "add short arguments for it so every example is run")
    missing = _missing_api(name)
    assert not missing, f"examples/{name} uses hvd names that do not exist: {missing}"
    for args, expected in SHORT_SETTINGS[name]:
        args = [a.replace("{tmp}", str(tmp_path)).replace("{port}", str(_free_port()))
                for a in args]
        code, out = launch(["-np", "2", sys.executable, os.path.join("examples", name), *args])
        assert code == 0, f"examples/{name} {' '.join(args)} exited with {code}:\n{out}"
        for check in expected:
            if callable(check):
                check(out)
            else:
                assert check in out, (f"examples/{name} {' '.join(args)}: {check!r} not in "
                                      f"output:\n{out}")


def test_benchmark_under_plain_mpirun():
    result = run_ranks(2, [sys.executable, "examples/pytorch_synthetic_benchmark.py", "--model",
                           "mlp", "--image-size", "8", *_BENCH_SHORT], timeout=TIMEOUT)
    assert "Total img/sec on 2 rank(s)" in result.output, result.output
