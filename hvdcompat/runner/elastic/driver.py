"""hvdcompatrun's elastic flags (Horovod's meaning) and the driver that runs beside mpirun.

An elastic launch is a fault-tolerant launch (Open MPI's ULFM) plus:

- ``--min-np`` / ``--reset-limit``: passed to the ranks (knobs
  ``HVDCOMPAT_ELASTIC_MIN_NP`` / ``_RESET_LIMIT``); ``hvd.elastic.run`` fails
  with a clear error when fewer ranks survive a reset, or after that many
  resets (a restart on new hosts counts as one).
- ``--host-discovery-script`` (or the fixed -H/--hostfile list): run before
  the launch (its ``host[:slots]`` lines are the hosts; slots default to
  ``--slots-per-host``), waiting up to ``--elastic-timeout`` seconds for
  ``--min-np`` slots; then every second. Changes reach rank 0 as lines in
  ``$HVDCOMPAT_ELASTIC_DIR/notices``; at the next ``commit()`` every rank
  raises HostsUpdatedInterrupt. Removed hosts' ranks leave and the others
  shrink the job in place; added hosts join by a restart: rank 0 writes the
  last commit, every rank exits with ``RESTART_EXIT_CODE`` and the driver
  starts mpirun again on the surviving hosts (first, so rank 0 stays where
  the file is) plus the new ones (Note [Growing by restart] in
  hvdcompat/elastic/loop.py).
- blacklisting: after a shrink rank 0 names the lost ranks (``lost``); the
  driver blacklists their hosts (ranks still running there leave at the
  next commit), for good or, with ``--blacklist-cooldown-range MIN MAX``,
  for a random MIN..MAX seconds, after which a host discovery still lists
  rejoins as an added host.
- the job stops with an error when every host is blacklisted, or when
  fewer than ``--min-np`` slots are usable for longer than
  ``--elastic-timeout``.
- the exit code: 0 when every rank of the final world finished
  ``hvd.elastic.run`` (each leaves a mark in the directory), even though
  mpirun reports the lost ranks' codes.
"""

import math
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from hvdcompat.runner import hosts as _hosts

__all__ = ["add_elastic_arguments", "elastic_requested", "check_elastic_args", "discover",
           "wait_for_hosts", "ElasticDriver"]

DEFAULT_ELASTIC_TIMEOUT = 600
# The job's exit code when the driver stops it (every host blacklisted, or too
# few slots for longer than --elastic-timeout).
EXIT_ELASTIC_STOP = 1
# Files in HVDCOMPAT_ELASTIC_DIR that the ranks write (hvdcompat/elastic/loop.py;
# not imported from there, which would import torch into the launcher).
_LOST_RANKS = "lost"
_RESTART_MARK = "restart"
_RESTART_STATE = "restart.pt"
# Files the driver writes for the ranks: its mark, which each rank checks it
# sees (a directory of the same name elsewhere would not have it), and the
# restart mark's time before a relaunch that must continue from _RESTART_STATE.
_DRIVER_MARK = "driver"
_RESTART_EXPECTED = "restart.expected"


def _static_hosts(args):
    """The -H/--hostfile hosts ([] for this machine alone)."""
    if getattr(args, "hosts", None):
        return _hosts.parse_hosts_arg(args.hosts)
    if getattr(args, "hostfile", None):
        return _hosts.parse_hostfile(args.hostfile)
    return []


def _placement(args, hosts, np):
    """{host: [ranks]} of a launch over `hosts` (by slot), {} when unknown or one machine."""
    from hvdcompat.runner import exit_report

    try:
        extra = shlex.split(getattr(args, "mpi_args", "") or "")
    except ValueError:
        return {}
    if not hosts or not np or any(a.split("=", 1)[0] in exit_report.MAPPING_ARGS for a in extra):
        return {}
    return exit_report.expected_placement(hosts, np)


def _cap(hosts, max_np):
    """`hosts` cut to at most `max_np` slots in all (None: no cap)."""
    if max_np is None:
        return list(hosts)
    out, left = [], max_np
    for h in hosts:
        if left <= 0:
            break
        out.append(_hosts.Host(h.name, min(h.slots, left)))
        left -= out[-1].slots
    return out


def add_elastic_arguments(parser):
    """Adds Horovod's elastic flags to hvdcompatrun's parser."""
    g = parser.add_argument_group(
        "elastic training (hvd.elastic; implies --fault-tolerant)")
    g.add_argument("--min-np", type=int, metavar="N",
                   help="fewest ranks to start with and to continue with after a failure")
    g.add_argument("--max-np", type=int, metavar="N",
                   help="most ranks the job grows to when hosts are added")
    g.add_argument("--slots-per-host", type=int, metavar="N",
                   help="slots of a discovered host that lists none (default 1)")
    g.add_argument("--host-discovery-script", metavar="SCRIPT",
                   help="executable printing the available hosts, one 'host[:slots]' per line; "
                        "run every second: hosts that disappear leave the job at the next "
                        "commit, hosts that appear join it then (the job restarts from that "
                        "commit)")
    g.add_argument("--elastic-timeout", type=int, metavar="SECONDS",
                   help="how long to wait for --min-np slots, at the start and whenever "
                        f"fewer are usable (default {DEFAULT_ELASTIC_TIMEOUT})")
    g.add_argument("--reset-limit", type=int, metavar="N",
                   help="stop with an error after this many resets")
    g.add_argument("--blacklist-cooldown-range", type=int, nargs=2, metavar=("MIN", "MAX"),
                   help="a host whose ranks failed is blacklisted for a random MIN..MAX "
                        "seconds, then rejoins if discovery lists it (default: for good)")


def elastic_requested(args):
    """Whether any elastic flag was given."""
    return any(getattr(args, a) is not None for a in (
        "min_np", "max_np", "slots_per_host", "host_discovery_script", "elastic_timeout",
        "reset_limit", "blacklist_cooldown_range"))


def check_elastic_args(args, np):
    """Checks the elastic flags against each other and ``-np``.

    Raises:
        ValueError: naming the flag and what to change.
    """
    for name in ("min_np", "max_np", "slots_per_host", "reset_limit"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "reset_limit" else 1):
            raise ValueError(f"hvdcompatrun: --{name.replace('_', '-')} must be at least "
                             f"{0 if name == 'reset_limit' else 1}, got {value}")
    if args.elastic_timeout is not None and args.elastic_timeout < 0:
        raise ValueError(f"hvdcompatrun: --elastic-timeout must be >= 0, got "
                         f"{args.elastic_timeout}")
    if args.min_np is not None and args.max_np is not None and args.min_np > args.max_np:
        raise ValueError(f"hvdcompatrun: --min-np {args.min_np} is above --max-np {args.max_np}")
    if np is not None and args.min_np is not None and np < args.min_np:
        raise ValueError(f"hvdcompatrun: -np {np} is below --min-np {args.min_np}")
    if np is not None and args.max_np is not None and np > args.max_np:
        raise ValueError(f"hvdcompatrun: -np {np} is above --max-np {args.max_np}")
    if args.blacklist_cooldown_range is not None:
        low, high = args.blacklist_cooldown_range
        if low < 0 or high < low:
            raise ValueError("hvdcompatrun: --blacklist-cooldown-range MIN MAX needs "
                             f"0 <= MIN <= MAX, got {low} {high}")
    if args.host_discovery_script is not None and (args.hosts or args.hostfile):
        raise ValueError("hvdcompatrun: --host-discovery-script replaces -H/--hostfile; "
                         "give one of them")


def parse_discovery_output(text, slots_per_host):
    """Hosts from a discovery script's output: ``host[:slots]`` per line, blank lines skipped.

    Raises:
        HostListError: a malformed line.
    """
    pairs = []
    for i, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        name, sep, slots = line.rpartition(":")
        if not sep:
            name, slots = line, str(slots_per_host or 1)
        where = f"host discovery output line {i} ({line!r})"
        try:
            n = int(slots)
        except ValueError:
            raise _hosts.HostListError(f"{where}: slots must be a whole number") from None
        if n < 1 or not name:
            raise _hosts.HostListError(f"{where}: expected host[:slots] with slots >= 1")
        _hosts.check_host_name(name, where)
        pairs.append(_hosts.Host(name, n))
    return pairs


def discover(script, slots_per_host, timeout=30):
    """Runs the discovery script once; returns its hosts.

    Raises:
        HostListError: the script failed or printed something unreadable.
    """
    try:
        out = subprocess.run([script], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise _hosts.HostListError(f"--host-discovery-script {script!r} could not run: {e}") \
            from None
    if out.returncode != 0:
        raise _hosts.HostListError(f"--host-discovery-script {script!r} exited with "
                                   f"{out.returncode}: {out.stderr.strip()[:500]}")
    try:
        return parse_discovery_output(out.stdout, slots_per_host)
    except _hosts.HostListError as e:
        raise _hosts.HostListError(f"--host-discovery-script {script!r}: {e}") from None


def wait_for_hosts(args, clock=time.monotonic, sleep=time.sleep):
    """Hosts from discovery once they hold at least --min-np slots (polled every second).

    Raises:
        HostListError: --elastic-timeout passed first, or discovery failed.
    """
    need = args.min_np or args.num_proc or 1
    timeout = DEFAULT_ELASTIC_TIMEOUT if args.elastic_timeout is None else args.elastic_timeout
    deadline = clock() + timeout
    while True:
        found = discover(args.host_discovery_script, args.slots_per_host)
        if _hosts.total_slots(found) >= need:
            return found
        if clock() >= deadline:
            raise _hosts.HostListError(
                f"host discovery found {_hosts.total_slots(found)} slot(s) "
                f"({', '.join(f'{h.name}:{h.slots}' for h in found) or 'no hosts'}), fewer than "
                f"the {need} needed (--min-np / -np), for --elastic-timeout {timeout} s; add "
                "hosts or lower --min-np")
        sleep(1)


class ElasticDriver:
    """What runs beside mpirun in an elastic launch: notices, discovery, blacklist, relaunches.

    Use as a context manager around the launch (:meth:`launch` does it all);
    :meth:`environment` gives the ranks' knobs, :meth:`verdict` the exit code.

    Args:
        args: the parsed flags.
        hosts: the hosts the job starts on (from discovery), or [] without it.
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
        self._use(list(hosts), 0)
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

    def _use(self, hosts, np):
        """The hosts (in order) and rank placement of the launch about to run."""
        with self._lock:
            self.hosts = {h.name: h.slots for h in hosts}
            self.order = [h.name for h in hosts]
            self.placement = _placement(self.args, hosts, np)
            self.lost = set()       # ranks of this launch reported lost
            self.announced = set()  # hosts announced as added in this launch
            self._lost_offset = 0

    @classmethod
    def launch(cls, args, plan, run):
        """Plans with the driver's environment, runs, relaunches after growth; the exit code.

        Args:
            args: the parsed flags.
            plan: ``plan(extra_env, hosts=None) -> (cmd, env)``; raises LaunchError.
                `hosts` is a relaunch's host list.
            run: ``run(cmd, env, placement, np, abort=, summarize=) -> exit code``.
        """
        with cls(args) as driver:
            return driver.supervise(plan, run)

    def supervise(self, plan, run):
        """The launch loop (see :meth:`launch`); returns the exit code."""
        from hvdcompat.runner.errors import EXIT_USAGE, LaunchError

        hosts = None  # the first launch plans from the flags
        while True:
            try:
                cmd, env = (plan(self.environment()) if hosts is None
                            else plan(self.environment(), hosts))
            except LaunchError as e:
                print(e, file=sys.stderr)
                return EXIT_USAGE
            if hosts is None:
                hosts = getattr(self.args, "discovered_hosts", None) or _static_hosts(self.args)
            np = getattr(self.args, "planned_np", None) or 0
            with self._lock:
                self._use(hosts, np)
                self._paused = False
            self.start()
            if self.args.verbose:
                print("hvdcompatrun: " + " ".join(cmd), flush=True)
            code = run(cmd, env, None, 0, abort=lambda: self.error is not None,
                       summarize=lambda: self.error is None and not self.restart_requested())
            with self._lock:
                self._paused = True
                self._read_lost()
            if self.error:
                self._log(self.error)
                return EXIT_ELASTIC_STOP
            if not self.restart_requested():
                return self.verdict(code, started=np)
            saved = self._saved_state()
            if saved is None:
                return EXIT_ELASTIC_STOP
            started = time.monotonic()
            hosts = self.next_hosts()
            if hosts is None:
                self._log(self.error or "stopped while waiting for hosts")
                return EXIT_ELASTIC_STOP
            self._clear_for_relaunch()
            with open(os.path.join(self.dir, _RESTART_EXPECTED), "w") as f:
                f.write(saved + "\n")
            self._log(f"restarting the job from its last commit on "
                      f"{', '.join(f'{h.name}:{h.slots}' for h in hosts)} "
                      f"(hosts chosen in {time.monotonic() - started:.1f} s)")

    def environment(self):
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
            return _static_hosts(self.args)
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

    def _read_lost(self):
        """Blacklists the hosts of the ranks rank 0 reported lost since the last read."""
        path = os.path.join(self.dir, _LOST_RANKS)
        try:
            with open(path, "rb") as f:
                f.seek(self._lost_offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        self._lost_offset += end
        where = {r: h for h, ranks in self.placement.items() for r in ranks}
        failed = {}
        for line in data[:end].decode().splitlines():
            fields = line.split()
            if len(fields) < 2:
                continue
            for r in fields[1].split(","):
                self.lost.add(int(r))
                host = where.get(int(r))
                if host is not None and host in self.hosts:
                    failed.setdefault(host, []).append(int(r))
        for host, ranks in sorted(failed.items()):
            if host in self.blacklist:
                continue
            what = f"host {host} is blacklisted: its rank(s) {', '.join(map(str, ranks))} failed"
            if self.args.blacklist_cooldown_range:
                wait = self._cooldown(*self.args.blacklist_cooldown_range)
                self.blacklist[host] = self._clock() + wait
                self._log(f"{what}; it may rejoin in {wait:.1f} s (--blacklist-cooldown-range)")
            else:
                self.blacklist[host] = math.inf
                self._log(f"{what}; for the rest of the job (--blacklist-cooldown-range MIN MAX "
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
            self._read_lost()
            if not found and not self.args.host_discovery_script:
                return  # this machine alone: no host list to change
            usable = self._usable(found)
            if not self._check_enough(found, usable):
                return  # no change is announced while the job is short of slots
            names = {h.name for h in usable}
            leaving = []
            for name in [n for n in self.order if n in self.hosts and n not in names]:
                del self.hosts[name]
                live = set(self.placement.get(name, [])) - self.lost
                if live or not self.placement:
                    leaving.append(name)
                if name not in self.blacklist:
                    self._log(f"host {name} was removed by discovery; its ranks leave the job "
                              "at the next commit")
            room = (self.args.max_np or math.inf) - sum(self.hosts.values())
            added = [h.name for h in usable
                     if h.name not in self.hosts and h.name not in self.announced]
            if added and room > 0:
                self.announced.update(added)
                self._log(f"host(s) {', '.join(added)} added; the job restarts with them at "
                          "its next commit")
            else:
                added = []
            if leaving or added:
                self.notice(leaving, added)

    def next_hosts(self):
        """The hosts of a relaunch: the surviving ones in launch order, then the new ones.

        Waits (every second) up to --elastic-timeout for --min-np slots.
        Returns None with :attr:`error` set when the job cannot go on.
        """
        while True:
            found = self._available()
            with self._lock:
                if found is not None:
                    self._read_lost()
                    if not found and not self.args.host_discovery_script:
                        return []
                    usable = self._usable(found)
                    if self._check_enough(found, usable):
                        keep = [n for n in self.order if n in self.hosts]
                        by_name = {h.name: h for h in usable}
                        ordered = [by_name[n] for n in keep if n in by_name] + \
                            [h for h in usable if h.name not in keep]
                        return _cap(ordered, self.args.max_np)
                if self.error:
                    return None
            if self._stop.wait(1.0):
                return None

    def restart_requested(self):
        """Whether rank 0 asked for a relaunch (hosts were added) and left its state."""
        return os.path.exists(os.path.join(self.dir, _RESTART_MARK))

    def _saved_state(self):
        """The restart mark's time when rank 0's saved state is there; else None, logged.

        A relaunch continues from that state; without it the job would train
        again from the initial state with the reset count at 0.
        """
        path = os.path.join(self.dir, _RESTART_STATE)
        with open(os.path.join(self.dir, _RESTART_MARK)) as f:
            saved = f.read().strip()
        if os.path.isfile(path):
            return saved
        self._log(f"rank 0 asked for a restart on new hosts (its mark of {saved}), but its "
                  f"saved state {path} is not there; the job stops rather than start again "
                  "from the initial state. Start it again from your own checkpoint, with "
                  "HVDCOMPAT_ELASTIC_DIR on storage every host shares with this machine.")
        return None

    def _clear_for_relaunch(self):
        for name in os.listdir(self.dir):
            if name in ("notices", _LOST_RANKS, _RESTART_MARK) or name.startswith("finished."):
                os.remove(os.path.join(self.dir, name))

    def finished_ranks(self):
        """{rank: world size} of the ranks that finished hvd.elastic.run."""
        done = {}
        for name in os.listdir(self.dir):
            if name.startswith("finished."):
                with open(os.path.join(self.dir, name)) as f:
                    done[int(name.split(".", 1)[1])] = int(f.read().strip() or 0)
        return done

    def verdict(self, mpirun_code, started=None):
        """The launch's exit code: 0 when the final world finished, else mpirun's.

        Args:
            mpirun_code: mpirun's exit code (a lost rank's code, or 0).
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
        if finished and (mpirun_code != 0 or (started and len(done) < started)):
            print(f"hvdcompatrun: training finished on {len(done)}"
                  + (f" of {started}" if started else "") + " rank(s)"
                  + (f"; the launch's exit code {mpirun_code} is from the ranks lost on the way"
                     if mpirun_code else ""), file=self.out, flush=True)
            return 0
        return mpirun_code
