"""Autotune in a real job: HOROVOD_AUTOTUNE=1 with a short schedule, so the search
runs to its end in a few seconds.

Every step allreduces a fixed set of named tensors (small ones that fuse and
stream in chunks, float16 that streams through float32, a large one reduced in
place and split into calls) and checks each result bit for bit against the
reference computed from every rank's input. After the search: the log has
Horovod's header and one row per scored configuration plus the best; the
settings changed; every rank applied the same settings in the same cycle; a
knob the user set never moved.
"""

import contextlib
import os
import shutil
import tempfile

import torch

import hvdcompat as hvd
from hvdcompat.basics import _core
from parallel_util import all_inputs, assert_same, expected_reduce, restarted

HOROVOD_COLUMNS = ("hierarchical_allreduce,hierarchical_allgather,torus_allreduce,"
                   "cache_enabled,cycle_time_ms,tensor_fusion_threshold,score")
MAX_SAMPLES = 6
SCHEDULE = {"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "1",
            "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "1",
            "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": str(MAX_SAMPLES),
            "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.8"}
TUNABLES = ("fusion_threshold_bytes", "cycle_time_ms", "fusion_chunk_bytes", "max_call_bytes")


@contextlib.contextmanager
def autotuned_engine(**env):
    """Re-initialises the engine with `env` (Horovod's spellings); restores the launch's."""
    with restarted(dict(SCHEDULE, **env)):
        yield


def _step_inputs():
    """[(name, this rank's input, op, expected)] for one training-like step."""
    me, jobs = hvd.rank(), []
    for i in range(16):  # 16 x 16 KiB: fused, and streamed in several chunks at 64 KiB
        xs = all_inputs((4096,), torch.float32, ("at-small", i))
        jobs.append((f"at.small.{i}", xs[me], hvd.Sum, expected_reduce(xs, torch.float32, hvd.Sum)))
    xs = all_inputs((3, 5), torch.int32, "at-int")
    jobs.append(("at.int", xs[me], hvd.Average, expected_reduce(xs, torch.int32, hvd.Average)))
    xs = all_inputs((50_000,), torch.float16, "at-half")
    jobs.append(("at.half", xs[me], hvd.Sum, expected_reduce(xs, torch.float16, hvd.Sum)))
    # 6 MiB: reduced in place, in several calls once the split goes below it.
    xs = all_inputs((1_572_864,), torch.float32, "at-big")
    jobs.append(("at.big", xs[me], hvd.Average, expected_reduce(xs, torch.float32, hvd.Average)))
    return jobs


def _train_until_tuned(max_steps=400):
    jobs = _step_inputs()
    steps = 0
    while True:
        for _ in range(10):
            handles = [hvd.allreduce_async(x, name=n, op=op) for n, x, op, _ in jobs]
            for h, (n, _, _, expected) in zip(handles, jobs):
                assert_same(hvd.synchronize(h), expected, what=f"{n} at step {steps}")
            steps += 1
        # Rank 0 decides when the search ends; stop together once every rank knows.
        active = torch.tensor([int(hvd.engine_stats()["autotune_active"])])
        if hvd.allreduce(active, op=hvd.Max, name="at.active").item() == 0:
            return steps
        assert steps < max_steps, f"the search did not end within {max_steps} steps"


def _log_path():
    path = None
    if hvd.rank() == 0:
        path = os.path.join(tempfile.mkdtemp(prefix="hvd-autotune-"), "autotune.csv")
    return hvd.broadcast_object(path, root_rank=0, name="at.log")


def _check_history():
    history = _core.autotune_history()
    everyone = hvd.allgather_object(history, name="at.history")
    assert all(h == everyone[0] for h in everyone), \
        "ranks applied different settings or at different cycles:\n" + "\n".join(
            f"rank {r}: {h}" for r, h in enumerate(everyone))
    # One change per scored point after the start (the start and the best point are
    # scored again when they differ), then the best with the search over.
    assert len(history) in (MAX_SAMPLES, MAX_SAMPLES + 2), history
    assert all(h["active"] for h in history[:-1]) and not history[-1]["active"], history
    cycles = [h["cycle"] for h in history]
    assert cycles == sorted(set(cycles)), cycles
    stats = hvd.engine_stats()
    assert not stats["autotune_active"] and stats["autotune_changes"] == len(history)
    final = history[-1]
    assert all(stats[k] == final[k] for k in TUNABLES), (stats, final)
    return history


def _check_log(path, history):
    if hvd.rank() != 0:
        return
    with open(path) as f:
        lines = f.read().splitlines()
    assert lines[0] == _core.AUTOTUNE_LOG_HEADER
    assert lines[0].startswith(HOROVOD_COLUMNS + ",")
    rows = [line.split(",") for line in lines[1:]]
    assert len(rows) == len(history) + 1, lines
    assert all(len(r) == len(lines[0].split(",")) for r in rows), lines
    scores = [float(r[6]) for r in rows]
    assert all(s > 0 for s in scores), lines
    # The last row is the best: settings of a scored row, with its score or mean score.
    knobs = lambda r: r[:6] + r[7:]  # noqa: E731
    assert any(knobs(r) == knobs(rows[-1]) for r in rows[:-1]), lines
    final = history[-1]
    assert int(rows[-1][7]) == final["fusion_chunk_bytes"], (lines, final)
    assert int(rows[-1][8]) == final["max_call_bytes"], (lines, final)


def test_search_changes_settings_in_step_on_every_rank_with_exact_results():
    path = _log_path()
    try:
        with autotuned_engine(HOROVOD_AUTOTUNE_LOG=path):
            initial = {k: hvd.engine_stats()[k] for k in TUNABLES}
            assert hvd.engine_stats()["autotune_active"]
            _train_until_tuned()
            history = _check_history()
            assert any(any(h[k] != initial[k] for k in TUNABLES) for h in history), history
            # Best values kept after the search: the next steps run on them, still exact.
            jobs = _step_inputs()
            for n, x, op, expected in jobs:
                assert_same(hvd.allreduce(x, name=n, op=op), expected, what=n)
            assert _core.autotune_history() == history
            _check_log(path, history)
    finally:
        if hvd.rank() == 0:
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def test_knobs_set_by_the_user_stay_fixed():
    threshold = 2 * 1024 * 1024 + 4096
    with autotuned_engine(HOROVOD_FUSION_THRESHOLD=str(threshold), HOROVOD_CYCLE_TIME="0.5"):
        _train_until_tuned()
        history = _check_history()
        assert all(h["fusion_threshold_bytes"] == threshold for h in history), history
        assert all(h["cycle_time_ms"] == 0.5 for h in history), history
        assert any(h["fusion_chunk_bytes"] != 1 << 20 or h["max_call_bytes"] != 16 << 20
                   for h in history), history
