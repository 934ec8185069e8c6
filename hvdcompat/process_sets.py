"""Process sets: collectives over a subset of ranks.

Every rank of the job creates process sets in the same order (statically at
``hvd.init(process_sets=[...])`` or with :func:`add_process_set` in dynamic
mode); only member ranks may run collectives on a set. Each set has its own
communicator and negotiation state, so traffic on one set does not wait for
another. ``root_rank`` arguments are always global ranks.
"""

from hvdcompat.basics import _core, _require_init

__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set"]


class ProcessSet:
    """A subset of ranks, given as a list of global ranks or an mpi4py communicator.

    Attributes:
        ranks: sorted global ranks, or None for a communicator-defined set
            until it is registered.
        process_set_id: id once registered (0 is the global set), else None.
        mpi_comm: the mpi4py communicator it was built from, if any.
    """

    process_set_id = None
    ranks = None
    mpi_comm = None

    def __init__(self, ranks_or_comm):
        try:
            ranks = list(ranks_or_comm)
        except TypeError:
            ranks = None
        if ranks is not None:
            if not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
                raise ValueError("ProcessSet should be initialized with a list of process ranks "
                                 "or an mpi4py Comm object")
            self.ranks = sorted(ranks)
        else:
            self.mpi_comm = ranks_or_comm

    def _invalidate(self):
        self.process_set_id = None

    def size(self):
        """Number of ranks in the set (None when not registered)."""
        if self.process_set_id is None:
            return None
        return len(_info(self.process_set_id)[0])

    def rank(self):
        """This process's index within the set (None when not registered).

        Raises:
            ValueError: this process is not a member.
        """
        if self.process_set_id is None:
            return None
        ranks, included, r = _info(self.process_set_id)
        if not included:
            raise ValueError("Process is not part of provided process set.")
        return r

    def included(self):
        """Whether this process is a member (None when the ranks are unknown)."""
        if self.ranks is None:
            return None
        from hvdcompat.basics import rank

        return rank() in self.ranks

    def __str__(self):
        return (f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
                f"mpi_comm={self.mpi_comm})")


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def _info(process_set_id):
    _require_init()
    info = _core.process_set_info(process_set_id)
    if info is None:
        raise ValueError("Process set does not exist or has not been registered.")
    return info


def _comm_ranks(comm):
    """Global ranks of an mpi4py communicator's members (job = COMM_WORLD)."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD.Get_group()
    group = comm.Get_group()
    try:
        return sorted(MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world))
    finally:
        group.Free()
        world.Free()


def _parse_init_argument(process_sets):
    """(dynamic, [ProcessSet]) from hvd.init's process_sets argument."""
    if process_sets is None:
        return False, []
    if isinstance(process_sets, str):
        if process_sets.lower() == "dynamic":
            return True, []
        raise ValueError(f"hvd.init(process_sets={process_sets!r}): pass a list of ProcessSet "
                         "or the string 'dynamic'")
    sets = list(process_sets)
    seen = []
    for i, ps in enumerate(sets):
        if not isinstance(ps, ProcessSet):
            raise ValueError(f"hvd.init: process_sets entry number {i} is not a ProcessSet: {ps!r}")
        if ps.ranks is None and ps.mpi_comm is not None:
            ps.ranks = _comm_ranks(ps.mpi_comm)
        if any(other.ranks == ps.ranks for other in seen):
            raise ValueError("Horovod could not be initialized because process_sets entry number "
                             f"{i} is a duplicate: {ps}")
        seen.append(ps)
    return False, sets


def _after_init(static_sets):
    global_process_set.ranks = list(range(_core.size()))
    global_process_set.process_set_id = 0
    for i, ps in enumerate(static_sets):
        ps.process_set_id = i + 1


def _after_shutdown():
    pass


def add_process_set(process_set):
    """Registers a process set; collective over the whole job.

    Every rank must call it with the same ranks, in the same order as other
    ``add_process_set`` calls, including ranks that are not members.

    Args:
        process_set: a :class:`ProcessSet` or a list of global ranks.

    Returns:
        The registered :class:`ProcessSet` (``process_set_id`` set).

    Raises:
        ValueError: not initialised, dynamic mode off, a set with these ranks
            already exists, or ranks are out of range.
    """
    _require_init()
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.ranks is None:
        raise NotImplementedError(
            "Dynamically adding process sets defined by an MPI communicator is not implemented. "
            "Pass the list of global ranks instead.")
    if not _core.dynamic_process_sets():
        raise ValueError("Set HOROVOD_DYNAMIC_PROCESS_SETS=1 to allow adding process sets after "
                         "Horovod initialization (or call hvd.init(process_sets='dynamic')).")
    for pid in _core.process_set_ids():
        if _core.process_set_info(pid)[0] == process_set.ranks:
            raise ValueError(f"Attempted to add a duplicate process set: {process_set}")
    process_set.process_set_id = _core.add_process_set(process_set.ranks)
    return process_set


def remove_process_set(process_set):
    """Unregisters a process set; collective over the whole job.

    Returns:
        True when the set was removed, False when it was not registered (the
        global set is never removed).

    Raises:
        ValueError: not initialised or dynamic mode off.
    """
    _require_init()
    if not _core.dynamic_process_sets():
        raise ValueError("Set HOROVOD_DYNAMIC_PROCESS_SETS=1 to allow removing process sets "
                         "after Horovod initialization (or call hvd.init(process_sets='dynamic')).")
    pid = process_set.process_set_id
    if pid is None or pid == 0:
        return False
    process_set._invalidate()
    removed = _core.remove_process_set(pid)
    from hvdcompat.ops.handles import _forget_process_set
    _forget_process_set(pid)
    return removed
