"""The test hosts themselves: names, links, limits, and cleanup in every way a run can end."""

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import need_test_hosts
from testhosts import HOSTS_FILE, STATE_DIR, HostCluster, leftovers, sweep_stale

HERE = os.path.dirname(os.path.abspath(__file__))


def _netns():
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def _in_host(cluster, host, *argv):
    return subprocess.run(cluster.on_host(host, list(argv)), capture_output=True, text=True,
                          timeout=30)


def _reachable(cluster, src, dst):
    """Whether host `src` can open a TCP connection to host `dst` by name."""
    server = subprocess.Popen(cluster.on_host(dst, [
        sys.executable, "-c", "import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('0.0.0.0', 47011)); "
        "s.listen(); print('up', flush=True); s.settimeout(5); s.accept()"]),
        stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline() == "up\n"
        client = _in_host(cluster, src, sys.executable, "-c",
                          "import socket, sys; socket.create_connection((sys.argv[1], 47011), "
                          "timeout=2)", cluster.names[dst])
        return client.returncode == 0
    finally:
        server.kill()
        server.wait()


def test_hosts_have_names_addresses_links_and_limits(fresh_cluster):
    c = fresh_cluster
    assert c.subnet.startswith("198.18.") or c.subnet.startswith("198.19.")
    assert _in_host(c, 0, "hostname").stdout.strip() == c.names[0]
    # The other host resolves through /etc/hosts and answers over the bridge.
    assert _reachable(c, 0, 1)
    c.limit("1gbit")
    qdisc = subprocess.run(["tc", "qdisc", "show", "dev", c.veth(1)], capture_output=True,
                           text=True).stdout
    assert "tbf" in qdisc and "rate 1Gbit" in qdisc, qdisc
    c.cut(1)
    assert not _reachable(c, 0, 1)
    c.restore(1)
    assert _reachable(c, 0, 1)


def test_two_clusters_at_once_never_collide():
    need_test_hosts()
    with HostCluster(1) as a, HostCluster(1) as b:
        assert a.prefix != b.prefix and a.subnet != b.subnet and a.names != b.names


def test_teardown_leaves_nothing_behind():
    need_test_hosts()
    before_ns, before_hosts = _netns(), open(HOSTS_FILE).read()
    c = HostCluster(2, rate="10gbit")
    assert leftovers(c.prefix)
    c.down()
    assert leftovers(c.prefix) == [] and not os.path.exists(c.tmpdir)
    assert _netns() == before_ns and open(HOSTS_FILE).read() == before_hosts
    c.down()  # idempotent


def _owner(mode):
    """A process that creates test hosts, prints its prefix, then ends by `mode`."""
    code = ("import os, signal, sys, time\n"
            f"sys.path.insert(0, {HERE!r})\n"
            "from testhosts import HostCluster\n"
            "c = HostCluster(2)\n"
            "print(c.prefix, flush=True)\n"
            "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    prefix = proc.stdout.readline().strip()
    assert prefix and leftovers(prefix), prefix
    proc.send_signal({"sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL,
                      "sighup": signal.SIGHUP}[mode])
    proc.wait(timeout=60)
    return prefix


@pytest.mark.parametrize("mode", ["sigterm", "sigkill"])
def test_a_killed_owner_leaves_nothing_behind(mode):
    need_test_hosts()
    before_ns, before_hosts = _netns(), open(HOSTS_FILE).read()
    prefix = _owner(mode)
    if mode == "sigkill":
        # Nothing could run in the owner; the next cluster's start sweeps it.
        assert leftovers(prefix)
        assert prefix in sweep_stale()
    assert leftovers(prefix) == []
    assert not os.path.exists(os.path.join(STATE_DIR, prefix + ".json"))
    assert _netns() == before_ns and open(HOSTS_FILE).read() == before_hosts


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_ctrl_c_of_a_command_run_on_the_hosts_cleans_up(sigint):
    """SIGINT stops the command and the hosts, also when started with SIGINT ignored
    (as a shell starts a background job, e.g. a test run under `cmd &`)."""
    need_test_hosts()
    before_ns, before_hosts = _netns(), open(HOSTS_FILE).read()
    disposition = signal.SIG_IGN if sigint == "ignored" else signal.SIG_DFL
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "testhosts.py"), "--hosts", "2",
                             "--", "sleep", "60"], stdout=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, disposition))
    first = proc.stdout.readline()
    assert first.startswith("testhosts: "), first
    time.sleep(0.5)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=90)
    # The command was stopped, not run to its end (60 s).
    assert code != 0 and time.monotonic() - sent < 30, (code, time.monotonic() - sent)
    assert _netns() == before_ns and open(HOSTS_FILE).read() == before_hosts


def test_without_root_the_tests_skip_saying_why(monkeypatch):
    import testhosts

    monkeypatch.setattr(testhosts.os, "geteuid", lambda: 1000)
    assert testhosts.unavailable_reason() == ("test hosts need root (network namespaces, a "
                                              "bridge, /etc/hosts); run as root")
    monkeypatch.setattr(testhosts.os, "geteuid", lambda: 0)
    monkeypatch.setattr(testhosts.shutil, "which", lambda tool: None)
    assert "need the 'ip' command" in testhosts.unavailable_reason()
