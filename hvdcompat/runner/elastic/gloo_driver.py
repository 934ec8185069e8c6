"""The elastic driver of ``hvdcompatrun --gloo``: its workers, and hosts joining in place.

On the Gloo controller hvdcompatrun starts every worker itself, so the driver
(the shared part is hvdcompat/runner/elastic/driver.py) sees them end and
starts new ones:

- a worker that ends with a failure (not stopped by the launcher) gets its
  host blacklisted when the job has a host list (discovery or -H); the
  survivors have reset in place already (Note [Elastic reset on Gloo] in
  cpp/engine/gloo_reset.h);
- a host that discovery adds (or whose cooldown ended) gets workers, up to
  ``--max-np``, started with ``HVDCOMPAT_ELASTIC_JOIN`` set: their
  ``hvd.init()`` waits in the store to be taken into the running job (Note
  [Growing in place on Gloo]). Once every one of them waits, rank 0 is told
  that hosts were added; at the next ``commit()`` every rank raises
  HostsUpdatedInterrupt and resets, and the reset takes them in after the
  running workers, which keep their processes, memory and relative order;
  ``hvd.elastic.run`` then syncs the state from rank 0 to everyone;
- a host that discovery removes: its running workers leave at the next
  commit (as on MPI), its workers still waiting to join are stopped; no
  host gets new workers while workers of its own are still running there;
- a running worker that reached a reset after the others had decided the
  new world without it waits in the store as a new worker does (step 4 of
  Note [Elastic reset on Gloo]): rank 0 is told at once, and the next
  commit takes it back in;
- when no worker of the job is left, workers still waiting are stopped.
"""

import threading
import time

from hvdcompat.runner import hosts as _hosts
from hvdcompat.runner.elastic.driver import EXIT_ELASTIC_STOP, ElasticDriver

__all__ = ["GlooElasticDriver", "EXIT_ELASTIC_STOP"]

# How often the launch's thread looks at the store and the workers (seconds).
_LOOK_SECONDS = 0.5
# Once the final world finished, how long workers still running (on a host that
# dropped off the network, an ssh may not end for minutes) have to end.
_AFTER_FINISH_SECONDS = 10


class GlooElasticDriver(ElasticDriver):
    """The elastic driver of a Gloo launch: :meth:`run` waits for the workers it started.

    Workers are numbered in the order they were started: the ``-np`` first
    are the ranks at the start, a worker started later gets the next number
    (its name in the store and in messages).
    """

    def __init__(self, args, **kwargs):
        super().__init__(args, **kwargs)
        self._pool = self._starter = self._store = None
        self._first = self._next_number = 0
        self._joining = {}      # name -> Worker: started to join, not yet taken into the world
        self._unannounced = {}  # host -> (start time, [Worker]) not yet announced to rank 0
        self._registered = {}   # name -> "grow/<i>" index of the workers waiting in the store
        self._withdraw = []     # waiting workers to mark gone in the store, then stop
        self._seen = 0          # "grow/<i>" entries read
        self._taken = 0         # of them, taken into the world
        self._next_look = 0.0
        self._stopping = False
        self._finished_at = None

    def may_add_hosts(self, hosts):
        """Whether workers may run on other hosts than this one (the store must be reachable)."""
        return bool(self.args.host_discovery_script) or not _hosts.all_local(hosts)

    def worker_environment(self, host):
        """What a worker on `host` gets besides the launch's variables."""
        # Its host as discovery names it: a removal notice names it so.
        return {"HVDCOMPAT_ELASTIC_HOST": host}

    def run(self, pool, starter, specs, store, hosts=()):
        """Waits for the workers, growing and shrinking the job; returns the first failure's code.

        Args:
            pool: the WorkerPool the first workers were started in.
            starter: gloo_run.WorkerStarter, to start more.
            specs: the first workers' RankSpecs.
            store: a client of the launch's store under the first hvd.init()'s prefix.
            hosts: the hosts the launch was planned on (discovery's or -H's; a host
                listed then is in the job, as on MPI, whether -np put workers there or not).
        """
        counts = {}
        for spec in specs:
            counts[spec.host] = counts.get(spec.host, 0) + 1
        with self._lock:
            self._pool, self._starter, self._store = pool, starter, store
            self._first = self._next_number = len(specs)
            self._use(list(hosts) or [_hosts.Host(h, n) for h, n in counts.items()])
        self.start()
        try:
            return pool.wait(tick=self._tick, stop_on_failure=False)
        finally:
            self._stop.set()
            if self._thread:
                self._thread.join(timeout=5)
            if self.error:
                self._log(self.error)

    def verdict(self, launch_code, started=None):
        return EXIT_ELASTIC_STOP if self.error else super().verdict(launch_code, started)

    def failure_line(self, code):
        """The line naming the first worker that failed, for a job that did not finish."""
        failed = [w for w in self._pool.workers if w.code and not w.stopped]
        if self.error or not failed:
            return None  # the driver stopped the job and said why
        w = min(failed, key=lambda w: w.ended or 0)
        joined = " (started to join the running job)" if w.number >= self._first else ""
        return (f"hvdcompatrun: worker {w.number} on host {w.host}{joined} ended with exit code "
                f"{w.code}, the first worker of the job to fail; its own output above says why "
                f"(job exit code {code})")

    # The shared driver's hooks (under the lock, from poll on the discovery thread).

    def _has_host_list(self):
        return bool(self.args.host_discovery_script or self.args.hosts or self.args.hostfile)

    def _collect_failures(self):
        failed = {}
        for w in self._pool.workers:
            code = w.code
            if code is None or w.reported:
                continue
            w.reported = True
            self._joining.pop(str(w.number), None)
            if code != 0 and not w.stopped:
                failed.setdefault(w.host, []).append(w.number)
        if failed and self._has_host_list():
            self._blacklist({host: f"worker(s) {', '.join(map(str, numbers))}"
                             for host, numbers in failed.items() if host in self.hosts})

    def _has_live_ranks(self, host):
        waiting = [w for w in self._joining.values() if w.host == host]
        if waiting:
            self._log(f"stopping the {len(waiting)} worker(s) on host {host} that waited to "
                      "join the job")
            self._withdraw += waiting  # (the store is the launch thread's: _tick)
        self._unannounced.pop(host, None)
        return any(w.host == host and not w.joining for w in self._pool.running())

    def _hosts_added(self, hosts, room):
        for host in hosts:
            if room <= 0:
                break
            if any(w.host == host.name for w in self._pool.running()):
                continue  # its workers are still leaving: it gets new ones after them
            n = min(host.slots, room)
            started = self._start_on(host.name, n)
            if not started:
                continue
            room -= len(started)
            self.hosts[host.name] = len(started)
            self.order.append(host.name)
            self._unannounced[host.name] = (time.monotonic(), started)
            self._log(f"host {host.name} added: started {len(started)} worker(s) there "
                      f"({', '.join(str(w.number) for w in started)}); they join the job at "
                      "its next commit once they are ready")
        return []  # announced once they wait to join (_tick)

    def _start_on(self, host, n):
        from hvdcompat.runner.gloo_run import RankSpec

        started = []
        for _ in range(n):
            number = self._next_number
            self._next_number += 1
            spec = RankSpec(rank=number, host=host, local_rank=-1, local_size=-1,
                            cross_rank=-1, cross_size=-1, local=_hosts.is_local_host(host))
            env = {**self.worker_environment(host), "HVDCOMPAT_ELASTIC_JOIN": str(number)}
            try:
                worker = self._starter.start(self._pool, spec, 0, extra_env=env, joining=True,
                                             without=_PLACE)
            except OSError as e:
                self._log(f"cannot start a worker on host {host}: {e}")
                break
            self._joining[str(number)] = worker
            started.append(worker)
        return started

    def _stop_soon(self, workers):
        """Stops `workers` in the background (their ends are no failures from now on)."""
        for w in workers:
            self._joining.pop(str(w.number), None)
            w.stopped = True
        threading.Thread(target=self._pool.stop, args=(list(workers),), daemon=True).start()

    # The launch's thread (WorkerPool.wait's tick).

    def _tick(self):
        now = time.monotonic()
        if now < self._next_look:
            return
        self._next_look = now + _LOOK_SECONDS
        with self._lock:
            if self.error:
                if not self._stopping:
                    self._stopping = True
                    self._stop_soon(self._pool.running())
                return
            self._read_store()
            self._withdraw_waiting()
            self._announce_ready()
            running = self._pool.running()
            if running and all(w.joining for w in running):
                self._log(f"no worker of the job is left; stopping the {len(running)} "
                          "worker(s) that waited to join it")
                self._stop_soon(running)
            elif running and self._final_world_finished(now):
                self._log(f"the final world finished {_AFTER_FINISH_SECONDS} s ago; stopping "
                          f"the {len(running)} worker(s) still running (on host(s) "
                          f"{', '.join(sorted({w.host for w in running}))})")
                self._stop_soon(running)

    def _final_world_finished(self, now):
        """Whether every rank of the final world finished _AFTER_FINISH_SECONDS ago."""
        if self._finished_at is None:
            done = self.finished_ranks()
            sizes = set(done.values())
            if len(sizes) == 1 and len(done) == sizes.pop():
                self._finished_at = now
            return False
        return now - self._finished_at > _AFTER_FINISH_SECONDS

    def _read_store(self):
        """Which started workers wait in the store, and which the job took in."""
        count = self._store.add("grow/count", 0)
        while self._seen < count:
            name = self._entry(self._seen)
            if name is None:
                break  # counted, not yet written: next look
            self._registered[name] = self._seen
            self._seen += 1
            self._take_back(name)
        taken = self._store.add("grow/taken", 0)
        while self._taken < min(taken, self._seen):
            name = self._entry(self._taken)
            worker = self._joining.pop(name, None)
            if worker is not None:
                worker.joining = False
            self._taken += 1

    def _take_back(self, name):
        """A running worker of the job that waits in the store came late to a reset: rank 0
        is told, so that the next commit takes it back in."""
        late = [w for w in self._pool.running() if str(w.number) == name and not w.joining]
        if not late:
            return  # a worker started to join (or one that ended meanwhile)
        worker = late[0]
        worker.joining = True
        self._joining[name] = worker
        self.notice([], [worker.host])
        self._log(f"worker {name} on host {worker.host} reached an elastic reset after the "
                  "others had agreed on the new world without it; the job takes it back in "
                  "at its next commit")

    def _withdraw_waiting(self):
        """Stops the workers of removed hosts that wait to join; a reset must not take them."""
        if not self._withdraw:
            return
        for w in self._withdraw:
            index = self._registered.get(str(w.number))
            if index is not None:
                self._store.add(f"grow/{index}/gone", 1)  # Note [Growing in place on Gloo]
        self._stop_soon(self._withdraw)
        self._withdraw = []

    def _entry(self, index):
        from hvdcompat.store import StoreError

        try:
            self._store.wait([f"grow/{index}"], 0.05)
            return self._store.get(f"grow/{index}").decode().split()[0]
        except StoreError:
            return None

    def _announce_ready(self):
        for host, (since, workers) in list(self._unannounced.items()):
            if any(w.proc.poll() is None and str(w.number) not in self._registered
                   for w in workers):
                continue
            del self._unannounced[host]
            ready = [w for w in workers if w.proc.poll() is None]
            if ready and host in self.hosts:
                self.notice([], [host])
                self._log(f"host {host}: {len(ready)} new worker(s) ready after "
                          f"{time.monotonic() - since:.1f} s; the job takes them in at its "
                          "next commit")


# Horovod's per-rank variables, which a worker that joins gets from the job instead.
_PLACE = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
          "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE")
