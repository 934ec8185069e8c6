"""hvdcompat.ddp in one process: launcher detection, settings, the runner, a 1-rank group."""

import subprocess
import sys
import textwrap

import pytest

from harness import REPO, mpi_env
from hvdcompat.ddp import bootstrap, hooks


def _run(code, extra_env=None, args=()):
    env = mpi_env(extra_env)
    for var in [v for v in env if v.startswith(("OMPI_COMM_WORLD", "PMIX_", "PMI_"))]:
        del env[var]
    return subprocess.run([sys.executable, *(["-c", textwrap.dedent(code)] if code else []),
                           *args], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=120)


@pytest.mark.parametrize("env,mpi,torch_launch", [
    ({}, False, False),
    ({"OMPI_COMM_WORLD_SIZE": "2"}, True, False),
    ({"PMIX_RANK": "0"}, True, False),
    ({"PMI_SIZE": "4"}, True, False),
    ({"TORCHELASTIC_RUN_ID": "x", "RANK": "0"}, False, True),
])
def test_launcher_detection(env, mpi, torch_launch):
    assert bootstrap.launched_by_mpi(env) == mpi
    assert bootstrap.launched_by_torch(env) == torch_launch


def test_bootstrap_does_nothing_without_an_mpi_launcher():
    env = {"RANK": "3"}
    assert bootstrap.bootstrap_env(env) == []
    assert env == {"RANK": "3"}


def test_hook_state_validates_its_arguments():
    with pytest.raises(ValueError, match="compression='fp32'"):
        hooks.HookState(compression="fp32")
    with pytest.raises(ValueError, match="route='mpi'"):
        hooks.HookState(route="mpi")
    assert hooks.HookState(compression="BF16").wire_dtype is not None


def test_accelerate_settings_come_from_the_environment():
    r = _run("""
        import hvdcompat.ddp.accelerate as acc
        assert not acc.is_enabled()              # HVDCOMPAT_DDP_ACCELERATE=0
        assert acc.settings({}) == ("none", "auto")
        assert acc.settings({"HVDCOMPAT_DDP_COMPRESSION": "FP16"}) == ("fp16", "auto")
        try:
            acc.settings({"HVDCOMPAT_DDP_COMPRESSION": "int8"})
        except ValueError as e:
            assert "HVDCOMPAT_DDP_COMPRESSION=int8 is not valid" in str(e), e
        else:
            raise SystemExit("bad compression accepted")
        acc.enable(); assert acc.is_enabled(); acc.disable(); assert not acc.is_enabled()
        print("ok")
    """, {"HVDCOMPAT_DDP_ACCELERATE": "0"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_accelerate_import_fails_early_on_a_bad_setting():
    r = _run("import hvdcompat.ddp.accelerate", {"HVDCOMPAT_DDP_ROUTE": "fastest"})
    assert r.returncode != 0 and "HVDCOMPAT_DDP_ROUTE=fastest is not valid" in r.stderr, r.stderr


def test_runner_usage():
    r = _run(None, args=["-m", "hvdcompat.ddp", "--help"])
    assert r.returncode == 0 and "python -m hvdcompat.ddp" in r.stdout, r.stdout + r.stderr
    r = _run(None, args=["-m", "hvdcompat.ddp"])
    assert r.returncode == 2


def test_one_rank_group_and_refusal_without_mpi_launcher():
    r = _run("""
        import torch, torch.distributed as dist
        import hvdcompat.ddp
        from torch.nn.parallel import DistributedDataParallel as DDP
        try:
            dist.init_process_group("hvdcompat", store=dist.HashStore(), rank=0, world_size=2)
        except RuntimeError as e:
            assert "not started by an MPI launcher" in str(e) and "torchrun" in str(e), e
        else:
            raise SystemExit("a 2-rank group without MPI was accepted")
        dist.init_process_group("hvdcompat", store=dist.HashStore(), rank=0, world_size=1)
        t = torch.arange(4.0)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        assert torch.equal(t, torch.arange(4.0))
        model = DDP(torch.nn.Linear(3, 1))
        model(torch.ones(2, 3)).sum().backward()
        assert torch.allclose(model.module.weight.grad, torch.full((1, 3), 2.0))
        dist.destroy_process_group()
        print("ok")
    """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
