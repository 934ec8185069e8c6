"""The engine's rules are checked by the core, once, whichever API reaches them.

Each mistake is a ValueError raised at the call, with nothing enqueued, and
its one message names the op, the tensor, this rank, the ranks involved and
what to do. (tests/unit/test_core_rules.py, and the last test here, call the
core directly with bad arguments: each rule is the core's own.)
"""

import os

os.environ.setdefault("HOROVOD_DYNAMIC_PROCESS_SETS", "1")  # read at hvd.init()

import pytest  # noqa: E402
import torch  # noqa: E402

import hvdcompat as hvd  # noqa: E402


def _message(call):
    with pytest.raises(ValueError) as info:
        call()
    assert type(info.value) is ValueError, type(info.value)
    return str(info.value)


def _names(message, *parts):
    for part in parts:
        assert part in message, f"{part!r} missing in: {message}"


def _subject(op, name):
    return f"{op} '{name}' on rank {hvd.rank()}"


def _still_works(tag, process_set=hvd.global_process_set):
    k = process_set.size()
    out = hvd.allreduce(torch.ones(2), op=hvd.Sum, name=f"rules.after.{tag}",
                        process_set=process_set)
    assert out.tolist() == [float(k)] * 2


def _ranks(ranks):
    return "[" + ", ".join(str(r) for r in ranks) + "]"


def test_a_name_in_flight_is_refused_until_synchronized():
    n = hvd.size()
    first = hvd.allreduce_async(torch.ones(2), op=hvd.Sum, name="rules.held")
    # The same name through another API reaches the same rule.
    for call in (lambda: hvd.allreduce_async(torch.ones(2), op=hvd.Sum, name="rules.held"),
                 lambda: hvd.allreduce_(torch.ones(2), op=hvd.Sum, name="rules.held")):
        msg = _message(call)
        _names(msg, _subject("allreduce", "allreduce.rules.held"), "still in flight",
               "same name as another tensor", "hvd.synchronize")
    assert hvd.synchronize(first).tolist() == [float(n)] * 2
    # Synchronized: the name is free again.
    assert hvd.allreduce(torch.ones(2), op=hvd.Sum, name="rules.held").tolist() == [float(n)] * 2


def test_names_on_a_removed_set_are_freed():
    n = hvd.size()
    old = hvd.add_process_set([0])
    held = None
    if hvd.rank() == 0:
        # A one-rank set completes at once; the name stays taken until synchronized.
        held = hvd.allreduce_async(torch.full((2,), 3.0), op=hvd.Sum, name="rules.orphan",
                                   process_set=old)
        msg = _message(lambda: hvd.allreduce_async(torch.ones(2), name="rules.orphan",
                                                   process_set=old))
        _names(msg, _subject("allreduce", "allreduce.rules.orphan"),
               f"in process set {old.process_set_id}")
    old_id = old.process_set_id
    assert hvd.remove_process_set(old) is True
    new = hvd.add_process_set([0])
    try:
        assert new.process_set_id == old_id  # the freed id is given out again
        if hvd.rank() == 0:
            again = hvd.allreduce_async(torch.full((2,), 5.0), op=hvd.Sum, name="rules.orphan",
                                        process_set=new)
            # The old handle still answers (its result, or the removal if that came first)
            # and frees nothing of the new set's.
            try:
                assert hvd.synchronize(held).tolist() == [3.0, 3.0]
            except hvd.HorovodInternalError as e:
                assert "shut down" in str(e), str(e)
            msg = _message(lambda: hvd.allreduce_async(torch.ones(2), name="rules.orphan",
                                                       process_set=new))
            _names(msg, "still in flight")
            assert hvd.synchronize(again).tolist() == [5.0, 5.0]
    finally:
        hvd.remove_process_set(new)
    assert n == hvd.size()
    _still_works("removed")


def test_an_unregistered_or_removed_set_is_refused():
    never = hvd.ProcessSet([0])
    removed = hvd.add_process_set([hvd.size() - 1])
    hvd.remove_process_set(removed)
    for ps in (never, removed):
        assert ps.process_set_id is None
        msg = _message(lambda: hvd.allreduce(torch.ones(2), name="rules.noset", process_set=ps))
        _names(msg, _subject("allreduce", "allreduce.rules.noset"), "does not exist",
               "hvd.add_process_set")
        # An API that first asks the core for its place in the set: same rule.
        msg = _message(lambda: hvd.reducescatter(torch.ones(4), name="rules.noset",
                                                 process_set=ps))
        _names(msg, _subject("reducescatter", "rules.noset"), "does not exist",
               "hvd.add_process_set")
    _still_works("noset")


def test_non_members_are_refused_by_every_api():
    n = hvd.size()
    last = n - 1
    solo = hvd.add_process_set([last])
    try:
        if hvd.rank() == last:
            assert hvd.allreduce(torch.ones(2), op=hvd.Sum, name="rules.member",
                                 process_set=solo).tolist() == [1.0, 1.0]
        else:
            t = torch.ones(2)
            calls = {
                ("allreduce", "allreduce.rules.member"):
                    lambda: hvd.allreduce(t, name="rules.member", process_set=solo),
                ("allgather", "grouped_allgather.rules.member"):
                    lambda: hvd.grouped_allgather([t], name="rules.member", process_set=solo),
                ("alltoall", "alltoall.rules.member"):
                    lambda: hvd.alltoall(t, name="rules.member", process_set=solo),
                ("barrier", "barrier."): lambda: hvd.barrier(process_set=solo),
                ("reducescatter", "rules.member"):
                    lambda: hvd.reducescatter(t, name="rules.member", process_set=solo),
                ("sparse_allreduce_async", "rules.member"):
                    lambda: hvd.sparse_allreduce_async(t.to_sparse(), "rules.member", hvd.Sum,
                                                       process_set=solo),
                ("broadcast_parameters", ""):
                    lambda: hvd.broadcast_parameters({"w": t}, last, process_set=solo),
            }
            for (op, name), call in calls.items():
                msg = _message(call)
                subject = _subject(op, name) if name else f"{op} on rank {hvd.rank()}"
                if op == "barrier":  # named by a per-set counter: "barrier.<k>"
                    subject = f"barrier 'barrier."
                _names(msg, subject, f"rank {hvd.rank()} is not a member of process set "
                       f"{solo.process_set_id} (ranks {_ranks([last])})", "skip the call")
    finally:
        hvd.remove_process_set(solo)
    _still_works("member")


def test_a_root_outside_the_set_is_refused():
    n = hvd.size()
    for root in (-1, n, n + 5):
        msg = _message(lambda: hvd.broadcast(torch.ones(2), root, name="rules.root"))
        _names(msg, _subject("broadcast", "broadcast.rules.root"), f"invalid root rank {root}",
               f"the global process set (ranks 0 to {n - 1})", "root_rank is a global rank")
    lower = hvd.add_process_set(list(range(n - 1)))
    try:
        if hvd.rank() < n - 1:
            msg = _message(lambda: hvd.broadcast_(torch.ones(2), n - 1, name="rules.root",
                                                  process_set=lower))
            _names(msg, _subject("broadcast", "broadcast.rules.root"),
                   f"invalid root rank {n - 1}", f"process set {lower.process_set_id} "
                   f"(ranks {_ranks(range(n - 1))})")
            _still_works("root.set", lower)
    finally:
        hvd.remove_process_set(lower)
    assert hvd.broadcast(torch.tensor([hvd.rank()]), n - 1, name="rules.root").item() == n - 1


@pytest.mark.parametrize("case", ["count", "negative", "sum", "uneven"])
def test_bad_alltoall_splits_are_refused(case):
    n = hvd.size()
    tensor, splits, words = {
        "count": (torch.ones(3 * n), [1] * (n + 1), [f"Number of entries in splits ({n + 1})"]),
        "negative": (torch.ones(3 * n), [-1] + [1] * (n - 1), ["non-negative", "[-1, "]),
        "sum": (torch.ones(n - 1), [1] * n, [f"Sum of splits entries ({n})",
                                             f"first dimension of tensor ({n - 1})"]),
        "uneven": (torch.ones(n + 1), None, ["even multiple", f"{n + 1} rows"]),
    }[case]
    as_tensor = torch.tensor(splits, dtype=torch.int32) if splits is not None else None
    for s in (splits, as_tensor):
        msg = _message(lambda: hvd.alltoall(tensor, splits=s, name="rules.splits"))
        _names(msg, _subject("alltoall", "alltoall.rules.splits"), *words)
        if case in ("count", "uneven"):
            _names(msg, f"{n} ranks in the global process set")
    out = hvd.alltoall(torch.full((n,), float(hvd.rank())), name="rules.splits")
    assert out.tolist() == [float(r) for r in range(n)]


def test_duplicate_process_sets_are_refused():
    n = hvd.size()
    msg = _message(lambda: hvd.add_process_set(list(range(n))))
    _names(msg, f"hvd.add_process_set on rank {hvd.rank()}", "duplicate process set",
           f"ranks {_ranks(range(n))} are already the global process set")
    first = hvd.add_process_set([0])
    try:
        msg = _message(lambda: hvd.add_process_set(hvd.ProcessSet([0])))
        _names(msg, "duplicate process set",
               f"ranks [0] are already process set {first.process_set_id} (ranks [0])")
    finally:
        hvd.remove_process_set(first)
    stale = hvd.add_process_set([0])
    stale_id = stale.process_set_id
    # At init: the same rule, before anything starts; the job then initialises normally.
    hvd.shutdown()
    try:
        msg = _message(lambda: hvd.init(process_sets=[hvd.ProcessSet([0]), hvd.ProcessSet([0])]))
        assert not hvd.is_initialized()
        # Every rank passed these sets, so every rank raises this same message.
        _names(msg, "hvd.init(process_sets=...) failed on every rank", "every rank's sets",
               "duplicate process set", "ranks [0] are already process set 1 (ranks [0])")
        msg = _message(lambda: hvd.init(process_sets=[hvd.ProcessSet(list(range(n)))]))
        _names(msg, "duplicate process set", "are already the global process set")
    finally:
        hvd.init()
    # A set from the runtime before: the core no longer knows its id.
    msg = _message(stale.size)
    _names(msg, f"ProcessSet on rank {hvd.rank()}", "does not exist",
           f"(id {stale_id})", "hvd.add_process_set")
    _still_works("duplicate")


def test_the_core_itself_refuses_non_members_uneven_rows_and_adasum_on_a_set():
    # hvdcompat._core directly, with no Python-layer check before it.
    core = hvd.basics._core
    n, last = hvd.size(), hvd.size() - 1
    solo = hvd.add_process_set([last])
    buf = torch.ones(n + 1)
    desc = core.Buffer(buf.data_ptr(), core.DTYPES["float32"], [n + 1])
    try:
        msg = _message(lambda: core.enqueue(core.EnqueueArgs(
            core.OPS["alltoall"], "alltoall.core.uneven", inputs=[desc])))
        _names(msg, _subject("alltoall", "alltoall.core.uneven"), "even multiple",
               f"{n + 1} rows, {n} ranks in the global process set")
        with pytest.raises(NotImplementedError) as info:
            core.enqueue(core.EnqueueArgs(core.OPS["allreduce"], "allreduce.core.ada",
                                          process_set=solo.process_set_id,
                                          reduce_op=core.REDUCE_OPS["Adasum"], inputs=[desc],
                                          outputs=[desc]))
        assert isinstance(info.value, ValueError)
        _names(str(info.value), _subject("allreduce", "allreduce.core.ada"),
               f"process set {solo.process_set_id} (ranks [{last}])", "non-global process sets")
        if hvd.rank() != last:
            msg = _message(lambda: core.process_set_member(solo.process_set_id,
                                                           "ProcessSet.rank", ""))
            _names(msg, f"ProcessSet.rank on rank {hvd.rank()}: rank {hvd.rank()} is not a "
                   f"member of process set {solo.process_set_id} (ranks [{last}])")
            assert _message(solo.rank) == msg  # the Python call is the core's rule
        else:
            assert tuple(core.process_set_member(solo.process_set_id, "x", "")) == (0, 1)
    finally:
        hvd.remove_process_set(solo)
    _still_works("core")
