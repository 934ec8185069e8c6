"""hvdcompatrun's elastic flags (Horovod's meaning) and the driver that runs beside mpirun.

An elastic launch is a fault-tolerant launch (Open MPI's ULFM) plus:

- ``--min-np`` / ``--reset-limit``: passed to the ranks (knobs
  ``HVDCOMPAT_ELASTIC_MIN_NP`` / ``_RESET_LIMIT``); ``hvd.elastic.run`` fails
  with a clear error when fewer ranks survive a reset, or after that many
  resets.
- ``--host-discovery-script``: run before the launch (its ``host[:slots]``
  lines are the hosts; slots default to ``--slots-per-host``), waiting up to
  ``--elastic-timeout`` seconds for ``--min-np`` slots; then every second.
  A host that disappears is announced to rank 0 (a line in
  ``$HVDCOMPAT_ELASTIC_DIR/notices``); at the next ``commit()`` every rank
  raises HostsUpdatedInterrupt and the ranks on that host leave the job.
  Hosts that appear are logged, not used (joining a running job is not
  implemented).
- the exit code: 0 when every rank of the final world finished
  ``hvd.elastic.run`` (each leaves a mark in the directory), even though
  mpirun reports the lost ranks' codes.
"""

import os
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


def add_elastic_arguments(parser):
    """Adds Horovod's elastic flags to hvdcompatrun's parser."""
    g = parser.add_argument_group(
        "elastic training (hvd.elastic; implies --fault-tolerant)")
    g.add_argument("--min-np", type=int, metavar="N",
                   help="fewest ranks to start with and to continue with after a failure")
    g.add_argument("--max-np", type=int, metavar="N",
                   help="most ranks to start (the job never grows beyond its start)")
    g.add_argument("--slots-per-host", type=int, metavar="N",
                   help="slots of a discovered host that lists none (default 1)")
    g.add_argument("--host-discovery-script", metavar="SCRIPT",
                   help="executable printing the available hosts, one 'host[:slots]' per line; "
                        "run every second, hosts that disappear leave the job at the next commit")
    g.add_argument("--elastic-timeout", type=int, metavar="SECONDS",
                   help="how long to wait for --min-np slots at the start (default "
                        f"{DEFAULT_ELASTIC_TIMEOUT})")
    g.add_argument("--reset-limit", type=int, metavar="N",
                   help="stop with an error after this many resets")
    g.add_argument("--blacklist-cooldown-range", type=int, nargs=2, metavar=("MIN", "MAX"),
                   help="accepted for Horovod compatibility; blacklisting has no effect yet, "
                        "since hosts cannot join a running job")


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
    return parse_discovery_output(out.stdout, slots_per_host)


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
    """What runs beside mpirun in an elastic launch: the notices directory and discovery loop.

    Use as a context manager around the launch; :meth:`environment` gives
    the ranks' knobs, :meth:`verdict` the exit code.

    Args:
        args: the parsed flags.
        hosts: the hosts the job starts on (from discovery), or [] without it.
        out: where the driver logs (stderr).
    """

    def __init__(self, args, hosts=(), out=sys.stderr):
        self.args = args
        self.hosts = {h.name: h.slots for h in hosts}
        self.out = out
        # Rank 0 reads the notices: on a cluster, point HVDCOMPAT_ELASTIC_DIR
        # at a directory that rank 0's host shares with this one.
        base = os.environ.get("HVDCOMPAT_ELASTIC_DIR") or None
        self.dir = tempfile.mkdtemp(prefix="hvdcompat-elastic-", dir=base)
        self._stop = threading.Event()
        self._thread = None

    @classmethod
    def launch(cls, args, plan, run):
        """Plans with the driver's environment, runs, and returns the exit code.

        Args:
            args: the parsed flags.
            plan: ``plan(extra_env) -> (cmd, env)``; raises LaunchError.
            run: ``run(cmd, env) -> exit code``.
        """
        from hvdcompat.runner.errors import EXIT_USAGE, LaunchError

        with cls(args) as driver:
            try:
                cmd, env = plan(driver.environment())
            except LaunchError as e:
                print(e, file=sys.stderr)
                return EXIT_USAGE
            driver.hosts = {h.name: h.slots for h in getattr(args, "discovered_hosts", [])}
            driver.start()
            if args.verbose:
                print("hvdcompatrun: " + " ".join(cmd), flush=True)
            return driver.verdict(run(cmd, env), started=getattr(args, "planned_np", None))

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
        """Starts the discovery loop (with --host-discovery-script)."""
        if self.args.host_discovery_script:
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

    def _watch(self):
        while not self._stop.wait(1.0):
            try:
                found = {h.name: h.slots for h in discover(self.args.host_discovery_script,
                                                           self.args.slots_per_host)}
            except _hosts.HostListError as e:
                print(f"hvdcompatrun: {e}; keeping the current hosts", file=self.out, flush=True)
                continue
            removed = sorted(set(self.hosts) - set(found))
            added = sorted(set(found) - set(self.hosts))
            if added:
                print(f"hvdcompatrun: host(s) {', '.join(added)} appeared; adding hosts to a "
                      "running job is not implemented, they are not used", file=self.out,
                      flush=True)
            if removed:
                print(f"hvdcompatrun: host(s) {', '.join(removed)} removed by discovery; their "
                      "ranks leave the job at the next commit", file=self.out, flush=True)
                self.notice(removed, [])
                for name in removed:
                    del self.hosts[name]

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
        if finished and (mpirun_code != 0 or (started and len(done) < started)):
            print(f"hvdcompatrun: training finished on {len(done)}"
                  + (f" of {started}" if started else "") + " rank(s)"
                  + (f"; mpirun's exit code {mpirun_code} is from the ranks lost on the way"
                     if mpirun_code else ""), file=self.out, flush=True)
            return 0
        return mpirun_code
