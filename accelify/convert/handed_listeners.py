"""Objects of another module of the project that the training code is handed and calls back
(master_thesis' listeners: ``mnist_gan.py`` makes ``LossReporter()`` and ``ModelSaver(...)``,
hands them in a list to ``GanTrainLoop``, whose loop calls ``listener.report(state)`` after each
epoch). Their module trains nothing, so it is not converted; converted, the trainer runs on every
rank and so does each callback: every line they print shows once per rank, every file they write
is written by each rank, and a model the trainer hands them is the prepared (DDP-wrapped) one
(realconv40: 30 lines on 2 ranks for the original's 15, models saved wrapped, nothing said).

The calls happen inside the trainer, through an object, on a path the driver's conversion does
not follow. Where the module is converted in the same run, its conversion puts each print of
such a class (a line of its own, whose arguments call nothing that could meet the other ranks)
under ``if PartialState().is_main_process:``, as `saver_modules` does: on one process it prints
as before. What else the callbacks do on every rank (a file written, a prepared model saved
wrapped) is not safe to move from here (a rank may read the file back; the module has no
accelerator to unwrap with), so the line that makes the object gets a review line naming its
module, the method and what it does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import libcst as cst

from accelify.analysis import side_effects
from accelify.analysis.names import TORCH_SAVE
from accelify.analysis.project_modules import read
from accelify.analysis.script_model import ScriptModel, analyze
from accelify.analysis.syntax import dotted, walk
from accelify.convert import across, project
from accelify.convert.project import SiblingCall
from accelify.convert.saver_modules import STATE, print_lines
from accelify.convert.steps.context import Options, import_lines
from accelify.edits import rewrites
from accelify.edits.apply import ApplyPlan
from accelify.edits.plan import Note, Plan
from accelify.errors import UserError
from accelify.source import parse

#: what a print's arguments may call and still run on one rank alone: each reads a value
_SAFE_IN_PRINT = {
    "str",
    "repr",
    "int",
    "float",
    "round",
    "abs",
    "len",
    "format",
    "join",
    "item",
    "items",
    "keys",
    "values",
    "tolist",
    "mean",
    "sum",
    "min",
    "max",
    "numel",
    "detach",
    "cpu",
}

#: calls that read an object without keeping it: handing an object to one calls nothing of it
_READERS = {"print", "len", "isinstance", "id", "repr", "str", "type"}


def listener_reviews(
    path: Path, model: ScriptModel, siblings: list[SiblingCall], converted_with: frozenset[str]
) -> list[tuple[int, str]]:
    """Review lines, (line, text), for each object of ``model`` (the file at ``path``) made from
    a class of a module of its folder whose methods print or write a file on every rank, and
    handed to code that trains (`_trainer_handed`); ``converted_with``: the files converted in
    this run (a module among them has its prints guarded by its own conversion)."""
    found: list[tuple[int, str]] = []
    for call, name, member, file, other in siblings:
        cls = _class(other, member)
        if cls is None or model.under_rank_guard(call):
            continue
        shown = _relative(file, path)
        converted = str(file.resolve()) in converted_with
        done = list(_what_it_does(other, cls, f"{shown}:", converted))
        trainer = _trainer_handed(model, call, siblings) if done else None
        if trainer is None:
            continue
        alone = "" if converted else f" ({shown} is not converted)"
        found.append(
            (
                model.line(call),
                f"{name}(...) is handed to {trainer}, which trains on every rank and calls "
                f"it there{alone}: {'; '.join(done)}",
            )
        )
    return found


def _class(module: ScriptModel, name: str) -> cst.ClassDef | None:
    return next(
        (s for s in module.module.body if isinstance(s, cst.ClassDef) and s.name.value == name),
        None,
    )


def _what_it_does(
    module: ScriptModel, cls: cst.ClassDef, where: str, converted: bool
) -> Iterator[str]:
    """What the class's methods other than ``__init__`` (which runs where the object is made)
    do on every rank: the first print no rank test keeps to one rank (nor, the module
    ``converted`` in this run, its own conversion: `guarded_prints`) and the first such file
    write; ``where``: ``listeners.py:``, the module as the lines name it."""
    methods = [
        s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value != "__init__"
    ]
    kept = {id(line.body[0].value) for line in guarded_prints(module, cls)} if converted else set()
    printed = _first(module, methods, lambda call: _prints(call) and id(call) not in kept)
    if printed is not None:
        method, call = printed
        yield (
            f"its {method}() prints ({where}{module.line(call)}), each line once per rank: print "
            "there only under `if PartialState().is_main_process:`"
        )
    written = _first(module, methods, lambda call: _writes(module, call))
    if written is not None:
        method, call = written
        spelled = f"{dotted(call.func)}(...)" if dotted(call.func) else "its write"
        text = (
            f"its {method}() writes a file ({where}{module.line(call)}, {spelled}), "
            "every rank the same file: write it only under `if "
            "PartialState().is_main_process:`"
        )
        if _first(module, methods, lambda call: bool(module.call_names(call) & TORCH_SAVE)):
            text += (
                ", and a model the trainer hands it is the one it prepared (DDP-wrapped): "
                "save accelerator.unwrap_model(model), as the original saved the bare model"
            )
        yield text


def guarded_prints(module: ScriptModel, cls: cst.ClassDef) -> list[cst.SimpleStatementLine]:
    """The prints of ``cls``'s methods the module's conversion puts on the main process: a
    ``print(...)`` line of its own, on every rank (no rank test around it), whose arguments
    call only what reads a value (`_SAFE_IN_PRINT`): a call there that could meet the other
    ranks (an evaluation, a gather) would hang run on one."""
    return [
        node
        for node in print_lines(cls)
        if not module.under_rank_guard(node)
        and all(
            _called_name(inner) in _SAFE_IN_PRINT
            for argument in node.body[0].value.args
            for inner in walk(argument.value)
            if isinstance(inner, cst.Call)
        )
    ]


def may_print_for_another_file(data: bytes, options: Options) -> bool:
    """A cheap test for a file without ``.backward(``, converted with others: a class of it may
    print, called back by a trainer (`guard_prints` reads it)."""
    return bool(options.converted_with) and b"class " in data and b"print(" in data


def handed_classes(module: Path, converted_with: frozenset[str]) -> set[str]:
    """The classes of ``module`` that a file converted in the same run makes and hands to code
    that trains (`listener_reviews` says so there): that file's conversion and this module's
    ask the same question."""
    found: set[str] = set()
    for file in across.importers_of(module.resolve()):
        if str(file) not in converted_with:
            continue
        data = read(file)
        if b"Accelerator" in data:
            continue  # converted already: not converted again in this run
        try:
            driver = analyze(parse(data, str(file)))
        except UserError:
            continue
        siblings = project.sibling_calls(file, driver)
        for call, _, member, other, _ in siblings:
            if (
                other.resolve() == module.resolve()
                and not driver.under_rank_guard(call)
                and _trainer_handed(driver, call, siblings) is not None
            ):
                found.add(member)
    return found


def guard_prints(
    path: Path, model: ScriptModel, options: Options
) -> tuple[cst.Module, list[Note], list[str]] | None:
    """The module (it trains nothing) with the prints of its classes that a file converted in
    this run hands to its trainer under ``if PartialState().is_main_process:``, the changes and
    the import lines to add; None where there is no such print."""
    if not options.converted_with or not path.is_file():
        return None
    classes = handed_classes(path, options.converted_with)
    plan = Plan()
    changes: list[Note] = []
    for statement in model.module.body:
        if not isinstance(statement, cst.ClassDef) or statement.name.value not in classes:
            continue
        for line in guarded_prints(model, statement):
            plan.add(rewrites.main_process_only(line, STATE))
            changes.append(
                Note(
                    model.line(line),
                    f"print on the main process only (if {STATE}.is_main_process:): "
                    f"{statement.name.value} is handed to a trainer converted with this file, "
                    "which calls it on every rank",
                )
            )
    if not changes:
        return None
    converted = model.module.visit(ApplyPlan(plan, model.position))
    return converted, changes, import_lines(options.target, ["PartialState"])


def _called_name(call: cst.Call) -> str:
    func = call.func
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return func.value if isinstance(func, cst.Name) else ""


def _first(
    module: ScriptModel, methods: list[cst.FunctionDef], test
) -> tuple[str, cst.Call] | None:  # type: ignore[no-untyped-def]
    for method in methods:
        for node in walk(method.body):
            if isinstance(node, cst.Call) and test(node) and not module.under_rank_guard(node):
                return method.name.value, node
    return None


def _prints(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Name) and call.func.value == "print"


def _writes(module: ScriptModel, call: cst.Call) -> bool:
    if module.call_names(call) & {"builtins.input"}:
        return False
    return side_effects.opens_for_writing(call) or side_effects.once_per_run(module, call)


def _trainer_handed(model: ScriptModel, made: cst.Call, siblings: list[SiblingCall]) -> str | None:
    """``GanTrainLoop(...)``: the call of code that trains (a class or function of this file, or
    of a module of its folder, with a ``.backward(``) that the object ``made`` is handed to,
    directly, in a list, tuple or dict, or through a name bound to one of those (``listeners =
    [LossReporter(), ...]``; ``listeners.append(...)``); None where it is handed to no such call."""
    holders = _holders(model, made)
    for node in walk(model.module):
        if not isinstance(node, cst.Call) or node is made:
            continue
        callee = dotted(node.func)
        if callee is None or callee in _READERS:
            continue
        if not any(
            arg is made or (isinstance(arg, cst.Name) and arg.value in holders)
            for argument in node.args
            for arg in walk(argument.value)
        ):
            continue
        if _trains(model, node, callee, siblings):
            return f"{callee}(...)"
    return None


def _holders(model: ScriptModel, made: cst.Call) -> set[str]:
    """Names bound to ``made`` or to a literal holding it, and those it is appended to."""
    names: set[str] = set()
    for node in walk(model.module):
        if isinstance(node, cst.Assign) and any(n is made for n in _held(node.value)):
            names |= {t.target.value for t in node.targets if isinstance(t.target, cst.Name)}
        elif (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value in ("append", "extend", "insert")
            and isinstance(node.func.value, cst.Name)
            and any(arg is made for argument in node.args for arg in _held(argument.value))
        ):
            names.add(node.func.value.value)
    return names


def _held(value: cst.BaseExpression) -> list[cst.CSTNode]:
    """``value`` itself, or the elements of the list, tuple, set or dict it is."""
    if isinstance(value, (cst.List, cst.Tuple, cst.Set)):
        return [value, *(e.value for e in value.elements)]
    if isinstance(value, cst.Dict):
        return [value, *(e.value for e in value.elements if isinstance(e, cst.DictElement))]
    return [value]


def _trains(model: ScriptModel, call: cst.Call, callee: str, siblings: list[SiblingCall]) -> bool:
    """Whether ``callee`` (called by ``call``) is a class or function that has a ``.backward(``:
    defined in this file, or in the module of its folder it is imported from."""
    for sibling, _, member, _, other in siblings:
        if sibling is call:
            defined = _definition(other, member)
            return defined is not None and _has_backward(defined)
    defined = _definition(model, callee)
    return defined is not None and _has_backward(defined)


def _definition(module: ScriptModel, name: str) -> cst.CSTNode | None:
    return next(
        (
            s
            for s in module.module.body
            if isinstance(s, (cst.ClassDef, cst.FunctionDef)) and s.name.value == name
        ),
        None,
    )


def _has_backward(node: cst.CSTNode) -> bool:
    return any(
        isinstance(n, cst.Call)
        and isinstance(n.func, cst.Attribute)
        and n.func.attr.value == "backward"
        for n in walk(node)
    )


def _relative(module: Path, script: Path) -> str:
    try:
        return str(module.resolve().relative_to(script.resolve().parent))
    except ValueError:
        return module.name
