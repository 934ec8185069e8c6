"""hvd.elastic.run: the retry loop around a training function, and the reset it performs."""

import functools
import os
import sys

from hvdcompat import _session, basics
from hvdcompat.exceptions import HorovodInternalError, HostsUpdatedInterrupt

__all__ = ["run", "run_fn", "reset", "last_reset_seconds"]


def last_reset_seconds():
    """Seconds the last reset on this rank took (None before the first); an hvdcompat extension.

    The answer belongs to the world the reset built: None again after
    shutdown and init.
    """
    session = _session.get()
    return session.last_reset_seconds if session is not None else None


def _knob_int(suffix):
    value = basics._core.knob(suffix)
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"HVDCOMPAT_{suffix}={value!r}: expected a whole number") from None


def _leave_if_host_removed():
    """A rank on a host that discovery removed leaves before the others shrink the job."""
    from hvdcompat.elastic import notifications

    if notifications.host_removed():
        print(f"hvdcompat: host {notifications.this_host()} was removed by host discovery; "
              f"rank {basics.rank()} leaves the job", flush=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # as a lost rank: no shutdown, no MPI_Finalize


def _mark_finished():
    """Tells hvdcompatrun's elastic driver that this rank finished training (and in which world)."""
    directory = basics._core.knob("ELASTIC_DIR")
    if directory:
        with open(os.path.join(directory, f"finished.{basics.rank()}"), "w") as f:
            f.write(f"{basics.size()}\n")


def reset():
    """Rebuilds the job from the ranks still alive, in place (collective over them).

    After a rank was lost (``hvdcompatrun --fault-tolerant`` or an elastic
    flag: Open MPI's ULFM), the survivors agree on who is left and continue
    as a smaller world: ranks keep their relative order, so the oldest
    survivor is rank 0, and ``hvd.rank()/size()/local_*()/cross_*()`` answer
    for the new world. Process sets keep their ids with their surviving
    members. Without a lost rank the world stays the same.

    Raises:
        HorovodInternalError: fewer ranks than ``--min-np`` survived.
    """
    _leave_if_host_removed()
    survivors = basics._elastic_reset()
    min_np = _knob_int("ELASTIC_MIN_NP")
    if min_np is not None and basics.size() < min_np:
        raise HorovodInternalError(
            f"elastic reset: only {basics.size()} rank(s) are left (the old world's ranks "
            f"{survivors}), fewer than --min-np {min_np}; the job cannot continue. Restart it "
            "with enough slots, or lower --min-np.")
    return survivors


def _agree_on_skip_sync(skip_sync):
    """True only when every rank of the new world may skip the sync (Horovod issue #3494)."""
    import torch

    from hvdcompat.ops import allreduce

    flag = torch.tensor([1 if skip_sync else 0], dtype=torch.int32)
    return bool(allreduce(flag, name="elastic.skip_sync", op=basics.Min).item())


def run_fn(func, reset_fn):
    """Wraps `func(state, ...)` in the elastic retry loop, with `reset_fn` as the reset."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        limit = _knob_int("ELASTIC_RESET_LIMIT")
        resets = 0
        skip_sync = False
        reset_required = False
        try:
            while True:
                if reset_required:
                    resets += 1
                    if limit is not None and resets > limit:
                        raise HorovodInternalError(
                            f"elastic training reached the reset limit (--reset-limit {limit}) "
                            "and stops; raise the limit or look at why ranks keep failing.")
                    reset_fn()
                    state.on_reset()
                try:
                    if reset_required:
                        # Ranks may have left func by different exceptions:
                        # all sync unless all may skip it.
                        skip_sync = _agree_on_skip_sync(skip_sync)
                    if not skip_sync:
                        state.sync()
                    result = func(state, *args, **kwargs)
                    _mark_finished()
                    return result
                except HorovodInternalError:
                    state.restore()
                    skip_sync = False
                except HostsUpdatedInterrupt as e:
                    skip_sync = e.skip_sync
                reset_required = True
        except Exception:
            # This rank leaves elastic training on an error: it must end as a
            # failed process (no graceful shutdown, no MPI_Finalize), so the
            # other ranks see it lost and carry on without it.
            basics._exit_as_failed_rank()
            raise

    return wrapper


def run(func):
    """Decorator: runs `func(state, ...)` elastically.

    Before each attempt ``state.sync()`` brings every rank to rank 0's state.
    When `func` raises :class:`HorovodInternalError` (a rank was lost or a
    collective failed), the state returns to the last ``commit()``, the job
    is rebuilt from the surviving ranks in place, the reset callbacks run and
    `func` is called again. When it raises :class:`HostsUpdatedInterrupt`
    (hosts changed; raised by ``commit()`` on every rank together), the job is
    reset without restoring. The sync after a reset is skipped only when every
    rank agrees it may be (hosts only removed).

    Collectives must not be run before `func` is entered (new ranks would
    meet them while the others sync).

    Args:
        func: a function whose first argument is a :class:`State`.

    Returns:
        The wrapped function; it returns what `func` returns.

    Raises:
        HorovodInternalError: fewer ranks than ``--min-np`` are left, or the
            ``--reset-limit`` was reached. Any other exception from `func`
            ends this rank as a failed rank of the job.
    """
    return run_fn(func, reset)
