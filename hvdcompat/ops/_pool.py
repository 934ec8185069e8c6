"""Reused host memory for the outputs of out-of-place collectives.

Note [Output pool]
A new output per call (``hvd.allreduce(t)``) would come from torch's
allocator, that is from malloc. glibc serves large blocks with mmap and gives
them back with munmap on free (its dynamic mmap threshold stops at 32 MiB),
and it trims the top of the heap once enough of it is free, so a loop that
reduces a 64 MiB tensor, or a model's worth of gradients, out of place maps
fresh pages on every call and takes one page fault (and a zeroing) per 4 KiB
while the reduction writes them: more than the reduction itself costs.

The pool keeps the storages of host outputs of at least ``MIN_BYTES`` and
hands one out again once nobody else holds it. A storage is idle when
  - its C++ use count is 1: the pool's storage object is the only owner (any
    tensor on it, a view, a numpy array or DLPack capsule of one, holds one
    more), and
  - the pool's storage object has no Python references beyond the pool's
    own: ``out.untyped_storage()`` returns that very object, so a caller
    holding only the storage is seen here.
Both are read under the GIL with the pool's lock held; an idle storage has no
owner who could take a new reference meanwhile. A storage that was moved to
shared memory (``share_memory_()``: another process may map it) or resized
is dropped from the pool instead of being reused. The pool checks these rules
on this torch build when it first runs and stays off if any does not hold.

The pool holds at most HVDCOMPAT_OUTPUT_POOL_BYTES (in use and idle
together, so it never keeps more than that after the caller lets go); past
it, idle storages are released least recently used first, and an output that
still does not fit comes from torch's allocator as before. It belongs to the
session: ``hvd.shutdown()`` drops it. CUDA outputs always come from torch's caching allocator.
Handed-out tensors are ordinary torch tensors (resizable, not views).
"""

import collections
import functools
import itertools
import sys
import threading

import torch

from hvdcompat import _session
from hvdcompat._ext import _core

__all__ = []

MIN_BYTES = 256 * 1024  # smaller blocks stay in malloc's heap between calls
_CHECKS_PER_SIZE = 8    # storages of one size examined per request
_CHECKS_TO_EVICT = 16   # least recently used storages examined to make room

_use_count = getattr(torch._C, "_storage_Use_Count", None)


class _Entry:
    __slots__ = ("storage", "cdata", "nbytes", "python_refs", "stamp")


def _python_refs(entry):
    # The same expression at calibration and at every check, so the
    # temporary references the call itself makes cancel out.
    return sys.getrefcount(entry.storage)


class OutputPool:
    def __init__(self):
        self._lock = threading.Lock()
        self._by_size = {}                       # nbytes -> deque of _Entry, oldest use first
        self._lru = collections.OrderedDict()    # id(entry) -> entry, least recently used first
        self._bytes = 0
        self._limit = 0
        self._clock = itertools.count()
        self.reused = 0
        self.allocated = 0

    def configure(self, limit_bytes):
        """Sets the byte limit (0 turns the pool off) and drops what it holds."""
        with self._lock:
            self._drop_all()
            self._limit = limit_bytes if limit_bytes > 0 and _self_check() else 0

    def clear(self):
        with self._lock:
            self._drop_all()

    def limit(self):
        """Bytes the pool may hold (0: off)."""
        return self._limit

    def stats(self):
        """(storages held, bytes held, outputs served from the pool, outputs it allocated)."""
        with self._lock:
            return len(self._lru), self._bytes, self.reused, self.allocated

    def empty(self, shape, dtype):
        """An uninitialised contiguous CPU tensor, or None when the pool does not serve it."""
        if self._limit <= 0:
            return None
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * _itemsize(dtype)
        if nbytes < MIN_BYTES:
            return None
        with self._lock:
            entry = self._take(nbytes)
            if entry is None:
                entry = self._add(nbytes)
                if entry is None:
                    return None
                self.allocated += 1
            else:
                self.reused += 1
            self._lru.move_to_end(id(entry))
            entry.stamp = next(self._clock)
            return torch.empty(0, dtype=dtype).set_(entry.storage, 0, tuple(shape))

    # -- under the lock

    def _idle(self, entry):
        return (_use_count(entry.cdata) == 1 and _python_refs(entry) == entry.python_refs)

    def _reusable(self, entry):
        s = entry.storage
        return s.nbytes() == entry.nbytes and not s.is_shared()

    def _take(self, nbytes):
        queue = self._by_size.get(nbytes)
        if not queue:
            return None
        for _ in range(min(len(queue), _CHECKS_PER_SIZE)):
            entry = queue.popleft()
            if not self._idle(entry):
                queue.append(entry)  # busy: look at the others first next time
                continue
            if not self._reusable(entry):
                self._forget(entry, in_queue=False)
                continue
            queue.append(entry)
            return entry
        return None

    def _add(self, nbytes):
        if nbytes > self._limit:
            return None
        if self._bytes + nbytes > self._limit:
            self._make_room(nbytes)
            if self._bytes + nbytes > self._limit:
                return None
        entry = _Entry()
        entry.storage = torch.empty(nbytes, dtype=torch.uint8).untyped_storage()
        entry.cdata = entry.storage._cdata
        entry.nbytes = nbytes
        entry.python_refs = _python_refs(entry)
        self._by_size.setdefault(nbytes, collections.deque()).append(entry)
        self._lru[id(entry)] = entry
        self._bytes += nbytes
        return entry

    def _make_room(self, nbytes):
        """Releases idle storages, least recently used first, if that makes `nbytes` fit."""
        need = self._bytes + nbytes - self._limit
        chosen = []
        for entry in itertools.islice(self._lru.values(), _CHECKS_TO_EVICT):
            # A storage its owner resized or shared leaves the pool even when
            # busy: the owner keeps it.
            if self._idle(entry) or not self._reusable(entry):
                chosen.append(entry)
                need -= entry.nbytes
                if need <= 0:
                    break
        if need <= 0:
            for entry in chosen:
                self._forget(entry, in_queue=True)

    def _forget(self, entry, in_queue):
        if in_queue:
            self._by_size[entry.nbytes].remove(entry)
        if not self._by_size.get(entry.nbytes):
            self._by_size.pop(entry.nbytes, None)
        del self._lru[id(entry)]
        self._bytes -= entry.nbytes

    def _drop_all(self):
        self._by_size.clear()
        self._lru.clear()
        self._bytes = 0


def _itemsize(dtype):
    size = getattr(dtype, "itemsize", None)
    return size if size is not None else torch.empty(0, dtype=dtype).element_size()


@functools.cache
def _self_check():
    """Whether this torch build counts owners the way the idle test assumes."""
    if _use_count is None or not hasattr(sys, "getrefcount"):
        return False
    if hasattr(sys, "_is_gil_enabled") and not sys._is_gil_enabled():
        return False  # reference counts are not exact without the GIL
    try:
        entry = _Entry()
        entry.storage = torch.empty(64, dtype=torch.uint8).untyped_storage()
        entry.cdata = entry.storage._cdata
        entry.python_refs = _python_refs(entry)
        idle = lambda: (_use_count(entry.cdata) == 1  # noqa: E731
                        and _python_refs(entry) == entry.python_refs)
        if not idle():
            return False
        t = torch.empty(0, dtype=torch.float32).set_(entry.storage, 0, (4, 4))
        view = t[1:]
        del t
        if idle():
            return False  # a view alone must keep it busy
        storage = view.untyped_storage()
        del view
        if idle():
            return False  # the storage object alone must keep it busy
        del storage
        return idle()
    except Exception:  # noqa: BLE001 - any surprise means: do not pool
        return False


def current():
    """The running engine's pool (made at its first use in the session), or None before init.

    It belongs to the session (Note [One owner of Python state]): ``hvd.init()``
    starts with an empty one sized by HVDCOMPAT_OUTPUT_POOL_BYTES, and
    ``hvd.shutdown()`` drops it with what it holds.
    """
    session = _session.get()
    if session is None:
        return None
    if session.output_pool is None:
        pool = OutputPool()
        pool.configure(_core.setting("OUTPUT_POOL_BYTES"))
        session.output_pool = pool
    return session.output_pool
