"""hvdcompat's DDP communication hooks and the accelerate import, on a gloo default group.

Each DDP run with a hook is compared with the same run without one (DDP's
own allreduce): equal for the plain hook, within half precision for the
compressed ones.
"""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import hvdcompat as hvd
import hvdcompat.ddp
from hvdcompat.ddp import hooks
from parallel_util import default_group

TOLERANCE = {hooks.allreduce_hook: 1e-6, hooks.fp16_compress_hook: 5e-3,
             hooks.bf16_compress_hook: 4e-2}


@pytest.fixture(scope="module", autouse=True)
def gloo_default_group():
    with default_group("gloo"):
        yield


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 40), torch.nn.Tanh(), torch.nn.Linear(40, 24),
                               torch.nn.Tanh(), torch.nn.Linear(24, 3))


def train(model, steps=5):
    r = dist.get_rank()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + r)
        x, y = torch.randn(4, 6, generator=g) + r, torch.randn(4, 3, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


# Tiny buckets: one per parameter, so fusion and the last-bucket flush are exercised.
BUCKETS = {"bucket_cap_mb": 0.0001}


def baseline():
    return train(DDP(make_model(), **BUCKETS))


def assert_close(params, expected, tol):
    for a, b in zip(params, expected):
        assert torch.allclose(a, b, atol=tol, rtol=0), (a - b).abs().max()


def test_the_engine_route_is_chosen_under_mpirun():
    state = hooks.HookState()
    assert state.route == "engine", state.route_reason
    assert "hvdcompat engine" in state.describe()
    # Compressed buckets take the engine too.
    assert hooks.HookState(compression="fp16").resolve() == "engine"


@pytest.mark.parametrize("hook", list(TOLERANCE), ids=lambda h: h.__name__)
@pytest.mark.parametrize("route,fusion", [("engine", 0), ("process_group", 0),
                                          ("process_group", 1 << 20)])
def test_hook_matches_ddp_without_hook(hook, route, fusion):
    model = DDP(make_model(), **BUCKETS)
    state = hooks.HookState(route=route, fusion_threshold=fusion)
    model.register_comm_hook(state, hook)
    params = train(model)
    assert state.route == route
    assert_close(params, baseline(), TOLERANCE[hook])


@pytest.mark.parametrize("state", ["none", "group"])
def test_hooks_accept_torch_style_states(state):
    group = dist.distributed_c10d._get_default_group() if state == "group" else None
    model = DDP(make_model(), **BUCKETS)
    model.register_comm_hook(group, hooks.allreduce_hook)
    assert_close(train(model), baseline(), 1e-6)


def test_hook_on_the_hvdcompat_backend_group():
    ours = dist.new_group(backend="hvdcompat")
    model = DDP(make_model(), process_group=ours, **BUCKETS)
    state = hooks.register(model, compression="fp16", fusion_threshold=1 << 16)
    assert state.route == "engine"
    assert_close(train(model), baseline(), TOLERANCE[hooks.fp16_compress_hook])
    dist.destroy_process_group(ours)


def test_engine_route_reuses_bucket_names_across_iterations():
    model = DDP(make_model(), **BUCKETS)
    hooks.register(model)
    train(model, steps=3)  # the first iterations rebuild buckets and fill the cache
    hvd.reset_engine_stats()
    train(model, steps=3)
    stats = hvd.engine_stats()
    # Several buckets per step, every one found in the response cache.
    assert stats["tensors"] >= 3 * 2 and stats["tensors"] % 3 == 0, stats
    assert stats["cache_misses"] == 0 and stats["cache_hits"] == stats["tensors"], stats


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="compression='fp8'"):
        hooks.HookState(compression="fp8")
    with pytest.raises(ValueError, match="route='nccl'"):
        hooks.HookState(route="nccl")


def test_accelerate_installs_the_hook_and_yields_to_the_scripts_own(monkeypatch, capfd):
    from hvdcompat.ddp import accelerate

    try:
        accelerate.enable()
        model = DDP(make_model(), **BUCKETS)
        params = train(model)
        assert model._hvdcompat_hook_state.route == "engine"
        assert_close(params, baseline(), 1e-6)
        err = capfd.readouterr().err
        assert ("hvdcompat.ddp.accelerate:" in err) == (dist.get_rank() == 0), err

        own = DDP(make_model(), **BUCKETS)
        own.register_comm_hook(None, default_hooks.allreduce_hook)
        train(own, steps=1)
        assert not hasattr(own, "_hvdcompat_hook_state")

        monkeypatch.setenv("HVDCOMPAT_DDP_COMPRESSION", "bf16")
        monkeypatch.setenv("HVDCOMPAT_DDP_ROUTE", "process_group")
        compressed = DDP(make_model(), **BUCKETS)
        params = train(compressed)
        assert compressed._hvdcompat_hook_state.wire_dtype == torch.bfloat16
        assert compressed._hvdcompat_hook_state.route == "process_group"
        assert_close(params, baseline(), TOLERANCE[hooks.bf16_compress_hook])
    finally:
        accelerate.disable()
    assert not accelerate.is_enabled()
    plain = DDP(make_model(), **BUCKETS)
    train(plain, steps=1)
    assert not hasattr(plain, "_hvdcompat_hook_state")
