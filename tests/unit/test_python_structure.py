"""The Python package's structure, read from its source (nothing is imported).

Two rules (Note [One owner of Python state] in hvdcompat/_session.py):
- the modules import each other without a circle, counting the imports made
  inside functions (which only hide a circle until the function runs);
- no module keeps mutable state at module level: what belongs to a running
  engine lives in the session object, and what a module keeps for the whole
  process is listed below with the reason it outlives init and shutdown.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "hvdcompat"


def _module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources():
    return {_module_name(p): (p, ast.parse(p.read_text(), str(p)))
            for p in sorted(PACKAGE.rglob("*.py"))}


SOURCES = _sources()


def _is_package(module):
    return SOURCES[module][0].name == "__init__.py"


def _resolve(module, node):
    """The package modules one import statement loads (parent packages aside)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in SOURCES}
    base = node.module or ""
    if node.level:
        anchor = module.split(".")
        if not _is_package(module):
            anchor.pop()
        anchor = anchor[:len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    found = set()
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in SOURCES:
            found.add(sub)  # `from pkg import submodule`
        elif base in SOURCES:
            found.add(base)  # `from module import name`
    return found


def import_graph():
    """module -> the package modules it imports anywhere in its source."""
    graph = {}
    for module, (_, tree) in SOURCES.items():
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _resolve(module, node)
        edges.discard(module)
        graph[module] = edges
    return graph


def _find_cycle(graph):
    """One import circle as a list of modules, or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state:
                cycle = visit(n)
                if cycle:
                    return cycle
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            if cycle:
                return cycle
    return None


def test_the_graph_sees_function_level_imports():
    graph = import_graph()
    # hvdcompat.ddp.backend imports the package only inside a function.
    assert "hvdcompat" in graph["hvdcompat.ddp.backend"]
    assert "hvdcompat._ext" in graph["hvdcompat.basics"]
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circle():
    cycle = _find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_extension_loader_imports_nothing_of_the_package():
    assert import_graph()["hvdcompat._ext"] == set()


# Module-level state kept for the whole process, with why it is not the
# session's: it outlives hvd.shutdown(), hvd.init() and elastic resets, or
# exists without an engine at all. Anything that belongs to one running engine
# goes into hvdcompat._session.Session instead. (Lookup tables and other
# constants need no entry: only state that is changed after import is found.
# A function memoised with functools.cache is not state either: it answers the
# same for the whole process.)
PROCESS_STATE = {
    ("hvdcompat._session", "_current"):
        "the owner itself: the running engine's session, or None",
    ("hvdcompat.basics", "_exit"):
        "how the process ends (atexit registered, failed rank, ranks lost by a reset): read at "
        "interpreter exit, also after a shutdown",
    ("hvdcompat.optimizer", "_optimizers_per_set"):
        "numbers the optimizers per set for their op names; an optimizer keeps its names across "
        "shutdown, init and resets, so a later one must not reuse them",
    ("hvdcompat.ddp.hooks", "_state_ids"):
        "numbers DDP hook states for their op names; a hook state lives with its model, also "
        "under torchrun where no engine runs",
    ("hvdcompat.ddp.hooks", "_default_states"):
        "the hook state DDP gets for each process group; lives with the group, not the engine",
    ("hvdcompat.ddp.accelerate", "_announced"):
        "rank 0 prints its line once per process, however many models and engines",
    ("hvdcompat.elastic.state", "_handler_registry"):
        "Horovod's get/set_handler_registry: user configuration of the process",
    ("hvdcompat.elastic.loop", "_last_restart"):
        "how this launch began (a restart on new hosts): the same for the whole process, "
        "across the resets that follow",
    ("hvdcompat.elastic.notifications", "_offset"):
        "the part of the driver's notices file this process has read; a reset must not read "
        "the old notices again",
    ("hvdcompat.elastic.notifications", "_removals_from"):
        "where the notices about this process begin (a worker that joined a running job skips "
        "the removals of its host's earlier workers): fixed for the process",
}

_MUTATORS = frozenset({
    "append", "extend", "insert", "pop", "popitem", "remove", "clear", "update", "setdefault",
    "add", "discard", "appendleft", "extendleft", "popleft", "sort", "reverse",
    "__setitem__", "__delitem__",
})
# Constructors of objects that change themselves when used.
_STATEFUL_CALLS = frozenset({
    "count", "cycle", "WeakSet", "WeakKeyDictionary", "WeakValueDictionary", "deque",
    "defaultdict", "Counter", "OrderedDict", "Queue", "SimpleQueue", "LifoQueue",
})


def _module_level_names(tree):
    """Names that module-level assignments bind (`__all__` aside)."""
    names = set()
    for stmt in _top_level_statements(tree.body):
        targets = []
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets
        elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
            targets = [stmt.target]
        for t in targets:
            for n in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]):
                if isinstance(n, ast.Name):
                    names.add(n.id)
    return names - {"__all__"}


def _top_level_statements(body):
    """Statements run at import (descending into if/try/with/for, not into defs)."""
    for stmt in body:
        yield stmt
        for field in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list) and not isinstance(
                    stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield from _top_level_statements(inner)


def _root_name(node):
    """`x` for x, x.a, x[k], x.a[k] ...; None for anything else."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _local_names(fn):
    """Names a function binds itself (parameters, assignments), so they shadow the module's."""
    args = fn.args
    local = {a.arg for a in args.args + args.posonlyargs + args.kwonlyargs}
    local |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    declared = set()
    for n in ast.walk(fn):
        if isinstance(n, (ast.Global, ast.Nonlocal)):
            declared |= set(n.names)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            local.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n is not fn:
            local.add(n.name)
        elif isinstance(n, ast.alias):
            local.add((n.asname or n.name).split(".")[0])
    return local - declared


def _mutated_in(node, module_names, shadowed):
    """Module-level names that the statements under `node` change."""
    found = set()

    def module_name(expr):
        name = _root_name(expr)
        return name if name in module_names and name not in shadowed else None

    for n in ast.walk(node):
        if isinstance(n, ast.Global):
            found |= set(n.names) & module_names
        targets = []
        if isinstance(n, (ast.Assign, ast.Delete)):
            targets = n.targets
        elif isinstance(n, (ast.AugAssign, ast.AnnAssign)):
            targets = [n.target]
        for t in targets:
            if isinstance(t, (ast.Attribute, ast.Subscript)) and module_name(t):
                found.add(module_name(t))
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and n.func.attr in _MUTATORS and module_name(n.func.value)):
            found.add(module_name(n.func.value))
    return found


def _imported_names(tree):
    """Names a module takes from the package at its top level (changing one changes another
    module's state, as the reset hook lists were changed by the modules that registered)."""
    return {a.asname or a.name for stmt in _top_level_statements(tree.body)
            if isinstance(stmt, ast.ImportFrom)
            and (stmt.level or (stmt.module or "").split(".")[0] == "hvdcompat")
            for a in stmt.names}


def module_state(module):
    """{name: why it counts as state} for one module of the package."""
    _, tree = SOURCES[module]
    names = _module_level_names(tree) | _imported_names(tree)
    state = {}
    for stmt in _top_level_statements(tree.body):
        if isinstance(stmt, ast.Assign):
            value = stmt.value
            is_box = isinstance(value, ast.List) and len(value.elts) == 1
            call = value.func if isinstance(value, ast.Call) else None
            callee = (call.attr if isinstance(call, ast.Attribute)
                      else call.id if isinstance(call, ast.Name) else None)
            for t in stmt.targets:
                if not isinstance(t, ast.Name) or t.id == "__all__":
                    continue
                if is_box:
                    state[t.id] = "a one-element box"
                elif callee in _STATEFUL_CALLS:
                    state[t.id] = f"a {callee}() object"
        if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for name in _mutated_in(stmt, names, set()):
                state.setdefault(name, "changed at import")
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            # Only the function's own statements: nested functions are visited themselves.
            for name in _mutated_in(fn, names, _local_names(fn)):
                state.setdefault(name, f"changed by {fn.name}()")
    return state


def test_the_state_scan_finds_each_kind():
    cases = {
        "box = [None]\n": {"box"},
        "import itertools\nids = itertools.count()\n": {"ids"},
        "table = {}\ndef f(k):\n    table[k] = 1\n": {"table"},
        "hooks = []\nhooks.append(print)\n": {"hooks"},
        "from hvdcompat.m import hooks\nhooks.append(print)\n": {"hooks"},
        "from os import environ\nenviron.setdefault('A', '1')\n": set(),
        "n = 0\ndef f():\n    global n\n    n += 1\n": {"n"},
        "class C:\n    pass\nc = C()\ndef f():\n    c.x = 1\n": {"c"},
        # constants and shadowing names are not state
        "TABLE = {'a': 1}\ndef f():\n    return TABLE['a']\n": set(),
        "table = {}\ndef f(table):\n    table['k'] = 1\n": set(),
    }
    for source, expected in cases.items():
        SOURCES["probe"] = (None, ast.parse(source))
        try:
            assert set(module_state("probe")) == expected, source
        finally:
            del SOURCES["probe"]


def test_no_mutable_module_state_outside_the_session():
    found = {(m, name): why for m in SOURCES for name, why in module_state(m).items()}
    unexpected = {k: v for k, v in found.items() if k not in PROCESS_STATE}
    assert not unexpected, (
        "module-level state outside hvdcompat._session.Session (Note [One owner of Python "
        f"state]); keep it in the session, or list it in PROCESS_STATE with why: {unexpected}")
    stale = set(PROCESS_STATE) - set(found)
    assert not stale, f"PROCESS_STATE lists state that is gone: {sorted(stale)}"


# Horovod's layout for the launchers: hvdcompatrun and hvd.run are hvdcompat.runner (as
# horovodrun and horovod.run are horovod.runner), nothing of them at the package's top level.
# The library below them imports from them only what is listed here, with why.
LIBRARY_IMPORTS_OF_THE_LAUNCHERS = {
    ("hvdcompat", "hvdcompat.runner"):
        "hvd.run is hvdcompat.runner.run, re-exported as Horovod re-exports horovod.runner.run",
    ("hvdcompat.horovod_alias", "hvdcompat.runner.launch"):
        "the alias's horovod.runner.launch is hvdcompatrun's entry point",
    ("hvdcompat.basics", "hvdcompat.runner.mpi_world"):
        "init reads the rank's place from the variables MPI launchers set (one list of them)",
    ("hvdcompat.rendezvous", "hvdcompat.runner.mpi_world"):
        "the Gloo rendezvous reads the rank's place from the same list",
}


def test_the_launchers_live_under_runner():
    top = sorted(m for m in SOURCES if m.count(".") == 1
                 and m.split(".")[1].startswith(("run_", "elastic_run", "ports")))
    assert not top, f"launcher modules at the package's top level (they belong in runner/): {top}"
    for module in ("hvdcompat.runner.run_func", "hvdcompat.runner.run_task",
                   "hvdcompat.runner.run_job", "hvdcompat.runner.elastic.driver",
                   "hvdcompat.runner.elastic.mpi_driver", "hvdcompat.runner.elastic.gloo_driver",
                   "hvdcompat.runner.elastic.run_func", "hvdcompat.runner.common.channel",
                   "hvdcompat.common.ports"):
        assert module in SOURCES, module


def test_the_library_imports_the_launchers_only_where_listed():
    graph = import_graph()
    found = {(m, target) for m, edges in graph.items()
             if not m.startswith("hvdcompat.runner") for target in edges
             if target == "hvdcompat.runner" or target.startswith("hvdcompat.runner.")}
    unexpected = found - set(LIBRARY_IMPORTS_OF_THE_LAUNCHERS)
    assert not unexpected, (
        f"library modules importing the launchers: {sorted(unexpected)}; what both need goes "
        "into hvdcompat/common/")
    stale = set(LIBRARY_IMPORTS_OF_THE_LAUNCHERS) - found
    assert not stale, f"LIBRARY_IMPORTS_OF_THE_LAUNCHERS lists imports that are gone: {stale}"
    assert all(not t.startswith("hvdcompat.runner") for t in graph["hvdcompat.common.ports"])
