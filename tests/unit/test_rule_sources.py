"""Each engine rule's error is raised in one place: the core's Runtime, not the Python layer.

The Python package checks what is about torch (type, dtype table,
contiguity, device); process sets and membership, the broadcast root,
alltoall splits, names in flight and duplicate process sets are the core's
(tests/parallel/test_engine_rules.py runs each one).
"""

import ast
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A phrase of each rule's message -> the one file that raises it.
RULES = {
    "name in flight": ("an operation with this name is still in flight", "cpp/engine/runtime.cc"),
    "unknown process set": ("does not exist, or has not been registered", "cpp/engine/runtime.cc"),
    "membership": ("is not a member of \" + DescribeSet", "cpp/engine/runtime.cc"),
    "root": ("invalid root rank", "cpp/engine/runtime.cc"),
    "split count": ("Number of entries in splits", "cpp/engine/runtime.cc"),
    "negative split": ("splits must be non-negative", "cpp/engine/runtime.cc"),
    "split sum": ("Sum of splits entries", "cpp/engine/runtime.cc"),
    "uneven rows": ("not an even multiple of the number of workers", "cpp/engine/runtime.cc"),
    "duplicate process set": ("Attempted to add a duplicate process set", "cpp/engine/runtime.cc"),
}

# What the Python layer must not raise about any more (lower case).
PYTHON_FORBIDDEN = [
    "still in flight", "same name as another tensor", "not a member", "not part of the provided",
    "has not been registered", "root rank", "number of entries in splits",
    "splits must be non-negative", "sum of splits", "even multiple", "duplicate process set",
    "is a duplicate",
]
# torch.distributed's reduce, gather and scatter run as allreduce/allgather/
# alltoall: their root never reaches the core, so the backend checks it.
PYTHON_ALLOWED = {("hvdcompat/ddp/backend.py", "root rank")}


def _sources(top, suffixes):
    for root, _, files in os.walk(os.path.join(REPO, top)):
        for f in files:
            if f.endswith(suffixes):
                path = os.path.join(root, f)
                yield os.path.relpath(path, REPO), open(path, encoding="utf-8").read()


def _raised_text(tree):
    """The string constants inside every `raise` statement of a module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            parts = [n.value for n in ast.walk(node.exc)
                     if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            yield node.lineno, " ".join(parts)


def test_each_rule_is_raised_in_one_core_file_once():
    cpp = dict(_sources("cpp", (".cc", ".h")))
    for rule, (phrase, home) in RULES.items():
        where = {path: text.count(phrase) for path, text in cpp.items() if phrase in text}
        assert where == {home: 1}, f"{rule}: {phrase!r} found in {where}, expected only {home}"


def test_the_python_layer_raises_none_of_the_engine_rules():
    offending = []
    for path, text in _sources("hvdcompat", (".py",)):
        for line, raised in _raised_text(ast.parse(text, path)):
            low = re.sub(r"\s+", " ", raised.lower())
            offending += [f"{path}:{line}: {p!r}" for p in PYTHON_FORBIDDEN
                          if p in low and (path, p) not in PYTHON_ALLOWED]
    assert not offending, "engine rules raised in Python:\n" + "\n".join(offending)
