"""hvd.elastic.run: the retry loop around a training function, and the reset it performs."""

import functools
import os
import sys
import time

from hvdcompat import _session, basics
from hvdcompat import gloo_init as _gloo
from hvdcompat.exceptions import HorovodInternalError, HostsUpdatedInterrupt

__all__ = ["run", "run_fn", "reset", "last_reset_seconds", "last_restart",
           "RESTART_EXIT_CODE"]

# Every rank exits with this code when the job restarts on a new set of hosts
# (Note [Growing by restart]); hvdcompatrun's elastic driver relaunches it.
RESTART_EXIT_CODE = 75
RESTART_STATE = "restart.pt"  # in HVDCOMPAT_ELASTIC_DIR, written by rank 0
RESTART_MARK = "restart"      # written by rank 0 once RESTART_STATE is complete
LOST_RANKS = "lost"           # "<time> <rank,rank>" lines rank 0 writes after a shrink
# Written by hvdcompatrun's elastic driver (hvdcompat/runner/elastic/): DRIVER_MARK
# when it makes the directory, RESTART_EXPECTED (the restart mark's time) before
# it relaunches the job to continue from RESTART_STATE.
DRIVER_MARK = "driver"
RESTART_EXPECTED = "restart.expected"

# Note [Growing by restart]: when hosts are added, commit() raises
# HostsUpdatedInterrupt on every rank with the "added" bit set. Rank 0 writes
# the last saved state (State.saved_values) and the loop's reset count to
# RESTART_STATE, every rank leaves with RESTART_EXIT_CODE, and the launcher
# starts the job again with the surviving hosts first, then the new ones; so
# the new rank 0 runs where the old one did and reads the file back before the
# first sync broadcasts it. The file lives in the driver's directory, which
# every rank checks it sees at the start (_check_elastic_dir), so it outlives
# the host that wrote it; a relaunch the driver made to continue from it
# (RESTART_EXPECTED) fails on every rank when rank 0 cannot read it, rather
# than training again from the initial state with the reset count at 0. Growing in place (MPI_Comm_spawn + merge) was
# measured under ULFM on Open MPI 5.0: the merge waited ~10 s for the child's
# imports and MPI_Finalize then crashed or hung; a restart costs one mpirun
# start and the imports, and leaves no spawned communicator behind.

# How this launch began when it restarted the job on new hosts (Note [Growing
# by restart]): set once at the start of the elastic loop, for the process.
_last_restart = [None]


def last_reset_seconds():
    """Seconds the last reset on this rank took (None before the first); an hvdcompat extension.

    The answer belongs to the world the reset built: None again after
    shutdown and init.
    """
    session = _session.get()
    return session.last_reset_seconds if session is not None else None


def _knob_int(suffix):
    """A whole-number knob, None when unset (the core's knob table parses it)."""
    return basics._core.setting(suffix)


def _leave_if_host_removed():
    """A rank on a host that discovery removed leaves before the others shrink the job."""
    from hvdcompat.elastic import notifications

    if notifications.host_removed():
        print(f"hvdcompat: host {notifications.this_host()} was removed by host discovery; "
              f"rank {basics.rank()} leaves the job", flush=True)
        basics._leave_elastic_job()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # as a lost rank: no shutdown, no MPI_Finalize


def last_restart():
    """How this launch began when it restarted the job on new hosts, else None; an extension.

    A dict with ``hosts_updated_at`` (time.time() of the launcher's notice
    that hosts were added), ``saved_at`` (when rank 0 wrote the state) and
    ``resets`` (resets so far, the restart included); the same on every rank.
    """
    return _last_restart[0]


def _elastic_dir():
    return basics._core.setting("ELASTIC_DIR") or None


def _host():
    from hvdcompat.elastic import notifications

    return notifications.this_host()


def _dir_problem(directory):
    """(why this rank cannot use the directory or None, whether it sees the driver's mark)."""
    if not os.path.isdir(directory):
        return "it does not exist on this host", False
    if not os.access(directory, os.W_OK | os.X_OK):
        return "this rank may not write there", False
    return None, os.path.exists(os.path.join(directory, DRIVER_MARK))


def _check_elastic_dir():
    """At the start of an elastic launch every rank checks it sees the driver's directory.

    The ranks hear of host changes, leave the restart state and mark their
    end there; a rank that cannot would fail later, or a restart would
    silently start from scratch. Under hvdcompatrun a rank that does not see
    the driver's mark sees another directory of the same name (another
    host's file system). Collective (one allgather): every rank raises the
    same error naming the ranks that cannot.
    """
    from hvdcompat.functions import allgather_object

    directory = _elastic_dir()
    if not directory:
        return
    problem, marked = _dir_problem(directory)
    seen = allgather_object((problem, marked, _host()), name="elastic.dir_check")
    driver = any(m for _, m, _ in seen)
    other = ("hvdcompatrun's mark is not there: it is another file system's directory of "
             "that name")
    bad = [f"rank {r} on host {h}: {p or other}"
           for r, (p, m, h) in enumerate(seen) if p or (driver and not m)]
    if bad:
        raise RuntimeError(
            f"hvd.elastic.run: HVDCOMPAT_ELASTIC_DIR={directory} (the elastic driver's "
            f"directory) is not usable by every rank: {'; '.join(bad)}. The ranks read host "
            "notices, leave the restart state and mark their end there: before hvdcompatrun, "
            "set HVDCOMPAT_ELASTIC_DIR to a directory that every host shares with the "
            "machine running hvdcompatrun (e.g. on NFS).")


def _restore_after_restart(state):
    """At the start of an elastic launch: rank 0 reads the state the last launch left, if any.

    Every rank of an elastic launch takes part (one broadcast), whether or
    not this launch is a restart. Returns the restart's dict or None.

    Raises:
        RuntimeError: on every rank, when the driver relaunched the job to
            continue from the saved state and rank 0 cannot read it.
    """
    from hvdcompat.functions import broadcast_object

    directory = _elastic_dir()
    if not directory:
        return None
    meta = None
    path = os.path.join(directory, RESTART_STATE)
    if basics.rank() == 0:
        expected = _read_restart_expected(directory)
        try:
            if expected is not None and not os.path.exists(path):
                raise FileNotFoundError(f"{path} is missing")
            if os.path.exists(path):
                from hvdcompat.elastic import private_file

                # Refuses a file another user could have written (it is unpickled).
                payload = private_file.load(path)
                if expected is not None and f"{payload['meta']['saved_at']:.6f}" != expected:
                    raise ValueError(f"{path} was saved at {payload['meta']['saved_at']:.6f}, "
                                     f"not at {expected} as the restart's mark says")
                state.load_saved_values(payload["state"])
                meta = payload["meta"]
        except Exception as e:  # noqa: BLE001 - told to every rank below
            if expected is None:
                raise
            meta = {"error": (
                f"hvd.elastic.run: the job was restarted on new hosts to continue from its "
                f"last commit, but rank 0 (host {_host()}) cannot read the saved state: "
                f"{type(e).__name__}: {e}. The job stops rather than train again from the "
                "initial state; start it again (from your own checkpoint), and keep "
                "HVDCOMPAT_ELASTIC_DIR on storage that outlives any one host.")}
    meta = broadcast_object(meta, root_rank=0, name="elastic.restart")
    if meta is not None and "error" in meta:
        raise RuntimeError(meta["error"])
    _last_restart[0] = meta
    return meta


def _read_restart_expected(directory):
    """The saved_at of the state the driver relaunched the job to continue from, or None."""
    try:
        with open(os.path.join(directory, RESTART_EXPECTED)) as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


def _restart_for_new_hosts(state, resets):
    """Rank 0 writes the saved state for the next launch; then every rank exits to be relaunched."""
    import torch

    from hvdcompat.elastic import private_file
    from hvdcompat.ops import allreduce

    directory = _elastic_dir()
    if basics.rank() == 0:
        meta = {"resets": resets, "hosts_updated_at": state._last_updated_timestamp,
                "saved_at": time.time(), "size": basics.size()}
        path = os.path.join(directory, RESTART_STATE)
        private_file.save({"state": state.saved_values(), "meta": meta}, path)
        with open(os.path.join(directory, RESTART_MARK + ".tmp"), "w") as f:
            f.write(f"{meta['saved_at']:.6f}\n")
        os.replace(os.path.join(directory, RESTART_MARK + ".tmp"),
                   os.path.join(directory, RESTART_MARK))
        print(f"hvdcompat: hosts were added; the job restarts from the last commit on "
              f"{basics.size()} rank(s) plus the new hosts' (state in {path})", flush=True)
    try:
        # Nobody leaves before rank 0's file is complete.
        allreduce(torch.zeros(1), name="elastic.restart")
    except HorovodInternalError:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(RESTART_EXIT_CODE)  # as a lost rank: no MPI_Finalize (the launcher relaunches)


# Rank-side notices to the driver: a write that fails is tried again after
# these pauses (seconds), then logged; the rank carries on either way.
_NOTICE_RETRY_PAUSES = (0.1, 0.5)


def _write_notice(name, text, mode, what):
    """Writes `text` to `name` in the driver's directory; False (logged) when it cannot.

    An OSError (an NFS hiccup, a full disk) must not end a rank that is
    training: the notice is tried again, then reported and left out.
    """
    path = os.path.join(_elastic_dir(), name)
    for pause in (*_NOTICE_RETRY_PAUSES, None):
        try:
            with open(path, mode) as f:
                f.write(text)
            return True
        except OSError as e:
            if pause is None:
                print(f"hvdcompat: rank {basics.rank()} on host {_host()} could not write "
                      f"{path} ({e}) after {len(_NOTICE_RETRY_PAUSES) + 1} tries; {what}. "
                      "Training goes on; check HVDCOMPAT_ELASTIC_DIR's storage.",
                      file=sys.stderr, flush=True)
                return False
            time.sleep(pause)


def _report_lost(world, survivors):
    """Rank 0 names the lost ranks (ranks of this launch) for the launcher's blacklist."""
    lost = [r for i, r in enumerate(world) if i not in set(survivors)]
    if lost and _elastic_dir() and basics.rank() == 0:
        _write_notice(LOST_RANKS, f"{time.time():.6f} {','.join(map(str, lost))}\n", "a",
                      f"hvdcompatrun will not blacklist the hosts of lost rank(s) "
                      f"{', '.join(map(str, lost))}")
    return [world[i] for i in survivors]


def _mark_finished():
    """Tells hvdcompatrun's elastic driver that this rank finished training (and in which world)."""
    if _elastic_dir():
        _write_notice(f"finished.{basics.rank()}", f"{basics.size()}\n", "w",
                      "hvdcompatrun's exit code will be mpirun's, not the finished world's")


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


def _agree_after_reset(skip_sync, resets):
    """(skip the sync, resets so far) as every rank of the new world agrees.

    The sync is skipped only when every rank may skip it (Horovod issue
    #3494); the reset count is the highest any rank has (a worker that joined
    in place has none of its own).
    """
    import torch

    from hvdcompat.ops import allreduce

    mine = torch.tensor([1 if skip_sync else 0, -resets], dtype=torch.int64)
    low = allreduce(mine, name="elastic.skip_sync", op=basics.Min)
    return bool(low[0].item()), int(-low[1].item())


def _on_gloo():
    return bool(getattr(basics._core, "gloo_enabled", bool)())


def run_fn(func, reset_fn):
    """Wraps `func(state, ...)` in the elastic retry loop, with `reset_fn` as the reset."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        from hvdcompat.elastic.common import HostUpdateResult

        limit = _knob_int("ELASTIC_RESET_LIMIT")
        resets = 0
        skip_sync = False
        reset_required = False
        grow = False
        # A worker that joined a running job in place (Note [Growing in place
        # on Gloo]) meets the others where their reset left them: at the
        # agreement after it, then the sync from their rank 0.
        agree = _gloo.joined_running_job()
        # This launch's ranks, in current-rank order (the lost ones are
        # reported). On Gloo hvdcompatrun sees its workers end itself.
        world = list(range(basics.size())) \
            if basics._core.is_initialized() and not _on_gloo() else []
        try:
            if not agree:
                _check_elastic_dir()
                restarted = _restore_after_restart(state)
                if restarted:
                    resets = restarted["resets"]
            while True:
                if reset_required:
                    resets += 1
                    if limit is not None and resets > limit:
                        raise HorovodInternalError(
                            f"elastic training reached the reset limit (--reset-limit {limit}) "
                            f"after {resets - 1} reset(s) and stops; raise the limit or look at "
                            "why ranks keep failing.")
                    if grow:
                        _restart_for_new_hosts(state, resets)
                    survivors = reset_fn()
                    if isinstance(survivors, list) and world:
                        world = _report_lost(world, survivors)
                    state.on_reset()
                    agree = True
                try:
                    if agree:
                        # Ranks may have left func by different exceptions:
                        # all sync unless all may skip it.
                        skip_sync, resets = _agree_after_reset(skip_sync, resets)
                        agree = False
                    if not skip_sync:
                        state.sync()
                    grow = False
                    result = func(state, *args, **kwargs)
                    _mark_finished()
                    return result
                except HorovodInternalError:
                    state.restore()
                    skip_sync = False
                except HostsUpdatedInterrupt as e:
                    skip_sync = e.skip_sync
                    # On Gloo added hosts' workers join at the reset, in place.
                    grow = bool(getattr(state, "_host_update", 0) & HostUpdateResult.added) \
                        and _elastic_dir() is not None and not _on_gloo()
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
