"""hvdcompat.run's channel: every frame authenticated, and a listener peers cannot exhaust.

A party that does not know the job secret but sits on the path (it can write
into the TCP stream, or replay what it saw) must get nothing unpickled on
either side; peers that never authenticate must not use up the driver's
threads, nor end its accept loop.
"""

import pickle
import socket
import struct
import threading
import time

import pytest

from hvdcompat.runner.common import channel as run_channel
from hvdcompat.runner.common.channel import AuthenticationError, ChannelError

_LENGTH = struct.Struct("!Q")


class _Planted:
    """Unpickling this runs code: it records that it ran."""

    ran = []

    def __reduce__(self):
        return (_Planted.ran.append, ("unpickled",))


class _Driver:
    """A listener on loopback whose handler receives objects until the connection ends."""

    def __init__(self, reply=None, **kw):
        self.secret = run_channel.new_secret()
        self.received, self.errors = [], []
        self.done = threading.Event()
        self._reply = reply
        self.listener = run_channel.Listener("127.0.0.1", self.secret, self._handle, **kw)
        self.listener.start()

    def _handle(self, conn):
        try:
            if self._reply is not None:
                conn.send(self._reply)
            while True:
                self.received.append(conn.recv())
        except ChannelError as e:
            self.errors.append(e)
        finally:
            self.done.set()

    def connect(self):
        return run_channel.connect(["127.0.0.1"], self.listener.port, self.secret, 10)


@pytest.fixture
def driver():
    made = []

    def make(**kw):
        made.append(_Driver(**kw))
        return made[-1]

    yield make
    for d in made:
        d.listener.stop()


class _Recorder:
    """Stands in for a connection's socket: keeps the bytes a send would put on the wire."""

    def __init__(self):
        self.data = b""

    def sendall(self, data):
        self.data += bytes(data)


def _wire_bytes(conn, obj):
    """What ``conn.send(obj)`` writes, without writing it (the sequence number advances)."""
    real, conn._sock = conn._sock, _Recorder()
    try:
        conn.send(obj)
        return conn._sock.data
    finally:
        conn._sock = real


def _raw_frame(conn):
    """Reads one frame's bytes off the wire, as an observer would, for the rank."""
    (length,) = _LENGTH.unpack(conn._recv_exact(_LENGTH.size))
    conn._received += 1
    return _LENGTH.pack(length) + bytes(conn._recv_exact(length))


def _refused(d, needle="authentication tag does not match"):
    assert d.done.wait(10), "the driver never ended the connection"
    assert len(d.errors) == 1 and isinstance(d.errors[0], AuthenticationError), d.errors
    assert needle in str(d.errors[0]) and "nothing in it was unpickled" in str(d.errors[0])


def test_frames_travel_both_ways_after_the_handshake(driver):
    d = driver(reply={"payload": [1, 2]})
    conn = d.connect()
    assert conn.recv() == {"payload": [1, 2]}
    for i in range(3):
        conn.send({"kind": "hello", "i": i})
    conn.close()
    assert d.done.wait(10)
    assert d.received == [{"kind": "hello", "i": i} for i in range(3)]


def test_an_injected_unsigned_pickle_is_refused_and_never_unpickled(driver):
    _Planted.ran.clear()
    d = driver()
    conn = d.connect()
    conn.send("first")
    data = pickle.dumps(_Planted())
    conn._sock.sendall(_LENGTH.pack(len(data)) + data)  # what the old wire format carried
    _refused(d)
    assert d.received == ["first"] and _Planted.ran == []


@pytest.mark.parametrize("attack", ["replay", "reorder", "modify", "truncate",
                                    "from another connection", "reflected"])
def test_a_replayed_reordered_modified_or_foreign_frame_is_refused(driver, attack):
    _Planted.ran.clear()
    d = driver(reply="to the rank")
    conn = d.connect()
    from_driver = _raw_frame(conn)  # the driver's frame as the wire carried it
    first = _wire_bytes(conn, "one")
    if attack == "replay":
        conn._sock.sendall(first + first)
    elif attack == "reorder":
        second = _wire_bytes(conn, "two")
        conn._sock.sendall(second + first)
    elif attack == "modify":
        tampered = bytearray(first)
        tampered[_LENGTH.size + 5] ^= 0x01
        conn._sock.sendall(bytes(tampered))
    elif attack == "truncate":
        conn._sock.sendall(_LENGTH.pack(4) + b"abcd")
    elif attack == "from another connection":
        other = d.connect()
        assert other.recv() == "to the rank"
        conn._sock.sendall(_wire_bytes(other, "one"))  # same secret, same position, other keys
        other.close()
    else:  # the driver's own frame, sent back to it
        conn._sock.sendall(from_driver)
    needle = "has no tag" if attack == "truncate" else "authentication tag does not match"
    if attack == "from another connection":  # two connections end: `other` and `conn`
        deadline = time.monotonic() + 10
        while len(d.errors) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [needle in str(e) for e in d.errors].count(True) == 1, d.errors
        assert d.received == []
    else:
        _refused(d, needle)
        assert d.received == (["one"] if attack == "replay" else [])
    assert _Planted.ran == []


def test_a_driver_frame_modified_on_the_way_is_refused_by_the_rank():
    left, right = socket.socketpair()
    rank, drv = run_channel.Connection(left), run_channel.Connection(right)
    secret = run_channel.new_secret()
    t = threading.Thread(target=run_channel._driver_handshake, args=(drv, secret))
    t.start()
    run_channel._rank_handshake(rank, secret)
    t.join()
    _Planted.ran.clear()
    frame = bytearray(_wire_bytes(drv, _Planted()))
    frame[-1] ^= 0x80
    right.sendall(bytes(frame))
    with pytest.raises(AuthenticationError, match="authentication tag does not match"):
        rank.recv()
    assert _Planted.ran == []
    with pytest.raises(AuthenticationError, match="before the handshake"):
        run_channel.Connection(socket.socket()).recv()
    rank.close()
    drv.close()


def _hvdcompat_threads():
    return sum(1 for t in threading.enumerate() if t.name == "hvdcompat-run-rank")


def test_silent_peers_cannot_use_up_the_listener_and_a_rank_still_gets_in(driver):
    d = driver(reply="welcome", max_pending=8)
    before = _hvdcompat_threads()
    idle = [socket.create_connection(("127.0.0.1", d.listener.port)) for _ in range(40)]
    # At most max_pending of them hold a thread; the others were ended (their threads leave
    # at once; a loaded machine may take a moment to run them).
    deadline = time.monotonic() + 10
    while _hvdcompat_threads() - before > 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert d.listener.pending() <= 8
    assert _hvdcompat_threads() - before <= 8
    ended = 0
    for s in idle:
        s.settimeout(5)
        try:
            s.recv(64)  # the challenge
            s.settimeout(0.05)
            ended += s.recv(64) == b""
        except (socket.timeout, ConnectionResetError):
            pass
    assert ended >= 40 - 8 - 1
    conn = d.connect()
    assert conn.recv() == "welcome"
    conn.close()
    for s in idle:
        s.close()


def test_a_handshake_has_one_deadline_however_slowly_the_peer_trickles(driver):
    d = driver(handshake_timeout=1.0)
    s = socket.create_connection(("127.0.0.1", d.listener.port))
    s.recv(8 + 32)
    start = time.monotonic()
    dropped_after = None
    for _ in range(8):  # one byte of the 8-byte length every 0.4 s: 3.2 s in all
        time.sleep(0.4)
        try:
            s.sendall(b"\0")
        except OSError:
            dropped_after = time.monotonic() - start
            break
        s.settimeout(0.01)
        try:
            if s.recv(1) == b"":
                dropped_after = time.monotonic() - start
                break
        except socket.timeout:
            pass
        except OSError:
            dropped_after = time.monotonic() - start
            break
    s.close()
    assert dropped_after is not None, "the trickling peer kept its handshake open past 3 s"
    assert d.listener.pending() == 0


def test_a_thread_that_cannot_start_drops_one_connection_not_the_listener(driver, monkeypatch):
    d = driver(reply="still here")
    real = threading.Thread.start
    failures = []

    def start(self):
        if self.name == "hvdcompat-run-rank" and not failures:
            failures.append(self)
            raise RuntimeError("can't start new thread")
        return real(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    first = socket.create_connection(("127.0.0.1", d.listener.port))
    first.settimeout(5)
    assert first.recv(64) == b""  # dropped at once
    first.close()
    conn = d.connect()
    assert failures and conn.recv() == "still here"
    conn.close()


def test_the_driver_listens_only_on_the_addresses_it_gives_the_ranks():
    from hvdcompat.runner import run_func
    from hvdcompat.runner.hosts import Host

    assert run_func._driver_addresses([Host("localhost", 2)]) == ["127.0.0.1"]
    remote = run_func._driver_addresses([Host("198.18.0.7", 2), Host("localhost", 1)])
    assert remote == [run_channel.route_address("198.18.0.7")] and "0.0.0.0" not in remote
    assert run_func._driver_addresses([Host("198.18.0.7", 1)], "lo") == ["127.0.0.1"]
    assert run_func._driver_addresses([Host("198.18.0.7", 1)], "127.0.0.0/8") == ["127.0.0.1"]
    with pytest.raises(ValueError, match="no IPv4 address of this machine is on that interface"):
        run_func._driver_addresses([Host("198.18.0.7", 1)], "nonexistent0")
    with pytest.raises(ValueError, match=r"no route from this machine to host\(s\) "
                                         r"\['no-such-host.invalid'\].*network_interface="):
        run_func._driver_addresses([Host("no-such-host.invalid", 1)])
    listener = run_channel.Listener(remote + ["127.0.0.1"], run_channel.new_secret(),
                                    lambda conn: None)
    try:
        bound = sorted(s.getsockname() for s in listener._socks)
        assert bound == sorted([(remote[0], listener.port), ("127.0.0.1", listener.port)])
    finally:
        listener.stop()


def test_a_forged_huge_length_allocates_only_what_arrives(driver):
    d = driver()
    conn = d.connect()
    conn._sock.sendall(_LENGTH.pack(1 << 40) + b"x" * 100)  # a terabyte announced, 100 bytes sent
    conn.close()
    assert d.done.wait(10)
    assert len(d.errors) == 1 and "the peer closed the connection" in str(d.errors[0]), d.errors
