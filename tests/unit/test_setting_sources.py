"""Every setting is read through the core's knob table (cpp/core/env.cc): the package and
the core are scanned for environment reads (os.environ / os.getenv / a mapping called
environ or env in Python, getenv in C++). A knob may only be read by the table's one reader
(KnobRaw in C++, ``_core.setting`` in Python); any other variable read must be listed below
with why it is not a knob. Nothing is imported but ``_core``, for the table itself."""

import ast
import pathlib
import re

from hvdcompat._ext import _core

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = REPO / "hvdcompat"
CPP = REPO / "cpp"

_TORCH = "torch.distributed's env:// and torchrun's variables, set by torch's launchers"
_MPI = "the MPI launcher's own variables for a rank's place (hvdcompat/runner/mpi_world.py)"
_GLOO = ("launcher-to-rank plumbing of hvdcompatrun --gloo (Horovod's spellings, as "
         "horovodrun --gloo sets them for each rank)")
_SECRET = "a launch's secret, handed to the ranks' side and removed from the environment"
_PROCESS = "the process's own variables (executables, imports, output buffering)"

# Variables that are not knobs, by name.
NOT_KNOBS = {
    "PATH": _PROCESS, "PYTHONPATH": _PROCESS, "PYTHONUNBUFFERED": _PROCESS,
    "OMPI_MCA_mpi_yield_when_idle": "Open MPI's own setting: hvdcompat only sets a default",
    "MPIR_CVAR_CH4_PROGRESS_THROTTLE": "MPICH's own setting: hvdcompat only sets a default",
    "NCCL_SOCKET_IFNAME": "NCCL's own setting, forwarded to the ranks",
    "GLOO_SOCKET_IFNAME": "torch's gloo backend's own setting, also the Gloo controller's "
                          "interface when HOROVOD_GLOO_IFACE is unset",
    "PMIX_NAMESPACE": _MPI,
    "MASTER_ADDR": _TORCH, "MASTER_PORT": _TORCH, "TORCHELASTIC_RESTART_COUNT": _TORCH,
    "TORCHELASTIC_USE_AGENT_STORE": _TORCH,
    "HOROVOD_GLOO_RENDEZVOUS_ADDR": _GLOO, "HOROVOD_GLOO_IFACE": _GLOO,
    "HOROVOD_HOSTNAME": _GLOO, "HOROVOD_RANK": _GLOO,
    "HVDCOMPAT_REPORT_TOKEN": _SECRET, "HVDCOMPAT_RUN_SECRET": _SECRET,
}

# Reads whose variable is computed (a loop over a list of names), by module and function.
COMPUTED = {
    ("hvdcompat/ddp/bootstrap.py", "bootstrap_env"): _TORCH,
    ("hvdcompat/ddp/bootstrap.py", "_missing"): _TORCH,
    ("hvdcompat/gloo_init.py", "_launch_has_store"): _TORCH,
    ("hvdcompat/rendezvous.py", "launched_by_torch"): _TORCH,
    ("hvdcompat/rendezvous.py", "_env_like_torch"): _TORCH,
    ("hvdcompat/rendezvous.py", "_int"): _GLOO + "; " + _TORCH,
    ("hvdcompat/runner/gloo_run.py", "rank_environment"): "the variables forwarded to the ranks",
    ("hvdcompat/runner/mpi_world.py", "launched_by_mpi"): _MPI,
    ("hvdcompat/runner/mpi_world.py", "read"): _MPI,
    ("hvdcompat/runner/mpi_session.py", "session_base"):
        "where Open MPI's launcher keeps its session directory (prte_tmpdir_base, TMPDIR, TEMP, TMP)",
    ("hvdcompat/runner/rank_supervisor.py", "_place_environment"): _MPI,
}

# Knobs read outside the table's reader, by module: the rank supervisor runs as a script,
# without the package (importing it would import torch in every supervisor); the elastic
# driver sets these for it.
KNOBS_OUTSIDE = {
    ("hvdcompat/runner/rank_supervisor.py", "HVDCOMPAT_ELASTIC_DIR"),
    ("hvdcompat/runner/rank_supervisor.py", "HVDCOMPAT_ELASTIC_HOST"),
    ("hvdcompat/runner/rank_supervisor.py", "HOROVOD_ELASTIC"),
    # Not a read: taken out of a rank's environment (the launch decided the controller).
    ("hvdcompat/runner/gloo_run.py", "HVDCOMPAT_CONTROLLER"),
}

# C++ reads outside core/env.cc: (file, variable) -> why.
CPP_NOT_KNOBS = {
    ("transport/request_wait.cc", "OMPI_MCA_coll_libnbc_iallreduce_algorithm"):
        "Open MPI's own setting: whether the user chose the algorithm themselves",
}

_MAPPINGS = {"environ", "env", "os.environ"}


def _knob_names():
    names = set()
    for k in _core.knobs():
        names.add(k["name"])
        if k["horovod_name"]:
            names.add(k["horovod_name"])
    return names


def _string_constants(trees):
    found = {}
    for tree in trees:
        for stmt in tree.body:
            if (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str)):
                for t in stmt.targets:
                    if isinstance(t, ast.Name):
                        found.setdefault(t.id, stmt.value.value)
    return found


def _python_reads(tree, constants):
    """(function, variable or None when computed) for every environment read in `tree`."""
    owner = {}
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for n in ast.walk(fn):
                owner[id(n)] = fn.name  # walked outer first: the innermost function wins
    for n in ast.walk(tree):
        key = None
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "os.getenv" and n.args:
            key = n.args[0]
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
              and n.func.attr in ("get", "pop", "setdefault")
              and ast.unparse(n.func.value) in _MAPPINGS and n.args):
            key = n.args[0]
        elif (isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load)
              and ast.unparse(n.value) in _MAPPINGS):
            key = n.slice
        elif (isinstance(n, ast.Compare) and len(n.ops) == 1
              and isinstance(n.ops[0], (ast.In, ast.NotIn))
              and ast.unparse(n.comparators[0]) in _MAPPINGS):
            key = n.left
        if key is None:
            continue
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            name = key.value
        elif isinstance(key, (ast.Name, ast.Attribute)):
            name = constants.get(key.id if isinstance(key, ast.Name) else key.attr)
        else:
            name = None
        yield owner.get(id(n), "<module>"), name


def _package_sources():
    return {str(p.relative_to(REPO)): ast.parse(p.read_text(), str(p))
            for p in sorted(PACKAGE.rglob("*.py"))}


def test_the_package_reads_settings_only_through_the_knob_table():
    sources = _package_sources()
    constants = _string_constants(sources.values())
    knobs = _knob_names()
    bad = []
    for path, tree in sources.items():
        for function, name in _python_reads(tree, constants):
            if name is None:
                if (path, function) not in COMPUTED:
                    bad.append(f"{path} {function}(): reads a computed variable name")
            elif name in knobs:
                if (path, name) not in KNOBS_OUTSIDE:
                    bad.append(f"{path} {function}(): reads knob {name} itself; use "
                               "_core.setting() (typed by the knob table)")
            elif name not in NOT_KNOBS:
                bad.append(f"{path} {function}(): reads {name}, which is not in the knob "
                           "table (cpp/core/env.cc); declare it there")
    assert not bad, "\n".join(bad)


def test_every_setting_the_package_asks_for_is_in_the_table():
    suffixes = {k["name"][len("HVDCOMPAT_"):] for k in _core.knobs()}
    bad = []
    for path, tree in _package_sources().items():
        for n in ast.walk(tree):
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                    and n.func.attr in ("setting", "knob") and "_core" in ast.unparse(n.func)):
                if n.func.attr == "knob":
                    bad.append(f"{path}: _core.knob() is gone; use _core.setting()")
                elif n.args and isinstance(n.args[0], ast.Constant) \
                        and n.args[0].value not in suffixes:
                    bad.append(f"{path}: _core.setting({n.args[0].value!r}) is not a knob")
    assert not bad, "\n".join(bad)


def test_the_core_reads_the_environment_only_in_its_knob_table():
    bad = []
    for path in sorted(CPP.rglob("*")):
        if path.suffix not in (".h", ".cc") or path == CPP / "core" / "env.cc":
            continue
        rel = str(path.relative_to(CPP))
        for m in re.finditer(r"getenv\s*\(([^)]*)\)", path.read_text()):
            literal = re.fullmatch(r'\s*"([A-Za-z0-9_]+)"\s*', m.group(1))
            if not literal or (rel, literal.group(1)) not in CPP_NOT_KNOBS:
                bad.append(f"cpp/{rel}: getenv({m.group(1)}) outside the knob table "
                           "(cpp/core/env.cc)")
    assert not bad, "\n".join(bad)


def test_the_allow_lists_are_not_stale():
    sources = _package_sources()
    constants = _string_constants(sources.values())
    names, computed, outside = set(), set(), set()
    for path, tree in sources.items():
        for function, name in _python_reads(tree, constants):
            if name is None:
                computed.add((path, function))
            else:
                names.add(name)
                outside.add((path, name))
    assert set(NOT_KNOBS) <= names, set(NOT_KNOBS) - names
    assert set(COMPUTED) <= computed, set(COMPUTED) - computed
    assert KNOBS_OUTSIDE <= outside, KNOBS_OUTSIDE - outside


def test_the_scan_finds_each_kind_of_read():
    tree = ast.parse("import os\nX = 'B'\ndef f(environ, names):\n"
                     "    os.getenv('A'); environ.get(X); os.environ['C']; 'D' in environ\n"
                     "    return [environ.get(n) for n in names]\n")
    assert sorted(map(str, _python_reads(tree, _string_constants([tree])))) == sorted(
        map(str, [("f", "A"), ("f", "B"), ("f", "C"), ("f", "D"), ("f", None)]))
