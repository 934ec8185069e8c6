"""Which of the launching environment every rank receives.

Ranks on this machine inherit the launcher's environment anyway; a rank on
another host starts from that host's login environment (ssh gives a clean
one) plus what the launcher forwards. So hvdcompatrun forwards the launching
environment, as horovodrun does, except what describes this host or this
login session and would be wrong elsewhere (Note [Environment left out]).

Note [Environment left out]:
- the host and the shell: ``HOSTNAME``, ``HOST``, ``PWD``/``OLDPWD`` (MPI
  starts each rank in the launch directory and sets its own), ``SHLVL``,
  ``_``, ``PS1``..., shell functions (``BASH_FUNC_*``);
- the login: ``HOME``, ``USER``, ``LOGNAME``, ``SHELL``, ``MAIL`` (the remote
  login sets them for that host), ``SSH_*`` (this connection's agent socket and
  addresses), ``KRB5CCNAME``;
- the desktop and terminal: ``DISPLAY``, ``XAUTHORITY``, ``WAYLAND_DISPLAY``,
  ``XDG_*`` session paths, ``DBUS_SESSION_BUS_ADDRESS``, ``TERM``,
  ``COLORTERM``, ``TMUX*``, ``STY``, ``COLUMNS``/``LINES`` (rank output goes
  through pipes, not this terminal);
- the MPI launcher's own variables (``OMPI_*`` but ``OMPI_MCA_*``, ``PMIX_*``,
  ``PRTE_*``, ``PMI_*``, ``HYDRA_*``): the launcher sets them per rank, and a
  forwarded copy would overwrite the rank's own. ``OMPI_MCA_*`` settings are
  forwarded: they tune the ranks' MPI as they tune mpirun's;
- a batch system's per-task and per-node variables (``SLURM_PROCID``,
  ``SLURM_LOCALID``, ``SLURM_NODEID``, ``SLURMD_NODENAME``, ...): launched
  from a batch script they describe the script's own task, and libraries that
  read them (Lightning, submitit) would give every rank its rank.

Everything else travels, among it ``PATH``, ``PYTHONPATH``,
``LD_LIBRARY_PATH``, ``VIRTUAL_ENV``, ``OMP_NUM_THREADS``,
``CUDA_VISIBLE_DEVICES``, ``HOROVOD_*``/``HVDCOMPAT_*``/``NCCL_*`` and a
user's own variables. ``-x NAME=VALUE`` in ``--mpi-args`` still sets one
explicitly.
"""

import re

__all__ = ["LEFT_OUT_NAMES", "LEFT_OUT_PATTERNS", "is_forwarded", "forwarded_names"]

LEFT_OUT_NAMES = frozenset({
    "HOSTNAME", "HOST", "PWD", "OLDPWD", "SHLVL", "_", "PS1", "PS2", "PS3", "PS4",
    "PROMPT_COMMAND", "HISTFILE", "HISTSIZE", "HISTFILESIZE", "HISTCONTROL",
    "HOME", "USER", "LOGNAME", "SHELL", "MAIL", "KRB5CCNAME",
    "DISPLAY", "XAUTHORITY", "WAYLAND_DISPLAY", "DBUS_SESSION_BUS_ADDRESS", "TERM",
    "COLORTERM", "STY", "WINDOW", "COLUMNS", "LINES", "LS_COLORS",
})

LEFT_OUT_PATTERNS = (
    r"BASH_FUNC_.*", r"SSH_.*", r"XDG_.*", r"TMUX.*",
    r"OMPI_(?!MCA_).*", r"PMIX_.*", r"PRTE_.*", r"PMI_.*", r"HYDRA_.*",
    r"SLURM_(PROCID|LOCALID|NODEID|TASK_PID|GTIDS|CPUS_ON_NODE|TOPOLOGY_ADDR.*|STEP_.*)",
    r"SLURMD_NODENAME",
)
_LEFT_OUT = re.compile("|".join(f"(?:{p})" for p in LEFT_OUT_PATTERNS))
# Names mpirun can pass with -x (a shell-style identifier).
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_forwarded(name):
    """Whether the variable `name` reaches every rank (see Note [Environment left out])."""
    return (bool(_NAME.match(name)) and name not in LEFT_OUT_NAMES
            and not _LEFT_OUT.fullmatch(name))


def forwarded_names(env):
    """Names of the variables of `env` that every rank receives, sorted."""
    return sorted(k for k in env if is_forwarded(k))
