"""hvdcompat/_core.pyi describes the built extension: the same functions,
classes, class members and constants, and each function's signature
(parameter names, kinds, types, defaults and return type) as pybind11 states
it in the built module's docstrings."""

import ast
import re
from pathlib import Path

from hvdcompat.basics import _core

STUB = Path(__file__).resolve().parents[2] / "hvdcompat" / "_core.pyi"


def _signature_of_def(node, skip_self=False):
    """[(name, type, default)] and the return type of a stub `def`, as strings."""
    args = node.args
    params = []
    positional = args.args[1:] if skip_self else args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for a, d in zip(positional, defaults):
        params.append((a.arg, _type(ast.unparse(a.annotation)), _default(d)))
    if args.kwonlyargs:
        params.append(("*", "", None))
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        params.append((a.arg, _type(ast.unparse(a.annotation)), _default(d)))
    return params, _type(ast.unparse(node.returns))


def _default(node):
    if node is None:
        return None
    text = ast.unparse(node)
    return "..." if text == "Ellipsis" or text == "..." else _literal(text)


def _literal(text):
    try:
        return repr(ast.literal_eval(text))
    except (ValueError, SyntaxError):
        return text


def _type(text):
    """One spelling of a type for both sides: pybind11's and the stub's."""
    text = text.replace("hvdcompat._core.", "").replace("collections.abc.", "")
    text = text.replace("typing.SupportsInt | typing.SupportsIndex", "int")
    text = text.replace("typing.SupportsFloat | typing.SupportsIndex", "float")
    return text.replace("typing.", "").replace(" ", "")


def _split_top(text, sep=","):
    parts, depth, token = [], 0, ""
    for ch in text + sep:
        depth += ch in "[(" and 1 or (ch in "])" and -1 or 0)
        if ch == sep and depth == 0:
            parts.append(token.strip())
            token = ""
        else:
            token += ch
    return [p for p in parts if p]


def _built_signature(doc, skip_self=False):
    """[(name, type, default)] and the return type from pybind11's first docstring line."""
    m = re.match(r"\w*\((.*)\) -> (.*)$", doc.strip().splitlines()[0])
    inside, returns = m.group(1), m.group(2)
    params = []
    for part in _split_top(inside):
        if part == "*":
            params.append(("*", "", None))
            continue
        name, _, rest = part.partition(":")
        annotation, _, default = rest.partition(" = ")
        params.append((name.strip(), _type(annotation), _literal(default) if default else None))
    return (params[1:] if skip_self else params), _type(returns)


def _same_type(stub, built):
    # pybind11 says `object` for a py::object and a bare `dict`/`list`/`tuple`
    # for py::dict etc.: the stub may say more, but not something else.
    if built == "object":
        return True
    if "[" not in built:
        return stub.split("[")[0] == built
    return stub == built


def _check(where, stub, built):
    (s_params, s_ret), (b_params, b_ret) = stub, built
    assert [p[0] for p in s_params] == [p[0] for p in b_params], f"{where}: parameter names"
    for (name, s_type, s_def), (_, b_type, b_def) in zip(s_params, b_params):
        assert _same_type(s_type, b_type), f"{where}({name}): stub {s_type}, built {b_type}"
        assert (s_def is None) == (b_def is None), f"{where}({name}): default {s_def} vs {b_def}"
        if s_def not in (None, "...") and not b_def.startswith("<"):
            assert s_def == b_def, f"{where}({name}): default {s_def}, built {b_def}"
    assert _same_type(s_ret, b_ret), f"{where}: returns {s_ret} in the stub, {b_ret} built"


def _stub():
    tree = ast.parse(STUB.read_text())
    functions, classes, constants, errors, enums = {}, {}, set(), {}, {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            functions[node.name] = node
        elif isinstance(node, ast.ClassDef) and [ast.unparse(b) for b in node.bases] == ["Enum"]:
            enums[node.name] = [t.targets[0].id if isinstance(t, ast.Assign) else t.target.id
                                for t in node.body if isinstance(t, (ast.Assign, ast.AnnAssign))]
        elif isinstance(node, ast.ClassDef) and node.bases:
            errors[node.name] = [ast.unparse(b) for b in node.bases]
        elif isinstance(node, ast.ClassDef):
            classes[node.name] = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}
        elif isinstance(node, ast.AnnAssign):
            constants.add(node.target.id)
    return functions, classes, constants, errors, enums


def _public(obj):
    return {n for n in dir(obj) if not n.startswith("_")}


def test_the_stub_names_what_the_module_has():
    functions, classes, constants, errors, enums = _stub()
    module = _public(_core)
    built_classes = {n for n in module if isinstance(getattr(_core, n), type)}
    built_functions = {n for n in module - built_classes if callable(getattr(_core, n))}
    built_constants = module - built_classes - built_functions
    assert set(functions) == built_functions
    assert set(classes) | set(errors) | set(enums) == built_classes
    assert constants == built_constants


def test_function_signatures_match():
    functions = _stub()[0]
    for name, node in functions.items():
        _check(name, _signature_of_def(node), _built_signature(getattr(_core, name).__doc__))


def test_class_members_and_constructors_match():
    _, classes, _, errors, enums = _stub()
    for name, members in classes.items():
        cls = getattr(_core, name)
        assert set(members) - {"__init__"} == _public(cls), name
        for member, node in members.items():
            attr = getattr(cls, member)
            doc = (attr.fget if isinstance(attr, property) else attr).__doc__
            _check(f"{name}.{member}", _signature_of_def(node, skip_self=True),
                   _built_signature(doc, skip_self=True))
    for name, bases in errors.items():
        assert [b.__name__ for b in getattr(_core, name).__bases__] == bases, name
    for name, members in enums.items():
        assert members == list(getattr(_core, name).__members__), name


def test_a_wrong_type_in_the_stub_is_caught():
    # The check compares types, not only names: an int where the core takes an
    # Op enum (the binding's own spelling) does not pass.
    node = ast.parse("def enqueue(args: int) -> int: ...").body[0]
    try:
        _check("enqueue", _signature_of_def(node), _built_signature(_core.enqueue.__doc__))
    except AssertionError as e:
        assert "stub int, built EnqueueArgs" in str(e)
    else:
        raise AssertionError("a wrong parameter type passed the check")


def test_the_stub_ships_with_the_package():
    setup = (STUB.parents[1] / "setup.py").read_text()
    assert re.search(r'package_data=\{"hvdcompat": \[[^]]*"_core\.pyi"', setup)
