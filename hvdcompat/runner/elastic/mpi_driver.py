"""The elastic driver beside mpirun: an elastic launch on MPI, and how it grows by a restart.

An elastic launch on MPI is a fault-tolerant launch (Open MPI's ULFM) plus
the shared driver (hvdcompat/runner/elastic/driver.py) and:

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

import os
import shlex
import sys
import time

from hvdcompat.runner.elastic.discovery import cap, static_hosts
from hvdcompat.runner.elastic.driver import EXIT_ELASTIC_STOP, ElasticDriver

__all__ = ["MpiElasticDriver"]

# Files in HVDCOMPAT_ELASTIC_DIR that the ranks write (hvdcompat/elastic/loop.py;
# not imported from there, which would import torch into the launcher).
_LOST_RANKS = "lost"
_RESTART_MARK = "restart"
_RESTART_STATE = "restart.pt"
# What the driver writes for the ranks: the restart mark's time before a
# relaunch that must continue from _RESTART_STATE.
_RESTART_EXPECTED = "restart.expected"


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


class MpiElasticDriver(ElasticDriver):
    """The elastic driver of a launch through mpirun: relaunches it when hosts are added.

    :meth:`launch` runs it all. Ranks are this launch's MPI ranks; rank 0
    names the lost ones after a shrink (``lost``), and their hosts are known
    from the launch's placement by slot.
    """

    def _use(self, hosts, np=0):
        """The hosts (in order) and rank placement of the launch about to run."""
        with self._lock:
            super()._use(hosts)
            self.placement = _placement(self.args, hosts, np)
            self.lost = set()       # ranks of this launch reported lost
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
                hosts = getattr(self.args, "discovered_hosts", None) or static_hosts(self.args)
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
                self._collect_failures()
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

    def _collect_failures(self):
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
        self._blacklist({host: f"rank(s) {', '.join(map(str, ranks))}"
                         for host, ranks in failed.items()})

    def _has_live_ranks(self, host):
        live = set(self.placement.get(host, [])) - self.lost
        return bool(live) or not self.placement

    def _hosts_added(self, hosts, room):
        added = [h.name for h in hosts]
        self.announced.update(added)
        self._log(f"host(s) {', '.join(added)} added; the job restarts with them at its next "
                  "commit")
        return added

    def next_hosts(self):
        """The hosts of a relaunch: the surviving ones in launch order, then the new ones.

        Waits (every second) up to --elastic-timeout for --min-np slots.
        Returns None with :attr:`error` set when the job cannot go on.
        """
        while True:
            found = self._available()
            with self._lock:
                if found is not None:
                    self._collect_failures()
                    if not found and not self.args.host_discovery_script:
                        return []
                    usable = self._usable(found)
                    if self._check_enough(found, usable):
                        keep = [n for n in self.order if n in self.hosts]
                        by_name = {h.name: h for h in usable}
                        ordered = [by_name[n] for n in keep if n in by_name] + \
                            [h for h in usable if h.name not in keep]
                        return cap(ordered, self.args.max_np)
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
