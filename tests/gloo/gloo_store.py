"""The store object the engine's Gloo controller takes (InitOptions(store=...)),
over torch's TCPStore, and a direct start of the engine on it: what hvd.init()
does on the Gloo controller, for tests that start their ranks themselves."""

import datetime

import torch.distributed as dist


class TorchStore:
    """set/get/add/wait over a torch TCPStore, under `prefix`."""

    def __init__(self, host, port, rank, size, prefix="hvdcompat-test/", timeout_s=60.0):
        self.where = f"TCPStore at {host}:{port}"
        self._store = dist.TCPStore(host, port, size, rank == 0,
                                    timeout=datetime.timedelta(seconds=timeout_s))
        self._prefix = prefix

    def set(self, key, value):
        self._store.set(self._prefix + key, value)

    def get(self, key):
        return self._store.get(self._prefix + key)

    def add(self, key, amount):
        return self._store.add(self._prefix + key, amount)

    def wait(self, keys, timeout_s):
        self._store.wait([self._prefix + k for k in keys], datetime.timedelta(seconds=timeout_s))

    def __str__(self):
        return self.where


def start_engine(store, rank, size, timeout_s=30.0, **fields):
    """Starts the engine on the Gloo controller and the Python session over it."""
    from hvdcompat import _core, _session
    from hvdcompat import process_sets as _ps

    _core.init(_core.InitOptions(controller="gloo", store=store, rank=rank, size=size,
                                 gloo_hostname="127.0.0.1", gloo_timeout_s=timeout_s, **fields))
    _ps._after_init(_ps._parse_init_argument(None, None), _session.begin())
