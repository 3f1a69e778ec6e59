"""Does every call of a function whose signature a conversion changed still bind?

Read with `ast`, apart from the converter's own analysis: the functions and methods of the
converted file whose parameters differ from the original's, and the calls of each in the file
(``f(...)``, ``self.m(...)`` and ``super().m(...)`` in a class, ``obj.m(...)`` after
``obj = Cls(...)``, ``Cls(...)`` for ``__init__``), bound with `inspect.Signature.bind`.
"""

from __future__ import annotations

import ast
import inspect

Key = tuple[str | None, str]  # (class, function)


def _functions(tree: ast.Module) -> dict[Key, ast.FunctionDef]:
    found: dict[Key, ast.FunctionDef] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            found[(None, node.name)] = node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    found[(node.name, item.name)] = item
    for node in ast.walk(tree):  # nested helpers: by name, when not shadowed by a global
        if isinstance(node, ast.FunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.FunctionDef) and inner is not node:
                    found.setdefault((None, inner.name), inner)
    return found


def _signature(function: ast.FunctionDef, bound: bool) -> inspect.Signature:
    args = function.args
    kind = inspect.Parameter
    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params = []
    for index, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
        if bound and index == 0:
            continue
        how = kind.POSITIONAL_ONLY if arg in args.posonlyargs else kind.POSITIONAL_OR_KEYWORD
        params.append(kind(arg.arg, how, default=kind.empty if default is None else 0))
    if args.vararg:
        params.append(kind(args.vararg.arg, kind.VAR_POSITIONAL))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        params.append(
            kind(arg.arg, kind.KEYWORD_ONLY, default=kind.empty if default is None else 0)
        )
    if args.kwarg:
        params.append(kind(args.kwarg.arg, kind.VAR_KEYWORD))
    return inspect.Signature(params)


def _is_method(function: ast.FunctionDef) -> bool:
    names = {d.id for d in function.decorator_list if isinstance(d, ast.Name)}
    return "staticmethod" not in names


class _Calls(ast.NodeVisitor):
    """Each call with the (class, function) it runs, where the file shows it."""

    def __init__(self, functions: dict[Key, ast.FunctionDef], classes: dict[str, ast.ClassDef]):
        self.functions = functions
        self.classes = classes
        self.found: list[tuple[ast.Call, Key, bool]] = []
        self._class: list[str] = []
        self._instances: list[dict[str, str]] = [{}]

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._class.append(node.name)
        self.generic_visit(node)
        self._class.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._instances.append(dict(self._instances[0]))
        self.generic_visit(node)
        self._instances.pop()

    def visit_Assign(self, node: ast.Assign) -> None:
        value = node.value
        built = isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
        if built and value.func.id in self.classes:  # type: ignore[attr-defined]
            for target in node.targets:
                self._instances[-1][ast.unparse(target)] = value.func.id  # type: ignore[attr-defined]
        self.generic_visit(node)

    def _lookup(self, owner: str, name: str) -> Key | None:
        seen = set()
        pending = [owner]
        while pending:
            current = pending.pop(0)
            if current in seen or current not in self.classes:
                continue
            seen.add(current)
            if (current, name) in self.functions:
                return (current, name)
            pending += [ast.unparse(b) for b in self.classes[current].bases]
        return None

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        key: Key | None = None
        bound = False
        if isinstance(func, ast.Name):
            if (None, func.id) in self.functions:
                key = (None, func.id)
            elif func.id in self.classes:
                key, bound = self._lookup(func.id, "__init__"), True
        elif isinstance(func, ast.Attribute):
            receiver = ast.unparse(func.value)
            owner = None
            if receiver == "self" and self._class:
                owner = self._class[-1]
            elif receiver == "super()" and self._class:
                bases = self.classes[self._class[-1]].bases
                owner = ast.unparse(bases[0]) if bases else None
            elif isinstance(func.value, ast.Call) and ast.unparse(func.value.func) in self.classes:
                owner = ast.unparse(func.value.func)
            else:
                owner = self._instances[-1].get(receiver)
            if owner is not None:
                key, bound = self._lookup(owner, func.attr), True
        if key is not None:
            self.found.append((node, key, bound and _is_method(self.functions[key])))
        self.generic_visit(node)


def unbound_calls(before: str, after: str) -> list[str]:
    """``line: call`` for each call in ``after`` of a function whose parameters the conversion
    changed, that does not bind to its new signature (a missing or unknown argument)."""
    old = _functions(ast.parse(before))
    tree = ast.parse(after)
    new = _functions(tree)
    changed = {
        key
        for key, function in new.items()
        if key in old and ast.dump(old[key].args) != ast.dump(function.args)
    }
    classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    calls = _Calls(new, classes)
    calls.visit(tree)
    problems = []
    for call, key, bound in calls.found:
        if key not in changed:
            continue
        if any(isinstance(a, ast.Starred) for a in call.args) or any(
            k.arg is None for k in call.keywords
        ):
            continue  # ``*args``/``**kwargs`` at the call: the file does not show what binds
        signature = _signature(new[key], bound)
        try:
            signature.bind(*call.args, **{k.arg: k.value for k in call.keywords})
        except TypeError as error:
            problems.append(f"{call.lineno}: {ast.unparse(call)}: {error}")
    return problems
