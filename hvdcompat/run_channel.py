"""The authenticated channel between :func:`hvdcompat.run` and its ranks.

Note [Run channel]: ``hvdcompat.run`` sends each rank the pickled function
and receives its return value or its traceback. MPI cannot carry this (the
driver is not an MPI process), so the driver listens on a TCP port and every
rank connects to it. The port is reachable by anyone who can reach the
machine, and what travels is pickles (which run code when loaded), so both
sides prove they hold a per-job secret before anything is unpickled: the
driver challenges the rank and the rank challenges the driver (HMAC-SHA256
over fresh nonces; frames before that are at most 64 bytes and never
unpickled). The secret reaches the ranks in their environment, never on a
command line (which ``ps`` shows to every user of a node).

Wire format: every frame is an 8-byte big-endian length and that many bytes;
after the handshake a frame holds one pickled Python object.
"""

import hashlib
import hmac
import pickle
import secrets
import socket
import struct
import threading
import time

__all__ = ["SECRET_ENV", "ChannelError", "Connection", "Listener", "connect", "new_secret",
           "route_address"]

# The job secret, hex, in the ranks' environment; set by hvdcompat.run for its
# own ranks only (not a knob).
SECRET_ENV = "HVDCOMPAT_RUN_SECRET"

_LENGTH = struct.Struct("!Q")
_NONCE_BYTES = 32
_HANDSHAKE_FRAME_LIMIT = 64
_ACCEPT_POLL_S = 0.2


class ChannelError(ConnectionError):
    """The peer went away, or failed to authenticate."""


def new_secret():
    """A fresh random job secret (bytes)."""
    return secrets.token_bytes(32)


def _digest(secret, label, nonce):
    return hmac.new(secret, label + nonce, hashlib.sha256).digest()


class Connection:
    """One socket carrying length-prefixed frames.

    Not thread-safe: one thread sends and receives on a connection; another
    thread may only :meth:`close` it (which wakes a blocked receive).
    """

    def __init__(self, sock):
        self._sock = sock

    def send_bytes(self, data):
        """Sends one frame; raises ChannelError when the peer has gone."""
        try:
            self._sock.sendall(_LENGTH.pack(len(data)))
            self._sock.sendall(data)
        except OSError as e:
            raise ChannelError(f"sending to the peer failed: {e}") from None

    def recv_bytes(self, limit=None):
        """Receives one frame (at most ``limit`` bytes when given)."""
        (length,) = _LENGTH.unpack(self._recv_exact(_LENGTH.size))
        if limit is not None and length > limit:
            raise ChannelError(f"the peer sent a {length}-byte frame where at most {limit} "
                               "were expected (not an hvdcompat.run peer?)")
        return bytes(self._recv_exact(length))

    def send(self, obj):
        """Sends one picklable object."""
        self.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))

    def recv(self):
        """Receives one object (only call after the handshake: it unpickles)."""
        return pickle.loads(self.recv_bytes())

    def close(self):
        """Closes the socket; a receive blocked in another thread returns an error."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def _recv_exact(self, n):
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            try:
                k = self._sock.recv_into(view[got:])
            except OSError as e:
                raise ChannelError(f"receiving from the peer failed: {e}") from None
            if k == 0:
                raise ChannelError("the peer closed the connection")
            got += k
        return buf


def _driver_handshake(conn, secret):
    nonce = secrets.token_bytes(_NONCE_BYTES)
    conn.send_bytes(nonce)
    reply = conn.recv_bytes(_HANDSHAKE_FRAME_LIMIT)
    if len(reply) != 2 * _NONCE_BYTES or not hmac.compare_digest(
            reply[:_NONCE_BYTES], _digest(secret, b"rank", nonce)):
        raise ChannelError("a connection to hvdcompat.run's port failed authentication")
    conn.send_bytes(_digest(secret, b"driver", reply[_NONCE_BYTES:]))


def _rank_handshake(conn, secret):
    nonce = conn.recv_bytes(_HANDSHAKE_FRAME_LIMIT)
    mine = secrets.token_bytes(_NONCE_BYTES)
    conn.send_bytes(_digest(secret, b"rank", nonce) + mine)
    proof = conn.recv_bytes(_HANDSHAKE_FRAME_LIMIT)
    if not hmac.compare_digest(proof, _digest(secret, b"driver", mine)):
        raise ChannelError("the driver failed authentication (wrong job secret)")


class Listener:
    """Accepts ranks on a TCP port and serves each in its own thread.

    ``handler(conn)`` runs once per authenticated connection, in a daemon
    thread of its own, and must not raise. Connections that fail the
    handshake are dropped silently. :meth:`start` and :meth:`stop` are called
    from the driver's thread; :meth:`stop` closes every open connection.

    Args:
        bind_host: address to listen on ("127.0.0.1" for a single machine,
            "0.0.0.0" when ranks run on other hosts).
        secret: the job secret (bytes).
        handler: called with each :class:`Connection`.
        handshake_timeout: seconds a connecting peer has to authenticate.
    """

    def __init__(self, bind_host, secret, handler, handshake_timeout=30.0):
        self._sock = socket.create_server((bind_host, 0), backlog=128)
        self._sock.settimeout(_ACCEPT_POLL_S)
        self.port = self._sock.getsockname()[1]
        self._secret = secret
        self._handler = handler
        self._handshake_timeout = handshake_timeout
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._open = set()
        self._thread = threading.Thread(target=self._accept_loop, name="hvdcompat-run-accept",
                                        daemon=True)

    def start(self):
        self._thread.start()

    def stop(self):
        self._stopping.set()
        if self._thread.ident is not None:
            self._thread.join()
        self._sock.close()
        with self._lock:
            live = list(self._open)
        for conn in live:
            conn.close()

    def _accept_loop(self):
        while not self._stopping.is_set():
            try:
                sock, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                if self._stopping.is_set():
                    return
                time.sleep(_ACCEPT_POLL_S)  # e.g. EMFILE: let connections finish
                continue
            threading.Thread(target=self._serve, args=(sock,), name="hvdcompat-run-rank",
                             daemon=True).start()

    def _serve(self, sock):
        conn = Connection(sock)
        with self._lock:
            self._open.add(conn)
        try:
            sock.settimeout(self._handshake_timeout)
            _driver_handshake(conn, self._secret)
            sock.settimeout(None)
            self._handler(conn)
        except (ChannelError, OSError):
            pass
        finally:
            with self._lock:
                self._open.discard(conn)
            conn.close()


def connect(addresses, port, secret, timeout):
    """Connects to the driver at the first of ``addresses`` that answers.

    Args:
        addresses: host names or IPs of the driver, tried in order.
        port: its port.
        secret: the job secret.
        timeout: seconds to keep trying.

    Returns:
        an authenticated :class:`Connection`.

    Raises:
        ChannelError: no address answered within ``timeout``, or the driver
            failed authentication; the message lists every address tried.
    """
    deadline = time.monotonic() + timeout
    errors = {}
    while True:
        for host in addresses:
            left = deadline - time.monotonic()
            try:
                sock = socket.create_connection((host, port), timeout=max(1.0, min(10.0, left)))
            except OSError as e:
                errors[host] = str(e)
                continue
            conn = Connection(sock)
            try:
                _rank_handshake(conn, secret)
            except ChannelError:
                conn.close()
                raise
            sock.settimeout(None)
            return conn
        if time.monotonic() >= deadline:
            tried = "; ".join(f"{h}:{port}: {err}" for h, err in errors.items())
            raise ChannelError(f"could not reach the hvdcompat.run driver within {timeout:g} s "
                               f"({tried})")
        time.sleep(0.5)


def route_address(remote_host):
    """This machine's address on the route to ``remote_host``, or None.

    A UDP socket's connect only consults the routing table; nothing is sent.
    """
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((remote_host, 9))
            return s.getsockname()[0]
    except OSError:
        return None
