"""The authenticated channel between :func:`hvdcompat.run` and its ranks.

Note [Run channel]: ``hvdcompat.run`` sends each rank the pickled function
and receives its return value or its traceback. MPI cannot carry this (the
driver is not an MPI process), so the driver listens on a TCP port and every
rank connects to it. The port is reachable by anyone who can reach the
machine, and what travels is pickles (which run code when loaded), so:

- both sides prove they hold a per-job secret before anything is unpickled:
  the driver challenges the rank and the rank challenges the driver
  (HMAC-SHA256 over fresh nonces; frames before that are at most 64 bytes and
  never unpickled). The secret reaches the ranks in their environment, never
  on a command line (which ``ps`` shows to every user of a node);
- every frame after the handshake carries an HMAC-SHA256 tag under a session
  key derived from the secret and both nonces, over the frame's direction,
  its sequence number in that direction and its bytes. A frame injected,
  modified, replayed (within the connection or from another one), reordered
  or reflected back to its sender fails the check, and the connection is
  dropped before the frame is unpickled;
- the listener binds only the addresses the ranks are told to call back on
  (loopback for a single machine), and it cannot be exhausted by peers that
  never authenticate: at most :data:`MAX_PENDING` handshakes are open at a
  time (a new connection then ends the oldest), each has one deadline for
  the whole handshake, and a thread that cannot be started drops only its
  own connection.

Wire format: every frame is an 8-byte big-endian length and that many bytes;
after the handshake the bytes are the payload (one pickled Python object, or
the function's cloudpickle) followed by its 32-byte tag.
"""

import hashlib
import hmac
import pickle
import secrets
import socket
import struct
import threading
import time

__all__ = ["SECRET_ENV", "MAX_PENDING", "ChannelError", "AuthenticationError", "Connection",
           "Listener", "connect", "new_secret", "route_address", "interface_addresses"]

# The job secret, hex, in the ranks' environment; set by hvdcompat.run for its
# own ranks only (not a knob).
SECRET_ENV = "HVDCOMPAT_RUN_SECRET"

_LENGTH = struct.Struct("!Q")
_NONCE_BYTES = 32
_HANDSHAKE_FRAME_LIMIT = 64
_ACCEPT_POLL_S = 0.2
_TAG_BYTES = 32
_RECV_CHUNK = 1 << 20
_SEQUENCE = struct.Struct("!Q")
# The direction of a frame, in its tag: a frame cannot be reflected to its sender.
_TO_RANK, _TO_DRIVER = b"driver->rank", b"rank->driver"
# Handshakes open at once on one listener; a connection beyond it ends the oldest.
MAX_PENDING = 64


class ChannelError(ConnectionError):
    """The peer went away, or failed to authenticate."""


class AuthenticationError(ChannelError):
    """The peer does not hold the job secret, or a frame failed its check."""


def new_secret():
    """A fresh random job secret (bytes)."""
    return secrets.token_bytes(32)


def _digest(secret, label, nonce):
    return hmac.new(secret, label + nonce, hashlib.sha256).digest()


class Connection:
    """One socket carrying length-prefixed frames, authenticated after the handshake.

    Not thread-safe: one thread sends and receives on a connection; another
    thread may only :meth:`shutdown` it (which wakes a blocked receive); the
    owning thread closes it (closing from elsewhere would free the descriptor
    while the owner may still be reading it, and a new connection reusing the
    number would have its bytes read by the wrong thread).
    """

    def __init__(self, sock):
        self._sock = sock
        self._key = None       # the session key, once the handshake has succeeded
        self._sent = 0         # frames sent since then
        self._received = 0     # frames received since then
        self._deadline = None  # time.monotonic() by which the handshake must be done

    def _start_session(self, secret, driver_nonce, rank_nonce, role):
        self._key = hmac.new(secret, b"session" + driver_nonce + rank_nonce,
                             hashlib.sha256).digest()
        self._outgoing, self._incoming = ((_TO_RANK, _TO_DRIVER) if role == "driver"
                                          else (_TO_DRIVER, _TO_RANK))
        self._deadline = None
        self._sock.settimeout(None)

    def _tag(self, direction, sequence, data):
        mac = hmac.new(self._key, direction, hashlib.sha256)
        mac.update(_SEQUENCE.pack(sequence))
        mac.update(_LENGTH.pack(len(data)))
        mac.update(data)
        return mac.digest()

    def send_bytes(self, data):
        """Sends one frame; raises ChannelError when the peer has gone."""
        tag = b""
        if self._key is not None:
            tag = self._tag(self._outgoing, self._sent, data)
            self._sent += 1
        try:
            self._sock.sendall(_LENGTH.pack(len(data) + len(tag)))
            self._sock.sendall(data)
            if tag:
                self._sock.sendall(tag)
        except OSError as e:
            raise ChannelError(f"sending to the peer failed: {e}") from None

    def recv_bytes(self, limit=None):
        """Receives one frame (at most ``limit`` bytes when given).

        After the handshake, raises AuthenticationError for a frame whose tag
        does not match: the connection must then be closed.
        """
        (length,) = _LENGTH.unpack(self._recv_exact(_LENGTH.size))
        if limit is not None and length > limit:
            raise ChannelError(f"the peer sent a {length}-byte frame where at most {limit} "
                               "were expected (not an hvdcompat.run peer?)")
        if self._key is None:
            return bytes(self._recv_exact(length))
        if length < _TAG_BYTES:
            raise AuthenticationError(self._forged(f"a {length}-byte frame has no tag"))
        frame = self._recv_exact(length)
        data, tag = bytes(frame[:-_TAG_BYTES]), bytes(frame[-_TAG_BYTES:])
        if not hmac.compare_digest(tag, self._tag(self._incoming, self._received, data)):
            raise AuthenticationError(self._forged("its authentication tag does not match"))
        self._received += 1
        return data

    def _forged(self, why):
        return (f"frame {self._received} from the peer was refused: {why} (it was modified, "
                "injected, replayed or reordered on the way, or does not come from this job's "
                "peer); nothing in it was unpickled and the connection is dropped")

    def send(self, obj):
        """Sends one picklable object."""
        self.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))

    def recv(self):
        """Receives one object; only after the handshake (it unpickles an authenticated frame)."""
        if self._key is None:
            raise AuthenticationError("refusing to unpickle a frame before the handshake")
        return pickle.loads(self.recv_bytes())

    def shutdown(self):
        """Ends the connection; a receive blocked in another thread returns an error."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self):
        """Ends the connection and frees the socket (only from the thread that uses it)."""
        self.shutdown()
        self._sock.close()

    def _recv_exact(self, n):
        # The buffer grows with what arrives (a length field alone, e.g. one
        # forged on the way, cannot make this process allocate its size).
        buf = bytearray(min(n, _RECV_CHUNK))
        view = memoryview(buf)
        got = 0
        while got < n:
            if got == len(buf):
                view.release()
                buf.extend(bytes(min(n - got, len(buf))))
                view = memoryview(buf)
            if self._deadline is not None:
                left = self._deadline - time.monotonic()
                if left <= 0:
                    raise ChannelError("the peer did not complete the handshake in time")
                self._sock.settimeout(left)
            try:
                k = self._sock.recv_into(view[got:])
            except socket.timeout:
                raise ChannelError("the peer did not complete the handshake in time") from None
            except OSError as e:
                raise ChannelError(f"receiving from the peer failed: {e}") from None
            if k == 0:
                raise ChannelError("the peer closed the connection")
            got += k
        return buf


def _driver_handshake(conn, secret, admit=lambda conn: True):
    nonce = secrets.token_bytes(_NONCE_BYTES)
    conn.send_bytes(nonce)
    reply = conn.recv_bytes(_HANDSHAKE_FRAME_LIMIT)
    if len(reply) != 2 * _NONCE_BYTES or not hmac.compare_digest(
            reply[:_NONCE_BYTES], _digest(secret, b"rank", nonce)):
        raise AuthenticationError("a connection to hvdcompat.run's port failed authentication")
    if not admit(conn):  # it was ended to make room; the rank retries
        raise ChannelError("the connection was ended during its handshake")
    conn.send_bytes(_digest(secret, b"driver", reply[_NONCE_BYTES:]))
    conn._start_session(secret, nonce, reply[_NONCE_BYTES:], "driver")


def _rank_handshake(conn, secret):
    nonce = conn.recv_bytes(_HANDSHAKE_FRAME_LIMIT)
    if len(nonce) != _NONCE_BYTES:
        raise AuthenticationError(f"the driver sent a {len(nonce)}-byte challenge, not "
                                  f"{_NONCE_BYTES} (not an hvdcompat.run driver?)")
    mine = secrets.token_bytes(_NONCE_BYTES)
    conn.send_bytes(_digest(secret, b"rank", nonce) + mine)
    proof = conn.recv_bytes(_HANDSHAKE_FRAME_LIMIT)
    if not hmac.compare_digest(proof, _digest(secret, b"driver", mine)):
        raise AuthenticationError("the driver failed authentication (wrong job secret)")
    conn._start_session(secret, nonce, mine, "rank")


class Listener:
    """Accepts ranks on a TCP port and serves each in its own thread.

    ``handler(conn)`` runs once per authenticated connection, in a daemon
    thread of its own, and must not raise. Connections that fail the
    handshake are dropped silently. :meth:`start` and :meth:`stop` are called
    from the driver's thread; :meth:`stop` closes every open connection.

    Args:
        bind_hosts: the addresses to listen on, one port for all of them
            ("127.0.0.1" for a single machine; this machine's addresses on
            the routes to the ranks' hosts otherwise); a string for one.
        secret: the job secret (bytes).
        handler: called with each :class:`Connection`.
        handshake_timeout: seconds a connecting peer has for the whole
            handshake.
        max_pending: handshakes open at once; a connection beyond them ends
            the oldest.
    """

    def __init__(self, bind_hosts, secret, handler, handshake_timeout=30.0,
                 max_pending=MAX_PENDING):
        if isinstance(bind_hosts, str):
            bind_hosts = [bind_hosts]
        self._socks = []
        try:
            for host in bind_hosts:
                port = self._socks[0].getsockname()[1] if self._socks else 0
                sock = socket.create_server((host, port), backlog=128)
                sock.settimeout(_ACCEPT_POLL_S)
                self._socks.append(sock)
        except OSError as e:
            for sock in self._socks:
                sock.close()
            raise OSError(e.errno, f"hvdcompat.run cannot listen on {host!r}: {e.strerror}; "
                          "pass network_interface= naming an interface of this machine that "
                          "the ranks' hosts can reach") from None
        self.addresses = list(bind_hosts)
        self.port = self._socks[0].getsockname()[1]
        self._secret = secret
        self._handler = handler
        self._handshake_timeout = handshake_timeout
        self._max_pending = max_pending
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._open = set()
        self._pending = {}  # Connection -> time.monotonic() it was accepted, oldest first
        self._threads = [threading.Thread(target=self._accept_loop, args=(sock,),
                                          name="hvdcompat-run-accept", daemon=True)
                         for sock in self._socks]

    def start(self):
        for thread in self._threads:
            thread.start()

    def stop(self):
        self._stopping.set()
        for thread in self._threads:
            if thread.ident is not None:
                thread.join()
        for sock in self._socks:
            sock.close()
        with self._lock:
            live = list(self._open)
        for conn in live:
            conn.shutdown()  # each connection's own thread then closes it

    def pending(self):
        """How many connections are in their handshake now."""
        with self._lock:
            return len(self._pending)

    def _accept_loop(self, listening):
        while not self._stopping.is_set():
            try:
                sock, _ = listening.accept()
            except socket.timeout:
                continue
            except OSError:
                if self._stopping.is_set():
                    return
                time.sleep(_ACCEPT_POLL_S)  # e.g. EMFILE: let connections finish
                continue
            conn = Connection(sock)
            conn._deadline = time.monotonic() + self._handshake_timeout
            with self._lock:
                evicted = []
                while len(self._pending) >= self._max_pending:
                    oldest = next(iter(self._pending))
                    del self._pending[oldest]
                    evicted.append(oldest)
                self._pending[conn] = time.monotonic()
                self._open.add(conn)
            for old in evicted:
                old.shutdown()  # its thread's receive fails; it closes the socket
            try:
                threading.Thread(target=self._serve, args=(conn,), name="hvdcompat-run-rank",
                                 daemon=True).start()
            except RuntimeError:  # no thread to be had now: drop this one, keep accepting
                self._finish(conn)
                time.sleep(_ACCEPT_POLL_S)

    def _finish(self, conn):
        with self._lock:
            self._open.discard(conn)
            self._pending.pop(conn, None)
        conn.close()

    def _serve(self, conn):
        try:
            _driver_handshake(conn, self._secret, self._admit)
            self._handler(conn)
        except (ChannelError, OSError):
            pass
        finally:
            self._finish(conn)

    def _admit(self, conn):
        """Moves an authenticated connection out of the pending ones (False: it was evicted)."""
        with self._lock:
            return self._pending.pop(conn, None) is not None


def connect(addresses, port, secret, timeout):
    """Connects to the driver at the first of ``addresses`` that answers.

    A connection the driver drops before its challenge (its listener is
    busy with other handshakes) is retried until ``timeout``.

    Args:
        addresses: host names or IPs of the driver, tried in order.
        port: its port.
        secret: the job secret.
        timeout: seconds to keep trying.

    Returns:
        an authenticated :class:`Connection`.

    Raises:
        ChannelError: no address answered within ``timeout`` (the message
            lists every address tried); AuthenticationError when the driver
            failed authentication.
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
            conn._deadline = time.monotonic() + max(1.0, min(30.0, left))
            try:
                _rank_handshake(conn, secret)
            except AuthenticationError:
                conn.close()
                raise
            except ChannelError as e:
                conn.close()
                errors[host] = str(e)
                continue
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


def _ipv4_of(name):
    """The IPv4 address of the network interface ``name`` (Linux), or None."""
    import fcntl

    siocgifaddr = 0x8915
    request = struct.pack("256s", name.encode()[:15])
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            answer = fcntl.ioctl(s.fileno(), siocgifaddr, request)
    except OSError:
        return None
    return socket.inet_ntoa(answer[20:24])


def interface_addresses(specs):
    """This machine's IPv4 addresses on ``specs``: interface names or CIDR subnets."""
    import ipaddress

    found = []
    for spec in (s.strip() for s in specs):
        if not spec:
            continue
        if "/" in spec:
            network = ipaddress.ip_network(spec, strict=False)
            candidates = [_ipv4_of(name) for _, name in socket.if_nameindex()]
            candidates = [a for a in candidates
                          if a and ipaddress.ip_address(a) in network]
        else:
            candidates = [_ipv4_of(spec)]
        found += [a for a in candidates if a and a not in found]
    return found
