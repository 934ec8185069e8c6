"""Process sets: static and dynamic registration, collectives on subsets, and independence.

Static sets exist only through ``hvd.init(process_sets=[...])``, so those
tests shut the session down and initialise again (every rank does the same,
in the same order). Dynamic sets need ``HOROVOD_DYNAMIC_PROCESS_SETS=1`` at
launch or ``hvd.init(process_sets="dynamic")``; the fixture below uses the
launch setting when present and re-initialises otherwise, so both paths run.
"""

import pytest
import torch

import hvdcompat as hvd
from hvdcompat.basics import _core
from parallel_util import all_inputs, assert_same, expected_reduce, rank_input


def _reinit(**kwargs):
    hvd.shutdown()
    hvd.init(**kwargs)


@pytest.fixture
def dynamic():
    """A session that allows add_process_set; restores a plain session afterwards."""
    reinit = not _core.dynamic_process_sets()
    if reinit:
        _reinit(process_sets="dynamic")
    yield
    if reinit:
        _reinit()


def _even_odd():
    n = hvd.size()
    return [r for r in range(n) if r % 2 == 0], [r for r in range(n) if r % 2 == 1]


def _my_set(even_set, odd_set):
    return even_set if hvd.rank() % 2 == 0 else odd_set


def test_static_sets_from_init():
    n = hvd.size()
    first, rest = hvd.ProcessSet([0]), hvd.ProcessSet(list(range(n - 1, 0, -1)))
    _reinit(process_sets=[first, rest])
    try:
        assert (first.process_set_id, rest.process_set_id) == (1, 2)
        assert rest.ranks == list(range(1, n))  # sorted
        assert (first.size(), rest.size()) == (1, n - 1)  # also on non-members
        assert hvd.global_process_set.ranks == list(range(n))
        mine = first if hvd.rank() == 0 else rest
        other = rest if mine is first else first
        assert mine.included() and not other.included()
        assert mine.rank() == mine.ranks.index(hvd.rank())
        with pytest.raises(ValueError, match=r"ProcessSet.rank on rank \d+: rank \d+ is not a member"):
            other.rank()
        out = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="static", process_set=mine)
        assert out.tolist() == [float(mine.size())] * 2
        # Dynamic registration stays off unless asked for.
        if not _core.dynamic_process_sets():
            with pytest.raises(ValueError, match="HOROVOD_DYNAMIC_PROCESS_SETS"):
                hvd.add_process_set([0])
            with pytest.raises(ValueError, match="HOROVOD_DYNAMIC_PROCESS_SETS"):
                hvd.remove_process_set(first)
    finally:
        _reinit()
    # Sets do not survive a shutdown.
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="static.after").item() == n


def test_duplicate_static_sets_are_rejected():
    hvd.shutdown()
    try:
        with pytest.raises(ValueError, match="duplicate"):
            hvd.init(process_sets=[hvd.ProcessSet([0]), hvd.ProcessSet([0])])
    finally:
        hvd.init()
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="dupstatic.after").item() == hvd.size()


# hvd.init compares every rank's process_sets before registering any, so a
# mistake on one rank, or a difference between ranks, fails init on every
# rank with one message instead of leaving the others waiting in it.


def _ranks_phrase(ranks):
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def _assert_init_fails_on_every_rank(process_sets, *phrases):
    """hvd.init(process_sets) raises here with `phrases`, the same text as on
    every other rank; afterwards a correct init with static sets works."""
    n = hvd.size()
    hvd.shutdown()
    try:
        with pytest.raises(ValueError) as info:
            hvd.init(process_sets=process_sets)
        assert not hvd.is_initialized()
        message = str(info.value)
        assert message.startswith("hvd.init(process_sets=...) failed on every rank"), message
        assert "Pass the same process_sets on every rank" in message, message
        for phrase in phrases:
            assert phrase in message, message
        tail = hvd.ProcessSet(list(range(1, n)))
        hvd.init(process_sets=[tail])
        assert tail.process_set_id == 1
        assert hvd.allgather_object(message) == [message] * n
        out = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum, name="after.failed")
        assert out.item() == n * (n - 1) / 2
        if hvd.rank() > 0:
            out = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum,
                                name="after.failed.tail", process_set=tail)
            assert out.item() == n * (n - 1) / 2
    finally:
        _reinit()


@pytest.mark.parametrize("mistake", ["out of range", "listed twice", "not a ProcessSet"])
def test_an_invalid_set_on_one_rank_fails_init_on_every_rank(mistake):
    n = hvd.size()
    good = [hvd.ProcessSet([0, 1])]
    bad = {"out of range": [hvd.ProcessSet([0, n])],
           "listed twice": [hvd.ProcessSet([1, 1])],
           "not a ProcessSet": [hvd.ProcessSet([0, 1]), [1]]}[mistake]
    expected = {"out of range": [f"rank 1's sets: process set [0, {n}]: rank {n} is out of range",
                                 f"in [0, {n})"],
                "listed twice": ["rank 1's sets: process set [1, 1]: rank 1 is listed twice"],
                "not a ProcessSet": ["rank 1's process_sets argument is invalid",
                                     "entry number 1 is not a ProcessSet"]}[mistake]
    _assert_init_fails_on_every_rank(bad if hvd.rank() == 1 else good, *expected)


def test_different_orders_of_sets_fail_init_on_every_rank():
    n = hvd.size()
    rest = list(range(1, n))
    first, second = hvd.ProcessSet([0]), hvd.ProcessSet(rest)
    _assert_init_fails_on_every_rank(
        [first, second] if hvd.rank() == 0 else [second, first],
        "the ranks passed different process sets",
        f"rank 0 passed [ProcessSet([0]), ProcessSet({rest})]",
        f"{_ranks_phrase(rest)} passed [ProcessSet({rest}), ProcessSet([0])]")


@pytest.mark.parametrize("odd_one", ["dynamic", None])
def test_dynamic_or_none_against_a_list_fails_init_on_every_rank(odd_one):
    n = hvd.size()
    others = [r for r in range(n) if r != 1]
    # Launched with HOROVOD_DYNAMIC_PROCESS_SETS=1, None means the launch's mode.
    shown = "dynamic" if odd_one is None and _core.dynamic_process_sets() else odd_one
    _assert_init_fails_on_every_rank(
        odd_one if hvd.rank() == 1 else [hvd.ProcessSet([0])],
        f"rank 1 passed {shown!r}",
        f"{_ranks_phrase(others)} passed [ProcessSet([0])]")


def test_a_communicator_set_on_one_rank_only_fails_init_on_every_rank():
    from mpi4py import MPI

    n = hvd.size()
    whole = MPI.COMM_WORLD.Dup()
    try:
        _assert_init_fails_on_every_rank(
            [hvd.ProcessSet(whole)] if hvd.rank() == 0 else [hvd.ProcessSet([0])],
            "rank 0 passed [ProcessSet(<mpi4py communicator>)]",
            f"{_ranks_phrase(list(range(1, n)))} passed [ProcessSet([0])]")
    finally:
        whole.Free()


def test_static_sets_from_mpi_communicators():
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    me = world.Get_rank()
    # Every rank passes its own half: the even and the odd ranks.
    split_comm = world.Split(color=me % 2, key=me)
    whole = world.Dup()
    hvd.shutdown()
    try:
        with pytest.raises(ValueError, match="duplicate"):
            hvd.init(process_sets=[hvd.ProcessSet(whole)])  # the global set again
        split = hvd.ProcessSet(split_comm)
        hvd.init(process_sets=[split])
        even, odd = _even_odd()
        mine = even if me % 2 == 0 else odd
        assert split.ranks == mine
        # Both halves are registered on every rank, the even one first.
        assert split.process_set_id == (1 if me % 2 == 0 else 2)
        assert split.size() == len(mine) and split.rank() == mine.index(me)
        out = hvd.allreduce(torch.tensor([float(me)]), op=hvd.Sum, name="comm.split",
                            process_set=split)
        assert out.item() == sum(mine)
    finally:
        hvd.shutdown()
        hvd.init()
        split_comm.Free()
        whole.Free()


def test_processset_validates_its_ranks():
    with pytest.raises(ValueError, match="list of process ranks"):
        hvd.ProcessSet([0, 1.5])
    ps = hvd.ProcessSet([2, 0, 1])
    assert ps.ranks == [0, 1, 2] and ps.process_set_id is None
    assert ps.size() is None and ps.rank() is None


def test_collectives_on_even_and_odd_sets(dynamic):
    n = hvd.size()
    even, odd = _even_odd()
    even_set = hvd.add_process_set(even)
    odd_set = hvd.add_process_set(hvd.ProcessSet(odd))
    try:
        assert even_set.process_set_id != odd_set.process_set_id
        assert (even_set.size(), odd_set.size()) == (len(even), len(odd))
        mine = _my_set(even_set, odd_set)
        members = mine.ranks
        me = members.index(hvd.rank())

        xs = all_inputs((3, 2), torch.float32, "ps-ar", ranks=members)
        out = hvd.allreduce(xs[me], op=hvd.Sum, name="ps.ar", process_set=mine)
        assert_same(out, expected_reduce(xs, torch.float32, hvd.Sum))
        avg = hvd.allreduce(xs[me], op=hvd.Average, name="ps.avg", process_set=mine)
        assert_same(avg, expected_reduce(xs, torch.float32, hvd.Average), exact=False)

        gathered = hvd.allgather(torch.full((hvd.rank() + 1,), hvd.rank()), name="ps.ag",
                                 process_set=mine)
        assert gathered.tolist() == [r for r in members for _ in range(r + 1)]

        for root in members:  # root_rank is a global rank
            got = hvd.broadcast(rank_input(hvd.rank(), (4,), torch.int32, "ps-bc"), root,
                                name=f"ps.bc.{root}", process_set=mine)
            assert_same(got, rank_input(root, (4,), torch.int32, "ps-bc"))

        k = len(members)
        out = hvd.alltoall(torch.arange(2 * k) + 100 * hvd.rank(), name="ps.a2a",
                           process_set=mine)
        assert out.tolist() == [100 * r + 2 * me + j for r in members for j in range(2)]

        ys = all_inputs((2 * k + 1, 2), torch.int64, "ps-rs", ranks=members)
        got = hvd.reducescatter(ys[me], op=hvd.Sum, name="ps.rs", process_set=mine)
        full = expected_reduce(ys, torch.int64, hvd.Sum)
        q, m = divmod(full.shape[0], k)
        start = me * q + min(me, m)
        assert_same(got, full[start:start + q + (1 if me < m else 0)])

        outs = hvd.grouped_allreduce([torch.ones(2), torch.ones(3)], op=hvd.Sum,
                                     name="ps.grouped", process_set=mine)
        assert [o.tolist() for o in outs] == [[float(k)] * 2, [float(k)] * 3]

        # A root outside the caller's set is a caller mistake.
        outsider = next((r for r in range(n) if r not in members), None)
        if outsider is not None:
            with pytest.raises(ValueError, match="root rank"):
                hvd.broadcast(torch.ones(1), outsider, name="ps.bc.outsider", process_set=mine)

        # The same name on two sets at once: independent ops.
        h_set = hvd.allreduce_async(torch.ones(2), op=hvd.Sum, name="ps.shared", process_set=mine)
        h_all = hvd.allreduce_async(torch.ones(2), op=hvd.Sum, name="ps.shared")
        assert hvd.synchronize(h_all).tolist() == [float(n)] * 2
        assert hvd.synchronize(h_set).tolist() == [float(k)] * 2

        hvd.barrier(process_set=mine)
        hvd.barrier()
    finally:
        assert hvd.remove_process_set(odd_set) is True
        assert hvd.remove_process_set(even_set) is True


def test_non_members_get_value_errors(dynamic):
    n = hvd.size()
    solo = hvd.add_process_set([n - 1])
    try:
        if hvd.rank() != n - 1:
            t = torch.ones(2)
            calls = {
                "allreduce": lambda: hvd.allreduce(t, name="nm", process_set=solo),
                "allreduce_async_": lambda: hvd.allreduce_async_(t, name="nm", process_set=solo),
                "allgather": lambda: hvd.allgather(t, name="nm", process_set=solo),
                "broadcast": lambda: hvd.broadcast(t, n - 1, name="nm", process_set=solo),
                "alltoall": lambda: hvd.alltoall(t, name="nm", process_set=solo),
                "reducescatter": lambda: hvd.reducescatter(t, name="nm", process_set=solo),
                "grouped_allreduce": lambda: hvd.grouped_allreduce([t], name="nm",
                                                                   process_set=solo),
                "barrier": lambda: hvd.barrier(process_set=solo),
            }
            for op, call in calls.items():
                with pytest.raises(ValueError, match="not a member|Invalid process set") as info:
                    call()
                assert str(hvd.rank()) in str(info.value), (op, str(info.value))
            assert solo.size() == 1 and not solo.included()
            with pytest.raises(ValueError, match=r"ProcessSet.rank on rank \d+: rank \d+ is not a member"):
                solo.rank()
        else:
            assert solo.rank() == 0
            assert hvd.allreduce(torch.ones(2), op=hvd.Sum, name="nm",
                                 process_set=solo).tolist() == [1.0, 1.0]
        # A broadcast root outside the caller's set is a caller mistake too.
        with pytest.raises(ValueError, match="root rank"):
            hvd.broadcast(torch.ones(1), n, name="nm.root")
    finally:
        hvd.remove_process_set(solo)
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="nm.after").item() == n


def test_duplicates_ids_and_removal(dynamic):
    n = hvd.size()
    with pytest.raises(ValueError, match="duplicate"):
        hvd.add_process_set(list(range(n)))  # the global set
    a = hvd.add_process_set([0])
    b = hvd.add_process_set([n - 1, 0] if n > 2 else [1])
    try:
        with pytest.raises(ValueError, match="duplicate"):
            hvd.add_process_set([0])
        ids = (a.process_set_id, b.process_set_id)
        assert len(set(ids)) == 2 and 0 not in ids
        assert hvd.remove_process_set(a) is True
        assert a.process_set_id is None
        assert hvd.remove_process_set(a) is False  # no longer registered
        assert hvd.remove_process_set(hvd.global_process_set) is False
        assert hvd.global_process_set.process_set_id == 0
        with pytest.raises(ValueError, match="not exist|not been registered"):
            hvd.allreduce(torch.ones(1), name="removed", process_set=a)
        # The freed id is reused first, and the same ranks may be added again.
        c = hvd.add_process_set([0])
        assert c.process_set_id == ids[0]
        if hvd.rank() == 0:
            assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="reused",
                                 process_set=c).item() == 1.0
        assert hvd.remove_process_set(c) is True
    finally:
        hvd.remove_process_set(b)
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="ids.after").item() == n


def test_a_change_refused_on_one_rank_fails_on_every_rank(dynamic):
    """One rank's own mistake is raised after the control round, so the peers
    that found none fail too instead of waiting in it (Note [Control rounds])."""
    n = hvd.size()
    a = hvd.add_process_set([0])
    try:
        # Rank 0 repeats an existing set (refused locally); the others pass a new one.
        mine = [0] if hvd.rank() == 0 else [n - 1]
        with pytest.raises(ValueError, match="duplicate" if hvd.rank() == 0 else "refused"):
            hvd.add_process_set(mine)
        assert sorted(_core.process_set_ids()) == [0, a.process_set_id]
        # Rank 0 removes an id nobody registered, the others a registered set.
        other = hvd.ProcessSet([0])
        other.process_set_id = a.process_set_id + 100 if hvd.rank() == 0 else a.process_set_id
        with pytest.raises(ValueError, match="did not all remove"):
            hvd.remove_process_set(other)
        assert sorted(_core.process_set_ids()) == [0, a.process_set_id]
    finally:
        assert hvd.remove_process_set(a) is True
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="refused.after").item() == n


def test_add_and_remove_many_times(dynamic):
    even, odd = _even_odd()
    for i in range(5):
        even_set = hvd.add_process_set(even)
        odd_set = hvd.add_process_set(odd)
        mine = _my_set(even_set, odd_set)
        out = hvd.allreduce(torch.ones(1), op=hvd.Sum, name=f"churn.{i}", process_set=mine)
        assert out.item() == mine.size()
        hvd.remove_process_set(odd_set)
        hvd.remove_process_set(even_set)


def test_a_blocked_set_does_not_block_another_set(dynamic):
    """Ranks 0 and 1 leave a global allreduce pending (rank 2 submits it last).

    Rank 2 only submits it after a collective on set B = [1, 2], which rank 1
    reaches only after a collective on set A = [0, 1]. If a pending op on the
    global set held up the other sets, this would deadlock.
    """
    n = hvd.size()
    if n < 3:
        pytest.skip("needs three ranks")
    a = hvd.add_process_set([0, 1])
    b = hvd.add_process_set([1, 2])
    try:
        me = hvd.rank()
        pending = None
        if me in (0, 1):
            pending = hvd.allreduce_async(torch.ones(2), op=hvd.Sum, name="blocked")
            assert hvd.allreduce(torch.ones(2), op=hvd.Sum, name="set.a",
                                 process_set=a).tolist() == [2.0, 2.0]
        if me in (1, 2):
            assert hvd.allreduce(torch.ones(2), op=hvd.Sum, name="set.b",
                                 process_set=b).tolist() == [2.0, 2.0]
        if me >= 2:
            pending = hvd.allreduce_async(torch.ones(2), op=hvd.Sum, name="blocked")
        assert hvd.synchronize(pending).tolist() == [float(n)] * 2
    finally:
        hvd.remove_process_set(b)
        hvd.remove_process_set(a)


def test_a_set_runs_while_the_global_set_waits(dynamic):
    """Rank 0 leaves a global allreduce waiting for the others, who submit it
    only after hearing (over plain MPI) that rank 0 finished an allreduce on
    its own set. If the waiting global set held up the other set, this would
    deadlock."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    n = hvd.size()
    solo = hvd.add_process_set([0])
    try:
        if hvd.rank() == 0:
            pending = hvd.allreduce_async(torch.ones(2), op=hvd.Sum, name="waits")
            out = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="solo", process_set=solo)
            assert out.tolist() == [1.0, 1.0]
            for r in range(1, n):
                world.send("solo done", dest=r, tag=77)
        else:
            assert world.recv(source=0, tag=77) == "solo done"
            pending = hvd.allreduce_async(torch.ones(2), op=hvd.Sum, name="waits")
        assert hvd.synchronize(pending).tolist() == [float(n)] * 2
    finally:
        hvd.remove_process_set(solo)


def test_two_sets_make_progress_concurrently(dynamic):
    """Each rank alternates async ops on its own set and the global set."""
    even, odd = _even_odd()
    even_set = hvd.add_process_set(even)
    odd_set = hvd.add_process_set(odd)
    try:
        mine = _my_set(even_set, odd_set)
        handles = []
        for i in range(10):
            handles.append((hvd.allreduce_async(torch.ones(3), op=hvd.Sum, name=f"mix.set.{i}",
                                                process_set=mine), mine.size()))
            handles.append((hvd.allreduce_async(torch.ones(3), op=hvd.Sum, name=f"mix.all.{i}"),
                            hvd.size()))
        for h, k in reversed(handles):
            assert hvd.synchronize(h).tolist() == [float(k)] * 3
    finally:
        hvd.remove_process_set(odd_set)
        hvd.remove_process_set(even_set)
