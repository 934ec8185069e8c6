"""State and ObjectState: what elastic training saves, restores and syncs (framework-neutral)."""

import enum
import queue

from hvdcompat.exceptions import HostsUpdatedInterrupt

__all__ = ["HostUpdateResult", "State", "ObjectState"]


class HostUpdateResult(enum.IntFlag):
    """What a host change did (Horovod's values); combined with ``|``."""

    no_update = 0
    removed = 1
    added = 2
    mixed = removed | added


class State:
    """State kept in memory on every rank and rebuilt after a reset.

    Subclasses define :meth:`save`, :meth:`restore` and :meth:`sync`.

    Args:
        bcast_object: broadcasts a picklable object from rank 0 to every rank.
        get_rank: returns this process's current rank.
    """

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages = queue.Queue()
        self._last_updated_timestamp = 0
        self._host_update = HostUpdateResult.no_update  # what the last interrupt was for
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Adds functions to call after every reset (e.g. to rescale the learning rate).

        Args:
            callbacks: list of callables taking no argument.
        """
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        """Runs after a reset: forgets queued host notices and calls the reset callbacks."""
        self._host_messages = queue.Queue()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp, update_res=HostUpdateResult.mixed):
        """Queues a host-change notice (called on rank 0 by the notification channel).

        Args:
            timestamp: when the change was seen (newer notices win).
            update_res: a :class:`HostUpdateResult`.
        """
        self._host_messages.put((timestamp, update_res))

    def commit(self):
        """Saves the state, then checks for host changes.

        Commits copy the whole state (possibly from GPU memory), so commit
        every few batches rather than every batch: what is lost on a failure
        is the work since the last commit.

        Raises:
            HostsUpdatedInterrupt: on every rank together, when hosts changed.
        """
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every rank if hosts were added or removed.

        Only rank 0 reads host notices; its verdict is broadcast, so every rank
        raises (or not) together, with the same ``skip_sync``.

        Raises:
            HostsUpdatedInterrupt: hosts changed (``skip_sync`` when they were
                only removed).
        """
        from hvdcompat.elastic import notifications

        notifications.poll(self)
        prev = last = self._last_updated_timestamp
        update = HostUpdateResult.no_update
        while not self._host_messages.empty():
            timestamp, result = self._host_messages.get()
            if timestamp > last:
                last = timestamp
                update |= result
        prev, self._last_updated_timestamp, update = self._bcast_object(
            (prev, last, int(update)))
        if self._last_updated_timestamp > prev:
            self._host_update = HostUpdateResult(update)
            raise HostsUpdatedInterrupt(update == HostUpdateResult.removed)

    def save(self):
        """Saves the state in host memory."""
        raise NotImplementedError()

    def saved_values(self):
        """The last saved values, picklable, for a restart of the job on other hosts.

        When hosts are added, ``hvd.elastic.run`` writes this (with
        ``torch.save``) on rank 0, the launcher starts the job again on the
        new hosts, and rank 0 reads it back (:meth:`load_saved_values`)
        before the first sync.
        """
        raise NotImplementedError(
            f"{type(self).__name__} cannot be carried over a restart of the job (hosts were "
            "added): define saved_values() and load_saved_values(), or use ObjectState/"
            "TorchState")

    def load_saved_values(self, values):
        """Makes `values` (from :meth:`saved_values`) the saved and the current state."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot be carried over a restart of the job (hosts were "
            "added): define saved_values() and load_saved_values()")

    def restore(self):
        """Returns to the last saved state, undoing later changes."""
        raise NotImplementedError()

    def sync(self):
        """Makes every rank's state rank 0's."""
        raise NotImplementedError()


class ObjectState(State):
    """State made of plain Python objects, given as keyword arguments.

    Each keyword becomes an attribute; :meth:`save` records the attributes'
    current values, :meth:`restore` puts the recorded values back and
    :meth:`sync` broadcasts rank 0's recorded values.

    Args:
        bcast_object: broadcasts a picklable object from rank 0.
        get_rank: returns this process's current rank.
        **kwargs: the attributes and their initial values.
    """

    def __init__(self, bcast_object, get_rank, **kwargs):
        self._bcast_object = bcast_object
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}

    def restore(self):
        self._set_attrs()

    def saved_values(self):
        return {"objects": dict(self._saved_state)}

    def load_saved_values(self, values):
        self._saved_state = dict(values["objects"])
        self.restore()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)
