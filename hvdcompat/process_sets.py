"""Process sets: collectives over a subset of ranks.

Every rank of the job creates process sets in the same order (statically at
``hvd.init(process_sets=[...])`` or with :func:`add_process_set` in dynamic
mode); only member ranks may run collectives on a set. Each set has its own
communicator and negotiation state, so traffic on one set does not wait for
another. ``root_rank`` arguments are always global ranks.
"""

from hvdcompat import _session
from hvdcompat._ext import _core

__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set"]


class ProcessSet:
    """A subset of ranks, given as a list of global ranks or an mpi4py communicator.

    Register it with ``hvd.init(process_sets=[...])`` or, in dynamic mode,
    :func:`add_process_set`; until then :meth:`size` and :meth:`rank` are None.

    Args:
        ranks_or_comm: a list of global ranks (kept sorted), or an mpi4py
            communicator whose ranks form the set.

    Raises:
        ValueError: a list holding something other than ints.

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
        _session.current()
        return _core.process_set_member(self.process_set_id, "ProcessSet.rank", "")[0]

    def included(self):
        """Whether this process is a member (None when the ranks are unknown)."""
        if self.ranks is None:
            return None
        return _session.current().rank in self.ranks

    def __str__(self):
        return (f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
                f"mpi_comm={self.mpi_comm})")


class _GlobalProcessSet(ProcessSet):
    """The set of every rank (id 0): its ranks are the running world's, [] when none runs."""

    process_set_id = 0

    def __init__(self):
        super().__init__([])

    @property
    def ranks(self):
        session = _session.get()
        return list(range(session.size)) if session is not None else []

    @ranks.setter
    def ranks(self, value):
        pass  # always the running world's ranks

    def _invalidate(self):
        pass  # the global set is never removed


global_process_set = _GlobalProcessSet()


def _info(process_set_id):
    _session.current()
    info = _core.process_set_info(process_set_id)
    if info is None:
        # Unknown to the core (e.g. an id from before the last hvd.init()):
        # the core raises its own error for it.
        _core.process_set_member(process_set_id, "ProcessSet", "")
    return info


def _comm_ranks(comm, job):
    """Ranks (within the job communicator `job`) of an mpi4py communicator's members."""
    from mpi4py import MPI

    if comm == MPI.COMM_NULL:
        return None
    job_group = job.Get_group()
    group = comm.Get_group()
    try:
        return sorted(MPI.Group.Translate_ranks(group, list(range(group.Get_size())), job_group))
    finally:
        group.Free()
        job_group.Free()


def _job_comm(comm):
    """The mpi4py communicator hvd.init will run on (for comm-defined process sets)."""
    from mpi4py import MPI

    if comm is None:
        return MPI.COMM_WORLD
    if isinstance(comm, MPI.Comm):
        return comm
    raise NotImplementedError(
        "Process sets defined by MPI communicators cannot be combined with hvd.init(comm=[rank "
        "list]); pass an mpi4py communicator as comm, or give the process sets as rank lists.")


class _Static:
    """hvd.init's process_sets argument on this rank, as the core compares it across ranks."""

    def __init__(self):
        self.dynamic = False   # process_sets="dynamic"
        self.requested = []    # (from an mpi4py communicator, its ranks or None), in given order
        self.refused = ""      # why this rank's argument is invalid; "" when it is not
        self.assignments = []  # (ProcessSet, its ranks on this rank or None)


def _parse_init_argument(process_sets, comm=None):
    """_Static from hvd.init's process_sets argument. Local: never communicates, never raises.

    A mistake is recorded in `refused` instead of raised: a rank that raised
    here would leave its peers waiting in hvd.init. The core compares every
    rank's argument first and raises the same ValueError on every rank
    (Note [Agreeing on init's sets] in cpp/engine/init_agreement.h).

    A set given by an mpi4py communicator may differ between ranks (e.g. a
    Split into even and odd ranks): each rank passes its own group, the core
    registers every distinct group, in order of its lowest rank, and each
    ProcessSet object then stands for the caller's own group.
    """
    static = _Static()
    try:
        _describe_init_argument(process_sets, comm, static)
    except Exception as e:  # noqa: BLE001 - any mistake is raised by the core, on every rank
        static.requested, static.assignments = [], []
        static.refused = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
    return static


def _describe_init_argument(process_sets, comm, static):
    if process_sets is None:
        return
    if isinstance(process_sets, str):
        if process_sets.lower() == "dynamic":
            static.dynamic = True
            return
        raise ValueError(f"process_sets={process_sets!r} is neither a list of ProcessSet nor "
                         "the string 'dynamic'")
    sets = list(process_sets)
    for i, ps in enumerate(sets):
        if not isinstance(ps, ProcessSet):
            raise ValueError(f"process_sets entry number {i} is not a ProcessSet: {ps!r}")
    job = _job_comm(comm) if any(ps.mpi_comm is not None for ps in sets) else None
    for ps in sets:
        from_comm = ps.mpi_comm is not None
        mine = _comm_ranks(ps.mpi_comm, job) if from_comm else list(ps.ranks)
        static.requested.append((from_comm, mine))
        static.assignments.append((ps, mine))


def _after_init(static, session):
    """Gives the static sets their ids in the session `init` just began."""
    ids = {}
    for pid in _core.process_set_ids():
        if pid:
            ids[tuple(_core.process_set_info(pid)[0])] = pid
    for ps, ranks in static.assignments:
        if ps.mpi_comm is not None:
            ps.ranks = ranks
        # (A worker that joined a running job in place takes the job's sets:
        # its own argument may name one the job does not have.)
        ps.process_set_id = None if ranks is None else ids.get(tuple(sorted(ranks)))
        if ps.process_set_id is not None:
            session.process_sets.add(ps)


def _after_reset(session):
    """After an elastic reset: each set keeps its id with its surviving members' new ranks.

    `session` is the new world's (None when the reset left no engine running).
    """
    if session is None:
        return
    for ps in list(session.process_sets):
        info = _core.process_set_info(ps.process_set_id) if ps.process_set_id else None
        if info is None:
            ps._invalidate()
        else:
            ps.ranks = list(info[0])


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
    session = _session.current()
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.ranks is None:
        raise NotImplementedError(
            "Dynamically adding process sets defined by an MPI communicator is not implemented. "
            "Pass the list of global ranks instead.")
    process_set.process_set_id = _core.add_process_set(process_set.ranks)
    session.process_sets.add(process_set)
    return process_set


def remove_process_set(process_set):
    """Unregisters a process set; collective over the whole job.

    Args:
        process_set: the :class:`ProcessSet` that :func:`add_process_set` or
            :func:`init` registered.

    Returns:
        True when the set was removed, False when it was not registered (the
        global set is never removed).

    Raises:
        ValueError: not initialised or dynamic mode off.
    """
    _session.current()
    pid = process_set.process_set_id
    if pid is None:
        return False  # never registered
    process_set._invalidate()  # a no-op for the global set, which the core never removes
    return _core.remove_process_set(pid)  # also frees the names held on it
