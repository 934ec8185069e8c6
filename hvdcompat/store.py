"""The rendezvous store: how ranks that no MPI launcher started find each other.

The engine's Gloo controller meets its peers through a key-value store, at
``hvd.init()`` and at an elastic reset only (never per collective). This
module is that seam (Note [Store seam]): :class:`TCPStoreClient` adapts
``torch.distributed.TCPStore`` as a client, and :func:`serve` starts the
store a launcher serves (``hvdcompatrun --gloo``). Under ``torchrun`` the
store is the launcher agent's own, at MASTER_ADDR:MASTER_PORT.

Note [Store seam]: the engine calls four methods and nothing else, from the
thread that runs ``hvd.init()``:

    set(key: str, value: bytes) -> None
    get(key: str) -> bytes           blocks until the key exists; raises on timeout
    add(key: str, amount: int) -> int
    wait(keys: list[str], timeout_s: float) -> None   raises on timeout

Any object with these methods is a store: a launcher that keeps its own
key-value service (a Ray actor, a Kubernetes operator's endpoint) only needs
an adapter of this shape. Keys are plain strings and values bytes; the store
must be shared by every rank of the job and keep a key until the job ends.
The client puts every key under a prefix of its own
(``hvdcompat/<attempt>/<init>/``), so the same store also serves the
script's own ``init_process_group`` (whose keys torch prefixes differently),
a restarted torchrun worker group (a new attempt) and an ``hvd.init()``
after ``hvd.shutdown()`` (a new init) without one seeing the other's keys.
"""

import datetime
import socket
import threading
import time

__all__ = ["DEFAULT_TIMEOUT_SECONDS", "StoreError", "TCPStoreClient", "serve", "key_prefix"]

# Horovod's --gloo-timeout-seconds default.
DEFAULT_TIMEOUT_SECONDS = 30.0


class StoreError(RuntimeError):
    """The rendezvous store could not be reached or did not answer in time."""


def key_prefix(attempt=0, init=0):
    """The prefix under which one init of hvdcompat keeps its keys."""
    return f"hvdcompat/{attempt}/{init}/"


def _timedelta(seconds):
    return datetime.timedelta(seconds=float(seconds))


def _check_timeout(timeout_s):
    try:
        value = float(timeout_s)
    except (TypeError, ValueError):
        raise ValueError(f"rendezvous store: timeout must be a number of seconds, got "
                         f"{timeout_s!r}") from None
    if not value > 0:
        raise ValueError(f"rendezvous store: timeout must be positive, got {timeout_s!r}")
    return value


def _check_port(port, source):
    try:
        value = int(port)
    except (TypeError, ValueError):
        raise ValueError(f"rendezvous store: {source}: port {port!r} is not a number") from None
    if not 0 < value < 65536:
        raise ValueError(f"rendezvous store: {source}: port {value} is not in 1..65535")
    return value


class TCPStoreClient:
    """A client of a ``torch.distributed.TCPStore``, with hvdcompat's key prefix.

    Args:
        host: the store's address or host name.
        port: its port.
        prefix: put before every key (see :func:`key_prefix`).
        timeout_s: how long connecting, :meth:`get` and :meth:`wait` may take.
        source: where the address came from (e.g. ``"MASTER_ADDR:MASTER_PORT"``),
            named in errors so the user knows what to fix.

    Raises:
        StoreError: the store was not reachable within `timeout_s`; the
            message names the address and where it came from.
        ValueError: a bad port or timeout.
    """

    def __init__(self, host, port, *, prefix=None, timeout_s=DEFAULT_TIMEOUT_SECONDS,
                 source="the store address"):
        from torch.distributed import TCPStore

        self.host = str(host)
        self.source = source
        self.port = _check_port(port, source)
        self.timeout_s = _check_timeout(timeout_s)
        self.prefix = key_prefix() if prefix is None else str(prefix)
        self.failed = False
        deadline = time.monotonic() + self.timeout_s
        self._wait_until_listening(deadline)
        self._store = self._handshake(TCPStore, deadline)
        # Later waits (get, wait) get the whole timeout again.
        self._store.set_timeout(_timedelta(self.timeout_s))

    def _handshake(self, TCPStore, deadline):
        """torch's client, made in a thread: its handshake with a peer that accepts but
        never answers has no timeout of its own (it waited forever)."""
        left = max(1.0, deadline - time.monotonic())
        made = {}

        def connect():
            try:
                made["store"] = TCPStore(self.host, self.port, is_master=False,
                                         timeout=_timedelta(left), wait_for_workers=False)
            except (RuntimeError, OSError) as e:
                made["error"] = e

        worker = threading.Thread(target=connect, name="hvdcompat-store-connect", daemon=True)
        worker.start()
        worker.join(left + 1.0)
        if "store" in made:
            return made["store"]
        why = _first_line(made["error"]) if "error" in made else "no answer"
        raise self._unreachable(f"it accepted the connection but did not answer as a "
                                f"TCPStore ({why})")

    def _unreachable(self, why):
        return StoreError(
            f"rendezvous store {self.address} ({self.source}) could not be reached within "
            f"{self.timeout_s:g} s: {why}. Check that the launcher (torchrun's agent, or "
            "hvdcompatrun --gloo) runs there and that this host can reach that address and "
            "port (firewall, --network-interfaces); raise the wait with "
            "--gloo-timeout-seconds / HOROVOD_GLOO_TIMEOUT_SECONDS")

    def _wait_until_listening(self, deadline):
        """Returns once a TCP connection to the store succeeds; StoreError at `deadline`.

        torch's own connect loop retries past its timeout (a refused port
        took 2.7 times it), so the deadline is kept here.
        """
        try:
            infos = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        except OSError as e:
            # An unknown name is an error at once, not after the timeout.
            raise StoreError(
                f"rendezvous store {self.address} ({self.source}): the host name cannot be "
                f"resolved ({e.strerror or e}); set {self.source} to an address of the host "
                "that serves the store") from None
        last = "no answer"
        while True:
            for family, kind, proto, _, sockaddr in infos:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    with socket.socket(family, kind, proto) as s:
                        s.settimeout(min(left, 5.0))
                        s.connect(sockaddr)
                    return
                except OSError as e:
                    last = e.strerror or str(e) or type(e).__name__
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._unreachable(f"last attempt: {last}")
            time.sleep(min(0.25, left))

    @classmethod
    def over(cls, store, host, port, *, prefix=None, timeout_s=DEFAULT_TIMEOUT_SECONDS,
             source="the store address"):
        """A client over a torch store this process already has (e.g. the default group's).

        `host` and `port` only name it in errors.
        """
        self = cls.__new__(cls)
        self.host, self.port, self.source = str(host), int(port), source
        self.timeout_s = _check_timeout(timeout_s)
        self.prefix = key_prefix() if prefix is None else str(prefix)
        self.failed = False
        self._store = store
        return self

    def with_prefix(self, prefix):
        """A client with another key prefix over this one's connection."""
        return TCPStoreClient.over(self._store, self.host, self.port, prefix=prefix,
                                   timeout_s=self.timeout_s, source=self.source)

    @property
    def address(self):
        """``host:port`` of the store."""
        return f"{self.host}:{self.port}"

    def __repr__(self):
        return f"TCPStoreClient({self.address}, prefix={self.prefix!r})"

    def __str__(self):
        # How the engine names the store in its errors.
        return f"TCPStore at {self.address} ({self.source})"

    def _key(self, key):
        if not isinstance(key, str):
            raise TypeError(f"rendezvous store: keys are str, got {type(key).__name__}")
        return self.prefix + key

    def set(self, key, value):
        """Stores `value` (bytes) under `key`, replacing what was there."""
        if isinstance(value, str):
            value = value.encode()
        try:
            self._store.set(self._key(key), bytes(value))
        except RuntimeError as e:
            raise self._error(f"set({key!r})", e) from None

    def get(self, key):
        """The bytes under `key`, waiting up to the timeout for some rank to set it."""
        try:
            return bytes(self._store.get(self._key(key)))
        except RuntimeError as e:
            raise self._error(f"get({key!r})", e, waited=self.timeout_s) from None

    def add(self, key, amount):
        """Adds `amount` to the counter `key` (0 when absent); returns the new value."""
        try:
            return int(self._store.add(self._key(key), int(amount)))
        except RuntimeError as e:
            raise self._error(f"add({key!r})", e) from None

    def wait(self, keys, timeout_s=None):
        """Returns once every key of `keys` exists; raises StoreError after `timeout_s`."""
        keys = [keys] if isinstance(keys, str) else list(keys)
        seconds = self.timeout_s if timeout_s is None else _check_timeout(timeout_s)
        try:
            self._store.wait([self._key(k) for k in keys], _timedelta(seconds))
        except RuntimeError as e:
            raise self._error(f"wait({keys!r})", e, waited=seconds) from None

    def _error(self, call, e, waited=None):
        self.failed = True  # the connection may be out of step: not to be reused
        if waited is not None and _is_timeout(e):
            return StoreError(
                f"rendezvous store {self.address} ({self.source}): {call} timed out after "
                f"{waited:g} s: some rank has not reached hvd.init() (it failed to start, is "
                "still starting, or was given another world size). Check every rank's output; "
                "raise the wait with --gloo-timeout-seconds / HOROVOD_GLOO_TIMEOUT_SECONDS")
        return StoreError(f"rendezvous store {self.address} ({self.source}): {call} failed: "
                          f"{_first_line(e)}; the process serving the store (torchrun's agent, "
                          "hvdcompatrun --gloo, or rank 0) may have ended")


def _first_line(e):
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _is_timeout(e):
    return "timeout" in str(e).lower() or "timed out" in str(e).lower() or \
        type(e).__name__ == "DistStoreError"


def serve(host="0.0.0.0", port=0, timeout_s=DEFAULT_TIMEOUT_SECONDS):
    """Starts a TCPStore server in this process (the launcher's side).

    Args:
        host: address to listen on.
        port: port to listen on; 0 picks a free one.
        timeout_s: the server's own operation timeout.

    Returns:
        (server object, port it listens on). The store serves while the object
        lives.

    Raises:
        StoreError: the port cannot be bound.
    """
    from torch.distributed import TCPStore

    try:
        server = TCPStore(host, int(port), is_master=True, wait_for_workers=False,
                          timeout=_timedelta(_check_timeout(timeout_s)))
    except (RuntimeError, OSError) as e:
        raise StoreError(f"rendezvous store: cannot listen on {host}:{port}: {_first_line(e)}; "
                         "pick another port or free this one") from None
    return server, server.port
