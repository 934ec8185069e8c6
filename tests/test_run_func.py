"""hvdcompat.run (Horovod's horovod.run): values in rank order, a rank's exception, the parameters.

The jobs run on this machine under mpirun at 2 and 3 ranks; each is bounded by
SIGALRM, whose exception makes run() stop the job it started.
"""

import os
import signal
import sys
import threading

import cloudpickle
import pytest
import torch

import hvdcompat as hvd
from hvdcompat.runner import run_func
from hvdcompat.runner.elastic import run_func as elastic_run
from hvdcompat.exceptions import HorovodInternalError
from hvdcompat.runner.run_func import RankFailedError
from hvdcompat.runner.run_task import world_rank
from hvdcompat.runner import launch

TIMEOUT = int(os.environ.get("HVDCOMPAT_TEST_TIMEOUT", "300"))
# Generous: ranks import torch before they connect, slowly on a loaded machine.
START = 180

# The ranks cannot import this test module; its functions travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def deadline():
    def expire(signum, frame):
        raise TimeoutError(f"hvdcompat.run did not return within {TIMEOUT} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(TIMEOUT)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def root_ok(monkeypatch):
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")


def _rank_report(offset, scale=1):
    hvd.init()
    print(f"rank {hvd.rank()} reporting", flush=True)
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
    return {"rank": hvd.rank(), "size": hvd.size(), "sum": total,
            "value": offset + scale * hvd.rank()}


def _expected(size, offset, scale=1):
    return [{"rank": r, "size": size, "sum": size * (size + 1) / 2, "value": offset + scale * r}
            for r in range(size)]


def _fail_on_rank_one():
    rank = world_rank()
    if rank == 1:
        raise ValueError(f"bad input on rank {rank}")
    return rank


def test_values_come_back_in_rank_order_with_kwargs_and_hosts(deadline, root_ok):
    values = hvd.run(_rank_report, args=(10,), kwargs={"scale": 3}, num_proc=2,
                     hosts="localhost:2", start_timeout=START)
    assert values == _expected(2, 10, 3)


def test_three_ranks_with_output_files(deadline, root_ok, tmp_path):
    assert hvd.run(_rank_report, args=(-5,), num_proc=3, start_timeout=START,
                   output_filename=tmp_path / "out") == _expected(3, -5)
    for rank in range(3):
        files = list((tmp_path / "out").glob(f"*/rank.{rank}/stdout"))
        assert len(files) == 1, sorted(str(p) for p in (tmp_path / "out").rglob("*"))
        assert f"rank {rank} reporting" in files[0].read_text()


def test_exception_on_one_rank_names_it_with_its_traceback(deadline, root_ok):
    with pytest.raises(RankFailedError) as info:
        hvd.run(_fail_on_rank_one, num_proc=3, start_timeout=START)
    error = info.value
    assert isinstance(error, HorovodInternalError)
    assert error.rank == 1 and error.failed_ranks == [1]
    assert error.exception_type == "ValueError"
    text = str(error)
    assert "raised ValueError: bad input on rank 1 on rank 1 of 3" in text
    assert "_fail_on_rank_one" in text and "traceback on rank 1" in text
    assert "_fail_on_rank_one" in error.remote_traceback
    assert isinstance(error.__cause__, ValueError)
    assert str(error.__cause__) == "bad input on rank 1"


# ---------------------------------------------------------------- no job started

def _noop():
    return None


def test_deprecated_np_warns_and_gloo_refuses_what_it_cannot_do():
    with pytest.warns(DeprecationWarning, match="np= is deprecated, use num_proc="):
        with pytest.raises(ValueError, match="starts no mpirun, so mpi_args has nothing"):
            hvd.run(_noop, np=2, use_gloo=True, mpi_args="--bind-to none")
    with pytest.raises(ValueError, match="cannot both be True"):
        hvd.run(_noop, use_gloo=True, use_mpi=True)
    with pytest.raises(ValueError, match=r"elastic jobs \(min_num_proc\) run on MPI only"):
        hvd.run(_noop, num_proc=2, min_num_proc=1, use_gloo=True)


def _gloo_report(offset):
    from hvdcompat.runner import mpi_world

    report = _rank_report(offset)
    report["gloo"] = (hvd.gloo_enabled(), hvd.mpi_enabled(), mpi_world.launched_by_mpi())
    return report


@pytest.mark.parametrize("size", [2, 3])
def test_use_gloo_runs_the_ranks_on_the_gloo_controller(deadline, size, tmp_path):
    # Horovod's horovod.run(use_gloo=True): no mpirun; the values still come back by rank.
    values = hvd.run(_gloo_report, args=(7,), num_proc=size, use_gloo=True, start_timeout=START,
                     output_filename=tmp_path / "out")
    assert values == [dict(e, gloo=(True, False, False)) for e in _expected(size, 7)]
    for rank in range(size):
        assert f"rank {rank} reporting" in (tmp_path / "out" / f"rank.{rank}" / "stdout").read_text()


def _elastic_sum(steps, fail_rank, fail_step):
    """Sums hvd.size() over `steps` committed steps; world rank `fail_rank` raises at `fail_step`."""
    hvd.init()
    first = hvd.rank()
    state = hvd.elastic.TorchState(step=0, total=0.0, sizes=[])

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            if first == fail_rank and state.step == fail_step:
                raise RuntimeError(f"injected failure on rank {first} at step {state.step}")
            ones = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, name=f"step.{state.step}")
            state.total += ones.item()
            state.sizes = state.sizes + [hvd.size()]
            state.step += 1
            state.commit()

    train(state)
    return {"first_rank": first, "rank": hvd.rank(), "size": hvd.size(), "total": state.total,
            "sizes": state.sizes}


def test_elastic_run_returns_the_survivors_values_after_a_rank_fails(deadline, root_ok):
    steps, fail_step = 5, 2
    values = hvd.run(_elastic_sum, args=(steps, 1, fail_step), num_proc=3, min_num_proc=2,
                     reset_limit=1, start_timeout=START)
    # World rank 1 left; 0 and 2 are the final world's ranks 0 and 1, in that order.
    sizes = [3] * fail_step + [2] * (steps - fail_step)
    assert values == [{"first_rank": first, "rank": rank, "size": 2, "total": float(sum(sizes)),
                       "sizes": sizes} for rank, first in enumerate((0, 2))]


def test_elastic_run_that_cannot_continue_raises_the_ranks_error(deadline, root_ok):
    # min_num_proc 3: after losing a rank the survivors cannot go on.
    with pytest.raises(RankFailedError) as info:
        hvd.run(_elastic_sum, args=(4, 1, 1), num_proc=3, min_num_proc=3, start_timeout=START)
    text = str(info.value)
    assert "injected failure on rank 1 at step 1" in text, text
    assert "fewer than --min-np 3" in text, text


@pytest.mark.parametrize("kwargs, message", [
    ({"num_proc": 2, "min_num_proc": 3}, "-np 2 is below --min-np 3"),
    ({"num_proc": 4, "max_num_proc": 2}, "-np 4 is above --max-np 2"),
    ({"num_proc": 2, "min_num_proc": 3, "max_num_proc": 2}, "--min-np 3 is above --max-np 2"),
    ({"num_proc": 2, "min_num_proc": 0}, "min_num_proc must be a whole number >= 1, got 0"),
    ({"num_proc": 2, "slots": "4"}, "slots must be a whole number >= 1, got '4'"),
    ({"num_proc": 2, "reset_limit": -1}, "reset_limit must be a whole number >= 0"),
    ({"num_proc": 2, "cooldown_range": (10, 1)}, r"cooldown_range must be a pair \(MIN, MAX\)"),
    ({"num_proc": 2, "cooldown_range": 5}, r"cooldown_range must be a pair"),
    ({"hosts": "localhost:2", "host_discovery_script": "/bin/true"},
     "host_discovery_script replaces hosts/hostfile"),
])
def test_bad_elastic_parameters_fail_before_launching(kwargs, message, root_ok):
    with pytest.raises(ValueError, match=message):
        hvd.run(_noop, **kwargs)


def test_elastic_parameters_become_hvdcompatrun_elastic_flags(tmp_path):
    script = tmp_path / "discover.sh"
    parser = run_func._launcher_parser()
    tokens = run_func._launcher_options(parser, None, None, None, None, None, {}) + \
        elastic_run.elastic_options({"min_num_proc": 2, "max_num_proc": 4, "slots": 2,
                                     "reset_limit": 3, "cooldown_range": (1, 9),
                                     "host_discovery_script": script, "elastic_timeout": 30},
                                    None, None)
    options = parser.parse_args(tokens)
    assert (options.num_proc, options.min_np, options.max_np, options.slots_per_host,
            options.reset_limit, options.blacklist_cooldown_range, options.host_discovery_script,
            options.elastic_timeout) == (None, 2, 4, 2, 3, [1, 9], str(script), 30)


def test_deprecated_min_np_and_max_np_map_to_the_elastic_parameters(root_ok):
    with pytest.warns(DeprecationWarning, match="min_np= is deprecated"):
        with pytest.raises(ValueError, match="-np 1 is below --min-np 2"):
            hvd.run(_noop, min_np=2)
    with pytest.warns(DeprecationWarning, match="max_np= is deprecated"):
        with pytest.raises(ValueError, match="-np 9 is above --max-np 8"):
            hvd.run(_noop, num_proc=9, max_np=8)


def test_caller_mistakes_fail_before_launching(tmp_path):
    with pytest.raises(ValueError, match="hosts or hostfile, not both"):
        hvd.run(_noop, hosts="localhost:2", hostfile=str(tmp_path / "h"))
    with pytest.raises(ValueError, match="num_proc must be"):
        hvd.run(_noop, num_proc=0)
    with pytest.raises(TypeError, match="must be callable"):
        hvd.run(42)
    with pytest.raises(TypeError, match="picklable with cloudpickle"):
        hvd.run(_noop, args=(threading.Lock(),))
    with pytest.raises(ValueError, match="more ranks than the hosts have slots"):
        hvd.run(_noop, num_proc=3, hosts="localhost:2")
    with pytest.raises(ValueError, match="start_timeout must be positive"):
        hvd.run(_noop, start_timeout=0)


def test_parameters_become_hvdcompatrun_options():
    parser = run_func._launcher_parser()
    tokens = run_func._launcher_options(parser, 4, "localhost:4", None,
                                        "--mca btl self,tcp", 2, {})
    options = parser.parse_args(tokens)
    assert (options.num_proc, options.hosts, options.mpi_args, options.verbose) == \
        (4, "localhost:4", "--mca btl self,tcp", True)
    with pytest.raises(ValueError, match="hvdcompat.run: "):
        parser.parse_args(["--no-such-option"])  # never exits the caller's process


def test_an_option_the_launcher_lacks_says_what_to_pass_instead():
    bare = launch.build_parser()
    bare._option_string_actions = {k: v for k, v in bare._option_string_actions.items()
                                   if "ssh" not in v.dest}
    with pytest.raises(ValueError, match="no --ssh-port option.*mpi_args="):
        run_func._launcher_options(bare, 2, None, None, None, None, {"ssh_port": 2222})
