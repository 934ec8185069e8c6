"""torch.distributed ``Work`` objects and futures backed by engine handles.

Note [Completing futures]: DDP's reducer and communication hooks wait on
``torch.futures.Future`` objects, which only complete when someone calls
``set_result``. The engine has no Python callbacks, so one daemon thread per
process (the completer) waits on engine handles in the order they were
submitted, with the GIL released while it waits, runs each op's finishing
step (copying results out), and completes its future. Submission order is
the same on every rank, so waiting in that order never waits on an op that
needs something this rank has not submitted yet.
"""

import collections
import threading

import torch.distributed as dist
from torch.futures import Future

from hvdcompat.ops.handles import synchronize

__all__ = ["EngineWork", "submit", "completed_future"]


class _Pending:
    __slots__ = ("handles", "finish", "future", "on_done")

    def __init__(self, handles, finish, future, on_done):
        self.handles = handles
        self.finish = finish
        self.future = future
        self.on_done = on_done

    def complete(self):
        results, error = [], None
        # Every handle is synchronized even after a failure, so none is left
        # behind in the handle table.
        for h in self.handles:
            try:
                results.append(synchronize(h))
            except BaseException as e:  # noqa: BLE001 - delivered through the future
                error = error or e
        if error is None:
            try:
                value = self.finish(results)
            except BaseException as e:  # noqa: BLE001
                error = e
        for fn in self.on_done:
            fn()
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(value)


class _Completer:
    """Waits on engine handles in submission order and completes their futures.

    Contract: :meth:`submit` never blocks and may be called from any thread;
    futures complete (and their ``then`` callbacks run) on the completer
    thread.
    """

    def __init__(self):
        self._cv = threading.Condition()
        self._queue = collections.deque()
        self._thread = None

    def submit(self, pending):
        with self._cv:
            self._queue.append(pending)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="hvdcompat-ddp-completer",
                                                daemon=True)
                self._thread.start()
            self._cv.notify()

    def _run(self):
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                pending = self._queue.popleft()
            pending.complete()


_completer = _Completer()


def submit(handles, finish, on_done=()):
    """Hands engine `handles` to the completer; returns the future it will complete.

    Args:
        handles: engine handles of one logical operation.
        finish: ``finish(results) -> value``, run on the completer thread after
            every handle finished; `results` are what ``synchronize`` returned.
        on_done: callables run on the completer thread before the future completes.
    """
    fut = Future()
    _completer.submit(_Pending(list(handles), finish, fut, list(on_done)))
    return fut


def completed_future(value):
    """A future that is already complete with `value`."""
    fut = Future()
    fut.set_result(value)
    return fut


class EngineWork(dist.Work):
    """The ``Work`` of one hvdcompat collective issued through torch.distributed.

    Contract: ``is_completed`` and ``get_future`` never block; ``wait`` blocks
    until the collective finished on this rank and raises its error (for
    example :class:`hvdcompat.HorovodInternalError` when ranks disagreed on it).
    Thread-safe.
    """

    def __init__(self, future, call, outputs):
        super().__init__()
        self._future = future
        self._call = call
        self._outputs = outputs

    def wait(self, timeout=None):
        """Blocks until done; raises the collective's error. `timeout` is not enforced."""
        self._future.wait()
        return True

    def is_completed(self):
        return self._future.done()

    def is_success(self):
        if not self._future.done():
            return False
        try:
            self._future.value()
        except Exception:  # noqa: BLE001 - only asks whether it failed
            return False
        return True

    def exception(self):
        if not self._future.done():
            return None
        try:
            self._future.value()
        except Exception as e:  # noqa: BLE001
            return e
        return None

    def get_future(self):
        return self._future

    def result(self):
        self.wait()
        return self._outputs

    def synchronize(self):
        self.wait()

    def __repr__(self):
        state = "done" if self._future.done() else "pending"
        return f"EngineWork({self._call}, {state})"

