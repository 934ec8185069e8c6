"""hvdcompat.store: the rendezvous store client and server the Gloo controller meets through."""

import datetime
import socket
import time

import pytest
from torch.distributed import TCPStore

from hvdcompat.store import StoreError, TCPStoreClient, key_prefix, serve


@pytest.fixture(scope="module")
def server():
    store, port = serve("127.0.0.1", 0, timeout_s=5)
    yield store, port


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_set_get_add_wait_round_trip_under_the_prefix(server):
    raw, port = server
    a = TCPStoreClient("127.0.0.1", port, prefix=key_prefix(0, 0), timeout_s=5)
    b = TCPStoreClient("127.0.0.1", port, prefix=key_prefix(0, 0), timeout_s=5)
    a.set("rank/1", b"\x00\x01addr")
    assert b.get("rank/1") == b"\x00\x01addr"
    assert a.add("count", 2) == 2 and b.add("count", 3) == 5
    b.wait(["rank/1", "count"], 1)
    # The keys sit under the prefix in the shared store, as torch sees it.
    assert raw.get("hvdcompat/0/0/rank/1") == b"\x00\x01addr"
    assert not raw.check(["rank/1"])
    assert a.address == f"127.0.0.1:{port}"


def test_other_prefixes_and_torch_keys_do_not_mix(server):
    raw, port = server
    first = TCPStoreClient("127.0.0.1", port, prefix=key_prefix(1, 0), timeout_s=5)
    again = TCPStoreClient("127.0.0.1", port, prefix=key_prefix(1, 1), timeout_s=5)
    raw.set("k", b"torch's own")
    first.set("k", b"first init")
    again.set("k", b"second init")
    assert (raw.get("k"), first.get("k"), again.get("k")) == (
        b"torch's own", b"first init", b"second init")
    assert first.add("n", 1) == 1 and again.add("n", 1) == 1


def test_get_of_a_key_nobody_sets_fails_within_the_timeout(server):
    _, port = server
    client = TCPStoreClient("127.0.0.1", port, prefix="hvdcompat/test-get/", timeout_s=1)
    started = time.monotonic()
    with pytest.raises(StoreError, match=rf"127\.0\.0\.1:{port}.*get\('never'\) timed out "
                                         r"after 1 s.*--gloo-timeout-seconds"):
        client.get("never")
    assert time.monotonic() - started < 10
    with pytest.raises(StoreError, match=r"wait\(\['never'\]\) timed out after 0.5 s"):
        client.wait(["never"], 0.5)


def test_a_closed_port_is_an_error_naming_the_address_within_the_timeout():
    port = _closed_port()
    started = time.monotonic()
    with pytest.raises(StoreError, match=rf"rendezvous store 127\.0\.0\.1:{port} "
                                         r"\(MASTER_ADDR:MASTER_PORT\) could not be reached "
                                         r"within 2 s"):
        TCPStoreClient("127.0.0.1", port, timeout_s=2, source="MASTER_ADDR:MASTER_PORT")
    elapsed = time.monotonic() - started
    assert 1.5 < elapsed < 4, elapsed


def test_a_listener_that_never_answers_is_an_error_not_a_hang():
    # The kernel completes the connection; nothing ever speaks TCPStore's protocol.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(StoreError, match=rf"127\.0\.0\.1:{port}.*did not answer as a "
                                             r"TCPStore"):
            TCPStoreClient("127.0.0.1", port, timeout_s=2)
        assert time.monotonic() - started < 8


def test_an_unknown_host_name_fails_at_once():
    started = time.monotonic()
    with pytest.raises(StoreError, match=r"no-such-host\.invalid:29500 \(HOROVOD_GLOO_"
                                         r"RENDEZVOUS_ADDR\).*cannot be resolved"):
        TCPStoreClient("no-such-host.invalid", 29500, timeout_s=30,
                       source="HOROVOD_GLOO_RENDEZVOUS_ADDR")
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("kwargs, needle", [
    ({"port": "x"}, "port 'x' is not a number"),
    ({"port": 70000}, "not in 1..65535"),
    ({"port": 29500, "timeout_s": 0}, "timeout must be positive"),
])
def test_bad_arguments_are_value_errors(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        TCPStoreClient("127.0.0.1", **kwargs)


def test_serve_on_a_busy_port_says_so():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        with pytest.raises(StoreError, match=rf"cannot listen on 127\.0\.0\.1:{port}"):
            serve("127.0.0.1", port, timeout_s=1)


def test_a_store_that_ends_later_fails_the_call_with_the_address():
    store, port = serve("127.0.0.1", 0, timeout_s=2)
    client = TCPStoreClient("127.0.0.1", port, timeout_s=2)
    client.set("x", b"1")
    del store
    with pytest.raises(StoreError, match=rf"127\.0\.0\.1:{port}"):
        for _ in range(3):
            client.get("x")
            client.set("y", b"2")
            time.sleep(0.2)


def test_timedelta_timeout_reaches_torch():
    store, port = serve("127.0.0.1", 0, timeout_s=3)
    client = TCPStoreClient("127.0.0.1", port, timeout_s=3)
    assert client._store.timeout == datetime.timedelta(seconds=3)
    assert isinstance(store, TCPStore)
