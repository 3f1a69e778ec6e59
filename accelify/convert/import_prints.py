"""Prints a module of the project runs when the script imports it.

``utils.py`` with ``print("using", DEVICE)`` at its top level prints on import: converted, the
script runs on every rank, each of which imports ``utils``, so the line shows once per rank.
The conversion rewrites only the script, and code that runs at another module's import cannot
be guarded from here (an ``if`` around the import would leave its names undefined on the other
ranks): the import gets a review line naming the print's file and line. Module-level code is
read with ``ast`` (the file is not analysed otherwise): statements outside any function, class
or ``if __name__ == "__main__":`` block, whose ``print(...)`` runs at import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import libcst as cst

from accelify.analysis.project_modules import imported_files, read
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted, walk


def import_time_prints(path: Path, data: bytes, model: ScriptModel) -> list[tuple[int, str]]:
    """Review lines, (line, text), for each import of ``model`` (the script at ``path``, whose
    text is ``data``) of a project module that prints at its top level."""
    found: list[tuple[int, str]] = []
    printed: dict[str, str | None] = {}
    for name, file in imported_files(path, data).items():
        printed[name] = _first_print(file, path)
    for node in walk(model.module):
        if not isinstance(node, (cst.Import, cst.ImportFrom)):
            continue
        for spelled in _spelled(node):
            where = printed.get(spelled)
            if where is None:
                continue
            found.append(
                (
                    model.line(node),
                    f"importing {spelled} runs its print at {where} on every rank: the line "
                    "shows once per rank; code of another module that runs at its import "
                    "cannot be guarded from here, so move that print into a function, or "
                    "print it only where the local rank is 0 (LOCAL_RANK of the environment)",
                )
            )
            break
    return found


def _spelled(node: cst.Import | cst.ImportFrom) -> list[str]:
    """The module names an import spells, as `imported_files` keys them: ``utils`` of ``import
    utils`` or ``from utils import log``, ``.util`` of ``from . import util``."""
    if isinstance(node, cst.Import):
        return [dotted(alias.name) or "" for alias in node.names]
    dots = "." * len(node.relative)
    if node.module is not None:
        return [dots + (dotted(node.module) or "")]
    if isinstance(node.names, cst.ImportStar):
        return []
    return [dots + (dotted(alias.name) or "") for alias in node.names]


def _first_print(file: Path, script: Path) -> str | None:
    """``utils.py:3``: where ``file`` first calls ``print`` at its top level; None if nowhere
    (or it does not parse)."""
    try:
        tree = ast.parse(read(file))
    except (SyntaxError, ValueError, OSError):
        return None
    line = _print_in(tree.body)
    if line is None:
        return None
    try:
        shown = file.relative_to(script.parent)
    except ValueError:
        shown = Path(file.name)
    return f"{shown}:{line}"


def _print_in(body: list[ast.stmt]) -> int | None:
    for statement in body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(statement, ast.If) and _main_test(statement.test):
            continue
        for node in _own_nodes(statement):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "print"
            ):
                return node.lineno
    return None


def _own_nodes(statement: ast.stmt) -> list[ast.AST]:
    """The nodes of ``statement`` that run with it: not those of a function, class or lambda
    it defines, nor of an ``if __name__ == "__main__":`` block inside it."""
    found: list[ast.AST] = []
    pending: list[ast.AST] = [statement]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and _main_test(node.test):
            continue
        found.append(node)
        pending.extend(ast.iter_child_nodes(node))
    return sorted(found, key=lambda n: getattr(n, "lineno", 0))


def _main_test(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
    )
