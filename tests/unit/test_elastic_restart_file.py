"""The elastic restart state is unpickled only from a file and directory no other user can write."""

import os
import pickle
import re

import pytest
import torch

from hvdcompat import functions
from hvdcompat.elastic import loop, private_file


class _Planted:
    """Unpickling this runs code: it creates the file named in its argument."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


class _State:
    def __init__(self):
        self.loaded = None

    def load_saved_values(self, values):
        self.loaded = values


@pytest.fixture
def rank_zero(monkeypatch):
    monkeypatch.setattr(loop.basics, "rank", lambda: 0)
    monkeypatch.setattr(functions, "broadcast_object", lambda obj, root_rank, name: obj)


def _restore(monkeypatch, directory):
    monkeypatch.setattr(loop, "_elastic_dir", lambda: str(directory))
    state = _State()
    return state, loop._restore_after_restart(state)


def _plant(directory, marker):
    with open(directory / loop.RESTART_STATE, "wb") as f:
        pickle.dump({"state": _Planted(str(marker)), "meta": {}}, f)


@pytest.mark.parametrize("attack", ["group-writable dir", "world-writable file", "other owner",
                                    "symlink"])
def test_a_restart_file_another_user_could_write_is_refused_before_unpickling(
        tmp_path, monkeypatch, rank_zero, attack):
    directory = tmp_path / "elastic"
    directory.mkdir(mode=0o700)
    marker = tmp_path / "code-ran"
    if attack == "symlink":
        elsewhere = tmp_path / "elsewhere.pt"
        _plant(tmp_path, marker)
        os.rename(tmp_path / loop.RESTART_STATE, elsewhere)
        os.symlink(elsewhere, directory / loop.RESTART_STATE)
    else:
        _plant(directory, marker)
        os.chmod(directory / loop.RESTART_STATE, 0o600)
    if attack == "group-writable dir":
        os.chmod(directory, 0o770)
        needle = "writable by its group or by others (mode 0770)"
    elif attack == "world-writable file":
        os.chmod(directory / loop.RESTART_STATE, 0o666)
        needle = "writable by its group or by others (mode 0666)"
    elif attack == "other owner":
        if os.geteuid() != 0:
            pytest.skip("giving a file to another user needs root")
        os.chown(directory / loop.RESTART_STATE, 4321, -1)
        needle = "is owned by uid 4321, not by this user"
    else:
        needle = "is a symbolic link"
    with pytest.raises(private_file.UntrustedFileError, match=re.escape(needle)) as info:
        _restore(monkeypatch, directory)
    assert "HVDCOMPAT_ELASTIC_DIR" in str(info.value)
    assert not marker.exists(), "the planted pickle ran"


def test_rank_zeros_own_restart_file_is_private_whatever_the_umask_and_loads(
        tmp_path, monkeypatch, rank_zero):
    directory = tmp_path / "elastic"
    directory.mkdir(mode=0o700)
    old = os.umask(0o000)
    try:
        payload = {"state": {"weights": torch.arange(4.0), "epoch": 3}, "meta": {"resets": 2}}
        private_file.save(payload, str(directory / loop.RESTART_STATE))
    finally:
        os.umask(old)
    assert os.stat(directory / loop.RESTART_STATE).st_mode & 0o777 == 0o600
    assert not (directory / (loop.RESTART_STATE + ".tmp")).exists()
    state, meta = _restore(monkeypatch, directory)
    assert meta == {"resets": 2}
    assert state.loaded["epoch"] == 3 and torch.equal(state.loaded["weights"], torch.arange(4.0))
