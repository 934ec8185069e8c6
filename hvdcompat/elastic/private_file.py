"""Reading the elastic restart state only from a file that nobody else could have written.

The restart state (``restart.pt``, Note [Growing by restart] in ``loop.py``)
holds the training script's own objects, so it is read with
``torch.load(weights_only=False)``, which unpickles, and unpickling runs code.
HVDCOMPAT_ELASTIC_DIR may be on a file system other users share, so before
anything is unpickled, the directory and the file (checked through the open
descriptor, so a file swapped in after the check is never read) must be owned
by this process's user and writable by no one else: hvdcompatrun creates the
directory with ``mkdtemp`` (mode 0700), and rank 0 writes the file in it with
mode 0600 whatever its umask (:func:`save`).
"""

import errno
import os
import stat

__all__ = ["UntrustedFileError", "check_private", "load", "save"]


class UntrustedFileError(PermissionError):
    """The restart state's directory or file could have been written by another user."""


def _why_not_private(st):
    uid = os.geteuid()
    if st.st_uid != uid:
        return f"is owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by its group or by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _refuse(path, why):
    raise UntrustedFileError(
        f"elastic restart: {path} {why}. The restart state is unpickled (which runs code), so "
        "hvdcompat reads it only from a directory and file that this user owns and nobody else "
        "can write. Point HVDCOMPAT_ELASTIC_DIR at a directory of your own that is not writable "
        "by group or others (hvdcompatrun makes a private subdirectory in it for each job), "
        "and delete the file if you did not write it.")


def check_private(directory):
    """Raises UntrustedFileError unless ``directory`` is this user's and writable by no one else."""
    why = _why_not_private(os.stat(directory))
    if why:
        _refuse(directory, why)


def load(path):
    """``torch.load`` of ``path`` after checking that it and its directory are private.

    Raises:
        UntrustedFileError: the directory or the file is another user's, or
            writable by group or others (nothing was unpickled).
        FileNotFoundError: there is no such file.
    """
    import torch

    check_private(os.path.dirname(os.path.abspath(path)))
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as e:
        if e.errno == errno.ELOOP:
            _refuse(path, "is a symbolic link")
        raise
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            _refuse(path, "is not a regular file")
        why = _why_not_private(st)
        if why:
            _refuse(path, why)
        return torch.load(f, weights_only=False)


def save(obj, path):
    """``torch.save`` of ``obj`` to ``path``, created with mode 0600 (atomically, via ``.tmp``)."""
    import torch

    tmp = path + ".tmp"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)  # whatever the umask
        torch.save(obj, f)
    os.replace(tmp, path)
