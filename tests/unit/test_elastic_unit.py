"""hvd.elastic without communication: sampler arithmetic over world-size changes, state handlers.

The world is faked (rank/size patched), so each test plays every rank of a
world in one process and can change the world's size between steps.
"""

import collections

import pytest
import torch

import hvdcompat as hvd
from hvdcompat.elastic import sampler as sampler_mod
from hvdcompat.elastic import state as state_mod


class FakeWorld:
    def __init__(self, monkeypatch, size):
        self.size, self.rank = size, 0
        monkeypatch.setattr(sampler_mod, "size", lambda: self.size)
        monkeypatch.setattr(sampler_mod, "rank", lambda: self.rank)


def shards(world, sampler_state, n, shuffle=True, seed=0):
    """Each rank's iteration order under `sampler_state`, as a list per rank."""
    out = []
    for r in range(world.size):
        world.rank = r
        s = hvd.elastic.ElasticSampler(list(range(n)), shuffle=shuffle, seed=seed)
        s.load_state_dict(sampler_state)
        out.append(list(iter(s)))
        assert len(s) == len(out[-1])
    return out


@pytest.mark.parametrize("n", [12, 13, 24, 7])
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_shards_cover_the_epoch_and_are_equal_length(monkeypatch, n, size):
    world = FakeWorld(monkeypatch, size)
    parts = shards(world, {"epoch": 0, "processed_num": 0}, n)
    assert len({len(p) for p in parts}) == 1  # every rank runs the same number of steps
    seen = collections.Counter(i for p in parts for i in p)
    assert set(seen) == set(range(n))
    # Only the padding to equal length repeats samples: fewer than `size` of them.
    assert sum(seen.values()) - n == (-n) % size


def test_set_epoch_reshuffles_identically_on_every_rank(monkeypatch):
    world = FakeWorld(monkeypatch, 2)
    a = shards(world, {"epoch": 3, "processed_num": 0}, 20)
    b = shards(world, {"epoch": 3, "processed_num": 0}, 20)
    c = shards(world, {"epoch": 4, "processed_num": 0}, 20)
    assert a == b and a != c
    plain = shards(world, {"epoch": 3, "processed_num": 0}, 20, shuffle=False)
    assert plain == [list(range(0, 20, 2)), list(range(1, 20, 2))]


def _train(world, state, n, batch, batches):
    """Every rank processes `batches` batches; returns the indices they processed."""
    done = []
    parts = shards(world, state, n)
    for r, part in enumerate(parts):
        done += part[:batch * batches]
    world.rank = 0
    s = hvd.elastic.ElasticSampler(list(range(n)))
    s.load_state_dict(state)
    for b in range(batches):
        s.record_batch(b, batch)
    return done, s.state_dict()


@pytest.mark.parametrize("schedule", [[3, 2], [3, 2, 1], [2, 4, 3], [4, 3, 2, 1]])
def test_an_epoch_across_world_size_changes_sees_every_sample_once(monkeypatch, schedule):
    # 6 batches per world leave a rest that the last world divides evenly.
    n, batch = 240, 2
    world = FakeWorld(monkeypatch, schedule[0])
    state = {"epoch": 1, "processed_num": 0}
    seen = []
    for i, size in enumerate(schedule):
        world.size = size
        if i == len(schedule) - 1:  # the last world finishes the epoch
            rest = n - state["processed_num"]
            assert rest % (size * batch) == 0
            batches = rest // (size * batch)
        else:
            batches = 6
        done, state = _train(world, state, n, batch, batches)
        seen += done
    assert state["processed_num"] == n
    assert sorted(seen) == list(range(n))  # every sample exactly once


def test_a_restore_rolls_back_to_the_committed_count(monkeypatch):
    world = FakeWorld(monkeypatch, 3)
    committed = {"epoch": 0, "processed_num": 0}
    _, after_commit = _train(world, committed, 60, 2, 2)  # committed: 12 processed
    assert after_commit["processed_num"] == 12
    _, uncommitted = _train(world, after_commit, 60, 2, 3)  # lost with the failure
    assert uncommitted["processed_num"] == 30
    world.size = 2  # restore the commit on the survivors
    parts = shards(world, after_commit, 60)
    order = hvd.elastic.ElasticSampler(list(range(60))).order()
    assert sorted(parts[0] + parts[1]) == sorted(order[12:])
    assert [len(p) for p in parts] == [24, 24]


def test_record_batch_never_counts_past_the_epoch(monkeypatch):
    FakeWorld(monkeypatch, 3)
    s = hvd.elastic.ElasticSampler(list(range(10)))
    assert len(s) == 4  # 10 over 3 ranks, padded to 12
    for b in range(4):
        s.record_batch(b, 1)
    assert s.processed_num == 10
    s.load_state_dict(s.state_dict())  # as after a reset: nothing is left this epoch
    assert len(s) == 0 and list(iter(s)) == []


def test_fewer_samples_left_than_ranks_pads_every_rank(monkeypatch):
    world = FakeWorld(monkeypatch, 4)
    parts = shards(world, {"epoch": 0, "processed_num": 9}, 10)
    assert all(len(p) == 1 for p in parts)
    order = hvd.elastic.ElasticSampler(list(range(10))).order()
    assert {p[0] for p in parts} == {order[9]}


# --- state and handlers (broadcasts faked: a one-rank world) -------------------------------

@pytest.fixture
def one_rank(monkeypatch):
    FakeWorld(monkeypatch, 1)
    monkeypatch.setattr(state_mod, "broadcast_object", lambda obj, *a, **k: obj)
    monkeypatch.setattr(state_mod, "broadcast_parameters", lambda params, root_rank: None)
    monkeypatch.setattr(state_mod, "broadcast_optimizer_state", lambda opt, root_rank: None)
    monkeypatch.setattr(state_mod, "rank", lambda: 0)


def test_restore_returns_the_last_commit_for_every_handled_kind(one_rank, monkeypatch):
    from hvdcompat.elastic import common

    monkeypatch.setattr(common.State, "check_host_updates", lambda self: None)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    sampler = hvd.elastic.ElasticSampler(list(range(8)))
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, tags=["a"])
    assert set(state._handlers) == {"model", "optimizer", "sampler"}

    def step():
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        opt.zero_grad()

    step()
    state.epoch = 1
    sampler.record_batch(0, 2)
    state.commit()
    committed = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = opt.state_dict()["state"][0]["momentum_buffer"].clone()
    step()
    state.epoch = 2
    sampler.record_batch(1, 2)
    state.restore()
    for k, v in model.state_dict().items():
        assert torch.equal(v, committed[k])
    assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], momentum)
    assert state.epoch == 1 and sampler.processed_num == 2


def test_reassigning_a_handled_attribute_saves_the_new_value(one_rank):
    state = hvd.elastic.TorchState(model=torch.nn.Linear(1, 1))
    other = torch.nn.Linear(1, 1)
    with torch.no_grad():
        other.weight.fill_(7.0)
    state.model = other
    with torch.no_grad():
        other.weight.fill_(0.0)
    state.restore()
    assert state.model is other and other.weight.item() == 7.0


def test_the_handler_registry_is_extensible(one_rank):
    class Counter:
        def __init__(self):
            self.n = 0

    class CounterHandler(hvd.elastic.StateHandler):
        def __init__(self, value):
            super().__init__(value)
            self.saved = value.n

        def save(self):
            self.saved = self.value.n

        def restore(self):
            self.value.n = self.saved

        def sync(self):
            pass

    registry = hvd.elastic.get_handler_registry()
    hvd.elastic.set_handler_registry([(Counter, CounterHandler)] + list(registry))
    try:
        c = Counter()
        state = hvd.elastic.TorchState(counter=c)
        assert isinstance(state._handlers["counter"], CounterHandler)
        c.n = 5
        state.save()
        c.n = 9
        state.restore()
        assert c.n == 5
    finally:
        hvd.elastic.set_handler_registry(registry)


def test_object_state_syncs_and_restores_plain_values():
    sent = []

    def bcast(obj):
        sent.append(obj)
        return {"lr": 0.1, "step": 3}  # what "rank 0" holds

    state = hvd.elastic.ObjectState(bcast, lambda: 1, lr=0.2, step=0)
    state.sync()
    assert (state.lr, state.step) == (0.1, 3) and sent == [{"lr": 0.2, "step": 0}]
    state.step = 4
    state.restore()
    assert state.step == 3


def test_host_notices_raise_with_skip_sync_only_for_removals(monkeypatch):
    from hvdcompat.elastic import common

    monkeypatch.setattr("hvdcompat.elastic.notifications.poll", lambda state: None)
    state = common.ObjectState(lambda obj: obj, lambda: 0, x=1)
    state.check_host_updates()  # nothing queued: no interrupt
    state.on_hosts_updated(1.0, hvd.elastic.HostUpdateResult.removed)
    with pytest.raises(hvd.HostsUpdatedInterrupt) as e:
        state.check_host_updates()
    assert e.value.skip_sync is True
    state.on_hosts_updated(2.0, hvd.elastic.HostUpdateResult.removed)
    state.on_hosts_updated(3.0, hvd.elastic.HostUpdateResult.added)
    with pytest.raises(hvd.HostsUpdatedInterrupt) as e:
        state.check_host_updates()
    assert e.value.skip_sync is False
    state.on_hosts_updated(2.5, hvd.elastic.HostUpdateResult.added)  # older than the last seen
    state.check_host_updates()


# --- the run loop (reset and agreement faked) ------------------------------------------------

class RecordingState(hvd.elastic.ObjectState):
    def __init__(self):
        super().__init__(lambda obj: obj, lambda: 0, attempt=0)
        self.log = []

    def sync(self):
        self.log.append("sync")

    def restore(self):
        self.log.append("restore")

    def on_reset(self):
        self.log.append("on_reset")


@pytest.fixture
def loop(monkeypatch):
    from hvdcompat.elastic import loop as loop_mod

    exits = []
    monkeypatch.setattr(loop_mod, "_agree_after_reset", lambda skip, resets: (skip, resets))
    monkeypatch.setattr(loop_mod.basics, "_exit_as_failed_rank", lambda: exits.append(1))
    monkeypatch.delenv("HVDCOMPAT_ELASTIC_RESET_LIMIT", raising=False)
    return loop_mod, exits


def test_run_restores_after_an_internal_error_and_skips_sync_only_when_agreed(loop):
    loop_mod, exits = loop
    state = RecordingState()
    errors = [hvd.HorovodInternalError("lost"), hvd.HostsUpdatedInterrupt(skip_sync=True),
              hvd.HostsUpdatedInterrupt(skip_sync=False)]

    def func(state):
        state.log.append("func")
        if errors:
            raise errors.pop(0)
        return "done"

    resets = []
    assert loop_mod.run_fn(func, lambda: resets.append(1))(state) == "done"
    assert state.log == ["sync", "func", "restore", "on_reset", "sync", "func",  # internal error
                         "on_reset", "func",                                    # removed: skip
                         "on_reset", "sync", "func"]                            # added: sync
    assert len(resets) == 3 and not exits


def test_run_stops_at_the_reset_limit_and_leaves_as_a_failed_rank(loop, monkeypatch):
    loop_mod, exits = loop
    monkeypatch.setenv("HVDCOMPAT_ELASTIC_RESET_LIMIT", "2")
    resets = []

    def func(state):
        raise hvd.HorovodInternalError("lost again")

    with pytest.raises(hvd.HorovodInternalError, match=r"reset limit \(--reset-limit 2\)"):
        loop_mod.run_fn(func, lambda: resets.append(1))(RecordingState())
    assert len(resets) == 2 and exits == [1]


def test_reset_below_min_np_is_a_clear_error(monkeypatch):
    from hvdcompat.elastic import loop as loop_mod

    monkeypatch.setenv("HVDCOMPAT_ELASTIC_MIN_NP", "3")
    monkeypatch.setattr(loop_mod, "_leave_if_host_removed", lambda: None)
    monkeypatch.setattr(loop_mod.basics, "_elastic_reset", lambda: [0, 2])
    monkeypatch.setattr(loop_mod.basics, "size", lambda: 2)
    with pytest.raises(hvd.HorovodInternalError,
                       match=r"only 2 rank\(s\) are left \(the old world's ranks \[0, 2\]\), "
                             r"fewer than --min-np 3"):
        loop_mod.reset()
    monkeypatch.setenv("HVDCOMPAT_ELASTIC_MIN_NP", "2")
    assert loop_mod.reset() == [0, 2]


def test_torch_state_saved_values_carry_the_last_commit_into_a_new_state(one_rank, monkeypatch):
    from hvdcompat.elastic import ElasticSampler, TorchState, common

    monkeypatch.setattr(common.State, "check_host_updates", lambda self: None)

    def make():
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sampler = ElasticSampler(list(range(10)), shuffle=False)
        return model, opt, sampler, TorchState(model, opt, sampler=sampler, epoch=0, batch=0)

    model, opt, sampler, state = make()
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    sampler.record_batch(0, 4)
    state.epoch, state.batch = 1, 4
    state.commit()
    committed = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight += 1  # after the commit: not carried over
    values = torch.load(_roundtrip(state.saved_values()), weights_only=False)
    model2, opt2, sampler2, state2 = make()
    state2.load_saved_values(values)
    assert all(torch.equal(model2.state_dict()[k], committed[k]) for k in committed)
    assert opt2.state_dict()["state"][0]["momentum_buffer"].shape == (2, 3)
    assert (state2.epoch, state2.batch) == (1, 4)
    assert sampler2.state_dict() == {"epoch": 0, "processed_num": 4}


def _roundtrip(obj):
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf

