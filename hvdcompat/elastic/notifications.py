"""How the ranks hear of host changes: notices written by hvdcompatrun's elastic driver.

The driver appends one line per change to ``notices`` in the directory named
by the ``HVDCOMPAT_ELASTIC_DIR`` knob::

    <timestamp> <HostUpdateResult value> <removed hosts, comma-separated, or ->

Rank 0 reads the lines it has not read yet at every
:meth:`State.check_host_updates` (so at every commit) and broadcasts the
verdict, so every rank raises HostsUpdatedInterrupt together. At the reset
that follows, a rank whose host was removed leaves the job
(:func:`host_removed`).
"""

import os
import socket

# Only the core: hvd.init() on a worker that joins a running job calls
# forget_earlier_removals (hvdcompat/gloo_init.py), below hvdcompat.basics.
from hvdcompat._ext import _core

__all__ = ["poll", "host_removed", "forget_earlier_removals", "this_host", "notices_path"]

_offset = [0]  # bytes of the notices file already read by this process
# Where this process's removals start: a worker that joined a running job in
# place skips the notices written before it came (about the workers that ran
# on its host before it; hvdcompatrun starts none there while they live).
_removals_from = [0]


def notices_path():
    """The notices file, or None outside an elastic launch."""
    directory = _core.setting("ELASTIC_DIR")
    return os.path.join(directory, "notices") if directory else None


def this_host():
    """This rank's host name as discovery lists it (``HVDCOMPAT_ELASTIC_HOST`` or the machine's)."""
    return _core.setting("ELASTIC_HOST") or socket.gethostname()


def _lines(start=0):
    """(new offset, lines) of the notices file from byte `start`; whole lines only."""
    path = notices_path()
    if not path:
        return start, []
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read()
    except FileNotFoundError:
        return start, []
    end = data.rfind(b"\n") + 1  # a line still being written is read next time
    return start + end, [line.split() for line in data[:end].decode().splitlines()]


def poll(state):
    """Queues the notices written since the last poll on ``state`` (rank 0 only)."""
    if _core.rank() != 0:
        return
    _offset[0], lines = _lines(_offset[0])
    for fields in lines:
        if len(fields) >= 2:
            state.on_hosts_updated(float(fields[0]), int(fields[1]))


def forget_earlier_removals():
    """Makes :func:`host_removed` look only at notices written from now on."""
    _removals_from[0], _ = _lines(_removals_from[0])


def host_removed():
    """Whether any notice so far (since :func:`forget_earlier_removals`) removed this rank's host."""
    _, lines = _lines(_removals_from[0])
    me = this_host()
    return any(len(f) >= 3 and me in f[2].split(",") for f in lines)
