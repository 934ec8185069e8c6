"""The elastic driver's part that both launches share: hosts, the blacklist, notices, the verdict.

An elastic launch (any flag of hvdcompat/runner/elastic/flags.py) runs a
driver beside its ranks. :class:`ElasticDriver` is what the MPI driver
(mpi_driver.py, beside mpirun) and the Gloo driver (gloo_driver.py, which
starts the workers itself) have in common:

- discovery: ``--host-discovery-script`` (or the fixed -H/--hostfile list),
  run every second (:meth:`ElasticDriver.poll`);
- notices: a host that disappears, or an added host once the launch is
  ready for it, becomes a line in ``$HVDCOMPAT_ELASTIC_DIR/notices`` that
  rank 0 reads at the next ``commit()``; every rank then raises
  HostsUpdatedInterrupt (a removed host's ranks leave);
- the blacklist: a host whose ranks failed is left out, for good or, with
  ``--blacklist-cooldown-range MIN MAX``, for a random MIN..MAX seconds,
  after which a host discovery still lists comes back as an added host;
- the stop: every host blacklisted, or fewer than ``--min-np`` usable slots
  for longer than ``--elastic-timeout``;
- the verdict: 0 when every rank of the final world finished
  ``hvd.elastic.run`` (each leaves a mark in the directory), even though
  ranks were lost on the way.

What differs is how ranks are lost (the MPI driver reads the ranks rank 0
names; the Gloo driver sees its workers end) and what an added host means
(the MPI job restarts with it; on Gloo new workers join in place): the
subclasses' :meth:`~ElasticDriver._collect_failures`,
:meth:`~ElasticDriver._has_live_ranks` and :meth:`~ElasticDriver._hosts_added`.
"""

import math
import os
import random
import shutil
import sys
import tempfile
import threading
import time

from hvdcompat.runner import hosts as _hosts
from hvdcompat.runner.elastic.discovery import discover, static_hosts
from hvdcompat.runner.elastic.flags import DEFAULT_ELASTIC_TIMEOUT

__all__ = ["ElasticDriver", "EXIT_ELASTIC_STOP"]

# The job's exit code when the driver stops it (every host blacklisted, or too
# few slots for longer than --elastic-timeout).
EXIT_ELASTIC_STOP = 1
# The driver's mark in its directory, which each rank checks it sees (a
# directory of the same name elsewhere would not have it); hvdcompat/elastic/loop.py.
_DRIVER_MARK = "driver"


class ElasticDriver:
    """What runs beside an elastic job's ranks: discovery, blacklist, notices, verdict.

    Use as a context manager; :meth:`environment` gives the ranks' knobs,
    :meth:`verdict` the exit code. Thread-safe: the discovery thread and the
    launch's thread share it under one lock.

    Args:
        args: the parsed flags.
        hosts: the hosts the job starts on, or [] for this machine alone.
        out: where the driver logs (stderr).
        clock: seconds, monotonic (tests pass their own).
        cooldown: ``cooldown(low, high)`` draws a blacklist cooldown.
    """

    def __init__(self, args, hosts=(), out=sys.stderr, clock=time.monotonic,
                 cooldown=random.uniform):
        self.args = args
        self.out = out
        self._clock = clock
        self._cooldown = cooldown
        self._lock = threading.RLock()
        self._use(list(hosts))
        self.blacklist = {}  # host -> clock() when it is eligible again (inf: never)
        self.error = None    # why the driver stops the job
        self._short_since = None
        self._paused = False
        # Rank 0 reads the notices: on a cluster, point HVDCOMPAT_ELASTIC_DIR
        # at a directory that rank 0's host shares with this one.
        from hvdcompat._ext import _core

        base = _core.setting("ELASTIC_DIR") or None
        self.dir = tempfile.mkdtemp(prefix="hvdcompat-elastic-", dir=base)
        with open(os.path.join(self.dir, _DRIVER_MARK), "w") as f:
            f.write(f"{os.getpid()}\n")
        self._stop = threading.Event()
        self._thread = None

    def _use(self, hosts):
        """The hosts (in order) the job's ranks run on now."""
        with self._lock:
            self.hosts = {h.name: h.slots for h in hosts}
            self.order = [h.name for h in hosts]
            self.announced = set()  # hosts announced as added

    def environment(self):
        """The knobs every rank of the job gets."""
        env = {"HOROVOD_ELASTIC": "1", "HVDCOMPAT_ELASTIC_DIR": self.dir}
        if self.args.min_np is not None:
            env["HVDCOMPAT_ELASTIC_MIN_NP"] = str(self.args.min_np)
        if self.args.reset_limit is not None:
            env["HVDCOMPAT_ELASTIC_RESET_LIMIT"] = str(self.args.reset_limit)
        return env

    def __enter__(self):
        return self

    def start(self):
        """Starts the discovery loop (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="host-discovery",
                                            daemon=True)
            self._thread.start()

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)
        return False

    def notice(self, removed, added):
        """Records a host change for rank 0 (appends one notices line)."""
        from hvdcompat.elastic.common import HostUpdateResult

        result = ((HostUpdateResult.removed if removed else 0)
                  | (HostUpdateResult.added if added else 0))
        line = f"{time.time():.6f} {int(result)} {','.join(sorted(removed)) or '-'}\n"
        with open(os.path.join(self.dir, "notices"), "a") as f:
            f.write(line)

    def _log(self, text):
        print(f"hvdcompatrun: {text}", file=self.out, flush=True)

    def _available(self):
        """The hosts discovery lists now (or the fixed -H/--hostfile list); None on a failure."""
        if not self.args.host_discovery_script:
            return static_hosts(self.args)
        try:
            return discover(self.args.host_discovery_script, self.args.slots_per_host)
        except _hosts.HostListError as e:
            self._log(f"{e}; keeping the current hosts")
            return None

    def _watch(self):
        while not self._stop.wait(1.0):
            found = self._available()
            if found is not None:
                with self._lock:
                    if not self._paused:
                        self.poll(found)

    def _blacklist(self, failed):
        """Blacklists the hosts of `failed` ({host: what failed there, e.g. "rank(s) 2"})."""
        for host, what in sorted(failed.items()):
            if host in self.blacklist:
                continue
            line = f"host {host} is blacklisted: its {what} failed"
            if self.args.blacklist_cooldown_range:
                wait = self._cooldown(*self.args.blacklist_cooldown_range)
                self.blacklist[host] = self._clock() + wait
                self._log(f"{line}; it may rejoin in {wait:.1f} s (--blacklist-cooldown-range)")
            else:
                self.blacklist[host] = math.inf
                self._log(f"{line}; for the rest of the job (--blacklist-cooldown-range MIN MAX "
                          "lets it rejoin)")

    def _usable(self, found):
        """Discovery's hosts less the blacklisted ones (cooldowns that ended are lifted)."""
        now = self._clock()
        for host, until in sorted(self.blacklist.items()):
            if until <= now:
                del self.blacklist[host]
                self._log(f"host {host}'s blacklist cooldown is over; it rejoins the job if "
                          "discovery lists it")
        return [h for h in found if h.name not in self.blacklist]

    def _describe_blacklist(self):
        return ", ".join(f"{h} ({'for good' if u == math.inf else 'cooling down'})"
                         for h, u in sorted(self.blacklist.items())) or "none"

    def _check_enough(self, found, usable):
        """Sets :attr:`error` when every host is blacklisted or --min-np is short too long.

        Returns whether enough slots are usable now.
        """
        if found and not usable and all(until == math.inf for until in self.blacklist.values()):
            self.error = (
                f"every host is blacklisted ({self._describe_blacklist()}); the job stops. "
                "Repair or replace the hosts and start it again, or pass "
                "--blacklist-cooldown-range MIN MAX so failed hosts rejoin after a cooldown.")
            return False
        need = self.args.min_np or 1
        slots = _hosts.total_slots(usable)
        if slots >= need:
            self._short_since = None
            return True
        timeout = (DEFAULT_ELASTIC_TIMEOUT if self.args.elastic_timeout is None
                   else self.args.elastic_timeout)
        now = self._clock()
        if self._short_since is None:
            self._short_since = now
            self._log(f"only {slots} usable slot(s), fewer than --min-np {need}; waiting up to "
                      f"--elastic-timeout {timeout} s for more hosts")
        elif now - self._short_since >= timeout:
            listed = ", ".join(f"{h.name}:{h.slots}" for h in found) or "no hosts"
            self.error = (
                f"only {slots} usable slot(s) (discovery lists {listed}; blacklisted: "
                f"{self._describe_blacklist()}), fewer than --min-np {need}, for "
                f"--elastic-timeout {timeout} s; the job stops. Add hosts, or lower --min-np.")
        return False

    def poll(self, found):
        """One look at the hosts: blacklist, then announce removals and additions to rank 0.

        Args:
            found: the hosts discovery lists (hosts.Host list).
        """
        with self._lock:
            self._collect_failures()
            if not found and not self.args.host_discovery_script:
                return  # this machine alone: no host list to change
            usable = self._usable(found)
            if not self._check_enough(found, usable):
                return  # no change is announced while the job is short of slots
            names = {h.name for h in usable}
            leaving = []
            for name in [n for n in self.order if n in self.hosts and n not in names]:
                del self.hosts[name]
                if self._has_live_ranks(name):
                    leaving.append(name)
                if name not in self.blacklist:
                    self._log(f"host {name} was removed by discovery; its ranks leave the job "
                              "at the next commit")
            room = (self.args.max_np or math.inf) - sum(self.hosts.values())
            added = [h for h in usable if h.name not in self.hosts and h.name not in self.announced]
            added = self._hosts_added(added, room) if added and room > 0 else []
            if leaving or added:
                self.notice(leaving, added)

    # What the subclasses define (under the lock, from poll).

    def _collect_failures(self):
        """Blacklists (:meth:`_blacklist`) the hosts of ranks lost since the last look."""

    def _has_live_ranks(self, host):
        """Whether ranks of the job may still run on `host`, which discovery removed."""
        return True

    def _hosts_added(self, hosts, room):
        """Takes usable hosts not in the job (hosts.Host list), `room` slots below --max-np.

        Returns the names to announce to rank 0 as added now.
        """
        raise NotImplementedError

    def finished_ranks(self):
        """{rank: world size} of the ranks that finished hvd.elastic.run."""
        done = {}
        for name in os.listdir(self.dir):
            if name.startswith("finished."):
                with open(os.path.join(self.dir, name)) as f:
                    done[int(name.split(".", 1)[1])] = int(f.read().strip() or 0)
        return done

    def verdict(self, launch_code, started=None):
        """The launch's exit code: 0 when the final world finished, else the launch's own.

        Args:
            launch_code: mpirun's exit code, or the first failed worker's (a
                lost rank's code, or 0).
            started: ranks launched, for the summary line.
        """
        done = self.finished_ranks()
        sizes = set(done.values())
        finished = len(sizes) == 1 and len(done) == sizes.pop()
        if finished:
            from hvdcompat.runner.exit_report import final_world_exit

            code, ranks = final_world_exit(self.dir)
            if code:  # the final world's own exit code (sys.exit(N) or an exception)
                print(f"hvdcompatrun: training finished on {len(done)} rank(s); they exited "
                      f"with {code} (world ranks {ranks})", file=self.out, flush=True)
                return code
        if finished and (launch_code != 0 or (started and len(done) != started)):
            print(f"hvdcompatrun: training finished on {len(done)}"
                  + (f" of {started}" if started and len(done) < started else "") + " rank(s)"
                  + (f"; the launch's exit code {launch_code} is from the ranks lost on the way"
                     if launch_code else ""), file=self.out, flush=True)
            return 0
        return launch_code
