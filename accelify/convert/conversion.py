"""One script in, its distributed version and a summary out.

Data flows one way: bytes -> libcst module -> `ScriptModel` -> `Plan` -> new module -> bytes.
Nothing here writes files; `accelify.convert.files` does that for the CLI.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from accelify.analysis.script_model import analyze
from accelify.analysis.syntax import dotted, is_docstring, walk
from accelify.convert import project
from accelify.convert.planner import Options, plan_conversion
from accelify.convert.wrap_lines import wrap_long_lines
from accelify.edits.apply import ApplyPlan
from accelify.edits.plan import Note, statement
from accelify.errors import UserError
from accelify.source import parse, render, room_for_deep_trees


@dataclass
class Conversion:
    path: str
    original: bytes
    converted: bytes
    changes: list[Note] = field(default_factory=list)
    reviews: list[Note] = field(default_factory=list)
    prepared: list[str] = field(default_factory=list)
    skipped: str | None = None

    @property
    def changed(self) -> bool:
        return self.converted != self.original


@room_for_deep_trees
def convert_source(data: bytes, path: str | Path, options: Options | None = None) -> Conversion:
    """Convert one script's source; raises `UserError` for a file that does not parse."""
    label = str(path)
    module = parse(data, label)
    model = analyze(module)
    if model.uses_accelerator:
        return Conversion(label, data, data, skipped="already uses an Accelerator")
    if not model.trains:
        elsewhere = project.trained_elsewhere(path, model)
        if elsewhere:
            first = elsewhere[0]
            return Conversion(
                label,
                data,
                data,
                reviews=project.review_notes(path, elsewhere),
                skipped=f"no .backward() call in this file: it trains through {first.function}() "
                f"of another module (line {first.line})",
            )
        return Conversion(label, data, data, skipped="no .backward() call: not a training script")
    returns = project.imported_returns(path, model)
    if returns:  # DataLoaders made by the project's other modules: analysed as made here
        model = analyze(module, imported_returns=returns)
    plan = plan_conversion(model, options or Options(), project.imported_writers(path, model))
    if plan.empty:
        # a plan of review lines only: the script was left as it is for the reason they give
        why = "left as it is (the review line says why)" if plan.reviews else "nothing to convert"
        return Conversion(label, data, data, reviews=plan.reviews, skipped=why)
    converted = module.visit(ApplyPlan(plan))
    for code in plan.imports:
        converted = _add_import(converted, code, Path(label))
    converted = wrap_long_lines(converted, data)
    rendered = render(converted, data)
    _check_parses(rendered, label, data)
    return Conversion(
        label,
        data,
        rendered,
        changes=sorted(plan.changes, key=lambda n: n.line),
        reviews=sorted(plan.reviews, key=lambda n: n.line),
        prepared=plan.prepared,
    )


def _add_import(module: cst.Module, code: str, script: Path) -> cst.Module:
    """Above the first top-level statement that runs code using an imported name: a script that
    imports again further down (``import torch.nn as nn`` after its prints) must not get the
    import below the ``accelerator = Accelerator()`` that needs it. Within the imports just
    above that statement, where isort (ruff's ``I001``) puts it, so a converted file stays
    clean under the import sorting its pre-commit runs."""
    body = list(module.body)
    imported = _imported_names(code)
    position = 0
    for index, line in enumerate(body):
        if not isinstance(line, (cst.FunctionDef, cst.ClassDef)) and any(
            isinstance(node, cst.Name) and node.value in imported for node in walk(line)
        ):
            break
        if _is_import(line):
            position = index + 1
        elif index == 0 and is_docstring(line):
            position = 1
    added = statement(code)
    start = position
    while start > 0 and _is_import(body[start - 1]):
        start -= 1
    keys = [_sort_key(line, script) for line in body[start:position]]
    # the runtime is an installed package: third-party even where a folder of its name sits
    # beside the script (a checkout of accelify itself)
    ours = _sort_key(added, None)
    at = start + next((i for i, key in enumerate(keys) if key > ours), len(keys))
    before = keys[at - start - 1] if at > start else None
    after = keys[at - start] if at < position else None
    if before is not None and before[0] < ours[0]:
        if after is not None and after[0] == ours[0]:
            # the blank line (and comment) that opens the section now opens it above ours
            added = added.with_changes(leading_lines=body[at].leading_lines)
            body[at] = body[at].with_changes(leading_lines=[])
        else:
            added = added.with_changes(leading_lines=[cst.EmptyLine()])
    body.insert(at, added)
    return module.with_changes(body=body)


def _is_import(line: cst.CSTNode) -> bool:
    return isinstance(line, cst.SimpleStatementLine) and any(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in line.body
    )


#: isort's sections, in order
_FUTURE, _STANDARD, _THIRD_PARTY, _FIRST_PARTY = range(4)


def _sort_key(line: cst.CSTNode, script: Path | None) -> tuple[int, int, str]:
    """Where isort's default profile puts an import line: its section (a module beside the
    script, or a relative import, is the project's own; with no script, an installed module
    is third-party), straight imports before ``from`` imports, then the module name without
    case."""
    small = next(s for s in line.body if isinstance(s, (cst.Import, cst.ImportFrom)))  # type: ignore[attr-defined]
    if isinstance(small, cst.ImportFrom):
        if small.relative:
            return (_FIRST_PARTY, 1, "")
        name = (dotted(small.module) or "") if small.module is not None else ""
        style = 1
    else:
        name = dotted(small.names[0].name) or ""
        style = 0
    top = name.partition(".")[0]
    if top == "__future__":
        section = _FUTURE
    elif top in sys.stdlib_module_names:
        section = _STANDARD
    elif script is not None and (
        (script.parent / f"{top}.py").is_file() or (script.parent / top / "__init__.py").is_file()
    ):
        section = _FIRST_PARTY
    else:
        section = _THIRD_PARTY
    return (section, style, name.lower())


def _imported_names(code: str) -> set[str]:
    line = cst.parse_statement(code)
    names: set[str] = set()
    for small in getattr(line, "body", []):
        if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(
            small.names, cst.ImportStar
        ):
            for alias in small.names:
                bound = alias.asname.name if alias.asname is not None else alias.name
                names.add(dotted(bound).split(".")[0])  # type: ignore[arg-type]
    return names


def _check_parses(rendered: bytes, label: str, original: bytes) -> None:
    """The output always parses; if our edit broke that, it is our bug, reported as such. A
    script written for a newer Python than this one (``type X = ...``, 3.12's f-strings) cannot
    be checked here: that is said, not blamed on the conversion."""
    try:
        compile(rendered, label, "exec", dont_inherit=True, flags=0x400)  # ast.PyCF_ONLY_AST
    except SyntaxError as error:
        try:
            compile(original, label, "exec", dont_inherit=True, flags=0x400)
        except SyntaxError as own:
            version = ".".join(map(str, sys.version_info[:2]))
            raise UserError(
                f"this Python ({version}) cannot compile the script ({own.msg}), so its "
                "conversion cannot be checked: run accelify with the Python the script is "
                "written for",
                label,
                own.lineno,
            ) from None
        raise UserError(
            f"internal error: the conversion does not parse ({error.msg}); please report this file",
            label,
            error.lineno,
        ) from None
