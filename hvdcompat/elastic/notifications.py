"""How rank 0 hears of host changes: notices written by hvdcompatrun's elastic driver.

The driver appends one line ``<timestamp> <HostUpdateResult value>`` to the
file named by ``HVDCOMPAT_ELASTIC_NOTICES`` whenever its discovery sees hosts
added or removed. Rank 0 reads the lines it has not read yet at every
:meth:`State.check_host_updates` (so at every commit) and broadcasts the
verdict; other ranks never read the file.
"""

import os

from hvdcompat.basics import rank

__all__ = ["NOTICES_ENV", "poll"]

NOTICES_ENV = "HVDCOMPAT_ELASTIC_NOTICES"

_offset = [0]  # bytes of the notices file already read by this process


def poll(state):
    """Queues the notices written since the last poll on ``state`` (rank 0 only)."""
    path = os.environ.get(NOTICES_ENV)
    if not path or rank() != 0:
        return
    try:
        with open(path, "rb") as f:
            f.seek(_offset[0])
            data = f.read()
    except FileNotFoundError:
        return
    end = data.rfind(b"\n") + 1  # a line still being written is read next time
    _offset[0] += end
    for line in data[:end].decode().splitlines():
        fields = line.split()
        if len(fields) == 2:
            state.on_hosts_updated(float(fields[0]), int(fields[1]))
