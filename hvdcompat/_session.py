"""The Python side of one running engine: what ``hvd.init()`` starts and ``hvd.shutdown()`` ends.

Note [One owner of Python state]
Everything the Python layer keeps about a running engine lives in one
:class:`Session`: the handles of ops in flight and the tensors they point
into, the counters that name unnamed ops, joins and barriers, the cached GPU answer, the DDP backend's
group counter and the process sets given an id. ``basics.init`` creates it
after the core starts; ``basics.shutdown`` drops it after the core stops, so
a new ``init`` starts from nothing without any module resetting itself. An
elastic reset (``basics._elastic_reset``) drops the old world's session and
builds one for the new world, handing over only the registered process sets
(they keep their ids with their surviving members).

Modules reach it through :func:`current`, which raises the usual "not
initialized" error. The modules keep no mutable state of their own; the few
things kept for the whole process (they outlive init and shutdown) are
listed, with why, in tests/unit/test_python_structure.py, which checks both
rules from the source. This module imports only the ground floor
(``hvdcompat._ext``), so every layer may import it.

Thread rules: the session is replaced only under ``basics``' lifecycle lock.
Op calls from several threads share it, as they shared the module-level maps
before: single dict operations, which the GIL keeps whole.
"""

import weakref

from hvdcompat._ext import NOT_INITIALIZED, _core

__all__ = ["Session", "current", "get", "begin", "end"]


class Session:
    """Per-init state of the Python layer (Note [One owner of Python state]).

    Attributes:
        rank, size: this rank and the world size when the session began (a
            reset begins a new session for the new world).
        handles: core handle -> the op's pending record (``ops.handles``),
            holding every tensor the core reads or writes until it completes.
        noname_counts: process set id -> unnamed ops enqueued on it (names them).
        composites: negative handle -> (core handles, assemble) for ops made
            of several core ops (grouped ops over several dtypes).
        next_composite: the next negative handle to give out.
        join_count: joins run so far (names them).
        barrier_counts: process set id -> barriers run on it (names them).
        gpu_unavailable_reason: the running engine's answer to whether CUDA
            tensors can run ('' when they can), None until asked.
        ddp_group_count: process groups the DDP backend created (names their ops).
        process_sets: the ProcessSet objects given an id in this runtime (weak:
            the user owns them), so a reset can renumber their ranks.
        last_reset_seconds: how long the reset that began this session took
            (None for a session begun by init).
        output_pool: the reused outputs of out-of-place host ops
            (``ops._pool``, Note [Output pool]), made at first use.
    """

    def __init__(self, rank, size, process_sets=()):
        self.rank = rank
        self.size = size
        self.handles = {}
        self.noname_counts = {}
        self.composites = {}
        self.next_composite = -1
        self.join_count = 0
        self.barrier_counts = {}
        self.gpu_unavailable_reason = None
        self.ddp_group_count = 0
        self.process_sets = weakref.WeakSet(process_sets)
        self.last_reset_seconds = None
        self.output_pool = None


# The running engine's session, or None. The only module-level state of the
# Python layer that belongs to an engine; replaced by begin() and end() alone.
_current = None


def get():
    """The running session, or None (before init, after shutdown)."""
    session = _current
    if session is None or not _core.is_initialized():
        return None
    return session


def current():
    """The running session.

    Raises:
        ValueError: hvd.init() has not run, or hvd.shutdown() has run since.
    """
    session = get()
    if session is None:
        raise ValueError(NOT_INITIALIZED)
    return session


def begin(process_sets=()):
    """Starts the session of the engine the core just started (or rebuilt); returns it."""
    global _current
    _current = Session(_core.rank(), _core.size(), process_sets)
    return _current


def end():
    """Drops the running session (its handles and counters go with it); returns it, or None."""
    global _current
    session, _current = _current, None
    return session
