"""hvd.elastic on a healthy world: sync takes rank 0's state, commit/restore, the run loop's resets.

The lost-rank scenarios (ULFM) are in tests/test_elastic_scenarios.py.
"""

import os
import tempfile
import time

import torch

import hvdcompat as hvd


def _model(value):
    m = torch.nn.Linear(3, 2)
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(value)
    return m


def test_sync_takes_rank_zeros_model_optimizer_sampler_and_values():
    r = hvd.rank()
    model = _model(float(r + 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (r + 1), momentum=0.5)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()  # momentum buffers differ per rank
    sampler = hvd.elastic.ElasticSampler(list(range(6 * hvd.size())), seed=4)
    sampler.processed_num = 2 * hvd.size() * (r + 1)
    sampler.epoch = 3 + r
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, batch=10 + r, note=f"rank{r}")
    state.sync()
    ref = _model(1.0)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.5)
    ref(torch.ones(1, 3)).sum().backward()
    ref_opt.step()
    for a, b in zip(model.state_dict().values(), ref.state_dict().values()):
        assert torch.equal(a, b)
    assert opt.param_groups[0]["lr"] == 0.1
    assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"],
                       ref_opt.state_dict()["state"][0]["momentum_buffer"])
    assert (state.batch, state.note) == (10, "rank0")
    assert (sampler.epoch, sampler.processed_num) == (3, 2 * hvd.size())
    # Re-partitioned over this world: 4 per rank left, no overlap.
    parts = hvd.allgather_object(list(iter(sampler)))
    flat = [i for p in parts for i in p]
    assert all(len(p) == 4 for p in parts) and len(set(flat)) == len(flat)
    assert sorted(flat) == sorted(sampler.order()[2 * hvd.size():])


def _shared_dir():
    path = tempfile.mkdtemp(prefix="hvd-notices-") if hvd.rank() == 0 else None
    return hvd.broadcast_object(path, name="elastic.notices.dir")


def test_a_host_notice_to_rank_zero_interrupts_every_rank_at_commit(monkeypatch):
    directory = _shared_dir()
    monkeypatch.setenv("HVDCOMPAT_ELASTIC_DIR", directory)
    from hvdcompat.elastic import notifications

    monkeypatch.setattr(notifications, "_offset", [0])
    state = hvd.elastic.TorchState(_model(0.0), batch=0)
    state.commit()  # no notice yet
    if hvd.rank() == 0:  # only rank 0 reads notices; the others learn from its broadcast
        with open(os.path.join(directory, "notices"), "w") as f:
            f.write(f"{time.time()} {int(hvd.elastic.HostUpdateResult.removed)} elsewhere\n")
    raised = None
    try:
        state.commit()
    except hvd.HostsUpdatedInterrupt as e:
        raised = e.skip_sync
    assert hvd.allgather_object(raised) == [True] * hvd.size()
    state.commit()  # the notice is consumed
    assert not notifications.host_removed()  # "elsewhere" is not this host
    hvd.barrier()
    if hvd.rank() == 0:
        os.remove(os.path.join(directory, "notices"))
        os.rmdir(directory)


def test_run_resets_and_retries_after_hosts_updated_and_every_rank_syncs_unless_all_skip():
    model = _model(float(hvd.rank()))
    state = hvd.elastic.TorchState(model, attempt=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])
    syncs = []
    real_sync = state.sync

    def counting_sync():
        syncs.append(state.attempt)
        real_sync()

    state.sync = counting_sync

    @hvd.elastic.run
    def train(state, rounds):
        state.attempt += 1
        if state.attempt < rounds:
            state.commit()
            # Only rank 0 could skip the sync: ranks disagree, so all sync
            # (Horovod issue #3494).
            raise hvd.HostsUpdatedInterrupt(skip_sync=hvd.rank() == 0)
        return hvd.allreduce(model.weight.data, name="elastic.final", op=hvd.Sum)

    total = train(state, 3)
    assert resets == [hvd.size(), hvd.size()]  # the world is unchanged: nobody was lost
    assert syncs == [0, 1, 2]  # the first call and after each of the two resets
    assert torch.equal(total, torch.zeros_like(total))  # rank 0's zeros, synced to all
    assert hvd.rank() == hvd.allgather_object(hvd.rank())[hvd.rank()]


def test_run_restores_the_last_commit_after_an_internal_error():
    state = hvd.elastic.TorchState(_model(1.0), step=0)

    @hvd.elastic.run
    def train(state):
        state.step += 1
        if state.step == 1:
            state.commit()  # step 1 committed
            state.step = 50  # lost: not committed
            raise hvd.HorovodInternalError("simulated failure of a collective")
        return state.step

    assert train(state) == 2  # restored to 1, then incremented again


def test_a_reset_without_a_lost_rank_keeps_the_world_and_the_process_sets():
    hvd.shutdown()
    hvd.init(process_sets="dynamic")
    try:
        last = hvd.size() - 1
        members = [0, last] if hvd.size() > 2 else [0]  # not the whole world
        pair = hvd.add_process_set(members)
        before = (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
                  hvd.cross_size())
        survivors = hvd.elastic.reset()
        assert survivors == list(range(hvd.size()))
        assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
                hvd.cross_size()) == before
        assert pair.process_set_id == 1 and pair.ranks == members
        if hvd.rank() in members:
            got = hvd.allreduce(torch.tensor([float(hvd.rank())]), name="elastic.pair",
                                op=hvd.Sum, process_set=pair)
            assert got.item() == float(sum(members))
        total = hvd.allreduce(torch.ones(1), name="elastic.after_reset", op=hvd.Sum)
        assert total.item() == hvd.size()
        third = hvd.add_process_set([last])  # ids continue after the kept ones
        assert third.process_set_id == 2
    finally:
        hvd.shutdown()
        hvd.init()
