"""The shipped examples run under mpirun and do what they claim."""

import re
import sys

from harness import run_ranks

EPOCH_LINE = re.compile(r"epoch (\d+) loss ([0-9.]+)")


def _losses(output):
    return {int(e): float(v) for e, v in EPOCH_LINE.findall(output)}


def test_multi_model_example_trains_and_resumes(tmp_path):
    argv = [sys.executable, "examples/pytorch_multi_model.py", "--samples", "512",
            "--checkpoint-dir", str(tmp_path)]
    first = run_ranks(2, argv + ["--epochs", "3"], timeout=180, what="pytorch_multi_model.py")
    losses = _losses(first.output)
    assert sorted(losses) == [0, 1, 2], first.output      # only rank 0 logs
    assert losses[2] < losses[0], first.output
    assert (tmp_path / "checkpoint.pt").exists()

    second = run_ranks(2, argv + ["--epochs", "5"], timeout=180,
                       what="pytorch_multi_model.py (resumed)")
    assert "resumed from" in second.output and "at epoch 3" in second.output, second.output
    resumed = _losses(second.output)
    assert sorted(resumed) == [3, 4], second.output
    assert max(resumed.values()) < losses[0], second.output
