"""hvdcompat/_core.pyi describes the built extension: the same functions,
classes, class members and constants, and each function's parameter names."""

import ast
import re
from pathlib import Path

from hvdcompat.basics import _core

STUB = Path(__file__).resolve().parents[2] / "hvdcompat" / "_core.pyi"


def _stub():
    tree = ast.parse(STUB.read_text())
    functions, classes, constants = {}, {}, set()
    errors = {}  # exception classes: name -> base names
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            functions[node.name] = [a.arg for a in node.args.args + node.args.kwonlyargs]
        elif isinstance(node, ast.ClassDef) and node.bases:
            errors[node.name] = [b.id for b in node.bases]
        elif isinstance(node, ast.ClassDef):
            classes[node.name] = {n.name: [a.arg for a in n.args.args + n.args.kwonlyargs]
                                  for n in node.body if isinstance(n, ast.FunctionDef)}
        elif isinstance(node, ast.AnnAssign):
            constants.add(node.target.id)
    return functions, classes, constants, errors


def _public(obj):
    return {n for n in dir(obj) if not n.startswith("_")}


def _parameters(doc):
    """Parameter names from pybind11's signature line: name(a: T, *, b: T = x) -> R."""
    inside = re.match(r"\w+\((.*)\) ->", doc.splitlines()[0]).group(1)
    names, depth, token = [], 0, ""
    for ch in inside + ",":
        depth += ch in "[(" and 1 or (ch in "])" and -1 or 0)
        if ch == "," and depth == 0:
            name = token.split(":")[0].strip()
            if name and name != "*":
                names.append(name)
            token = ""
        else:
            token += ch
    return names


def test_the_stub_names_what_the_module_has():
    functions, classes, constants, errors = _stub()
    module = _public(_core)
    built_classes = {n for n in module if isinstance(getattr(_core, n), type)}
    built_functions = {n for n in module - built_classes if callable(getattr(_core, n))}
    built_constants = module - built_classes - built_functions
    assert set(functions) == built_functions
    assert set(classes) | set(errors) == built_classes
    assert constants == built_constants


def test_function_parameters_match():
    functions, _, _, _ = _stub()
    for name, params in functions.items():
        assert params == _parameters(getattr(_core, name).__doc__), name


def test_class_members_and_constructors_match():
    _, classes, _, errors = _stub()
    for name, members in classes.items():
        cls = getattr(_core, name)
        assert set(members) - {"__init__"} == _public(cls), name
        built = _parameters(cls.__init__.__doc__)
        assert members["__init__"] == built, name
    for name, bases in errors.items():
        assert [b.__name__ for b in getattr(_core, name).__bases__] == bases, name


def test_the_stub_ships_with_the_package():
    setup = (STUB.parents[1] / "setup.py").read_text()
    assert re.search(r'package_data=\{"hvdcompat": \[[^]]*"_core\.pyi"', setup)
