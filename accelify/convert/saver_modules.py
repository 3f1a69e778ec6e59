"""A module of the project that trains nothing but holds a class whose methods save the state
dict of a model they are handed (pytorchtools' ``stopping.py``: ``EarlyStopping.__call__``
calls ``self.save_checkpoint(model)``, which does ``torch.save(model.state_dict(),
self.path)``), made by a training file converted in the same run. Its conversion runs each
such save on the main process only: the driver's conversion hands the object the unwrapped
model and makes every rank wait after each call (`steps.saving._project_object_savers`), so
the file is whole, written once, before any rank reads it back. The two conversions decide
alike: both ask `project.guarded_saves` of the same class."""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from accelify.analysis.project_modules import read
from accelify.analysis.script_model import ScriptModel, analyze
from accelify.analysis.syntax import walk
from accelify.convert import across, project
from accelify.convert.steps.context import Options, import_lines
from accelify.edits import rewrites
from accelify.edits.apply import ApplyPlan
from accelify.edits.plan import Note, Plan
from accelify.errors import UserError
from accelify.source import parse

#: The process state, reachable without an Accelerator: the object has none
STATE = "PartialState()"


def may_save_for_another_file(data: bytes, options: Options) -> bool:
    """A cheap test for a file without ``.backward(``, converted with others: a class of it may
    save a model's state dict (`guard_saves` reads it)."""
    return bool(options.converted_with) and b"class " in data and b".state_dict()" in data


def _drivers(path: Path, converted_with: frozenset[str]) -> list[tuple[Path, bytes]]:
    """The training files of ``path``'s folder converted in this run that import it; a file
    that already uses an Accelerator is left as it is (it would not wait after a call)."""
    drivers = [
        (file, read(file))
        for file in across.importers_of(path.resolve())
        if str(file) in converted_with
    ]
    return [
        (file, data)
        for file, data in drivers
        if b".backward(" in data and b"Accelerator" not in data
    ]


def saves_guarded(module: Path, class_name: str, converted_with: frozenset[str]) -> bool:
    """Whether the conversion of ``module`` runs the saves of its class ``class_name`` on the
    main process only: some training file converted in the same run makes the class, and in
    every such file every call of a saving method of an instance of it is a statement of its
    own that no rank may have left before (`project.object_saves_waited`), so that file's
    conversion has every rank wait after each. Otherwise a rank could read the file back
    before the main process wrote it (worse than every rank writing it): the save is left on
    every rank. The module's conversion and each driver's ask this same question, so the
    driver's summary says what the module's conversion did."""
    if not module.is_file() or str(module.resolve()) not in converted_with:
        return False
    made_by = 0
    for file, data in _drivers(module, converted_with):
        if class_name.encode() not in data:
            continue
        try:
            driver = analyze(parse(data, str(file)))
        except UserError:
            return False
        savers = {
            name: saver
            for name, saver in project.imported_object_savers(
                file, project.sibling_calls(file, driver)
            ).items()
            if saver.module.resolve() == module.resolve() and saver.class_name == class_name
        }
        for name, saver in savers.items():
            if not project.object_saves_waited(driver, name, saver):
                return False
        made_by += bool(savers)
    return made_by > 0


def guard_saves(
    path: Path, model: ScriptModel, options: Options
) -> tuple[cst.Module, list[Note], list[Note], list[str]] | None:
    """The module with the saves of its saver classes under ``if
    PartialState().is_main_process:``, the changes and review lines, and the import lines to
    add; None where no training file of the folder converted in this run makes such a class,
    or one of them calls its saving methods where it cannot wait after each (`saves_guarded`)."""
    if not options.converted_with or not path.is_file():
        return None
    drivers = _drivers(path, options.converted_with)
    if not drivers:
        return None
    plan = Plan()
    changes: list[Note] = []
    reviews: list[Note] = []
    for statement in model.module.body:
        if not isinstance(statement, cst.ClassDef):
            continue
        name = statement.name.value
        made_by = [file for file, data in drivers if name.encode() in data]
        guarded = made_by and saves_guarded(path, name, options.converted_with)
        saves = project.guarded_saves(model, statement) if guarded else None
        for line in saves or []:
            plan.add(rewrites.main_process_only(line, STATE))
            at = model.line(line)
            changes.append(
                Note(
                    at,
                    f"torch.save on the main process only (if {STATE}.is_main_process:): "
                    f"{name} is made by {made_by[0].name}, converted with this file, which hands "
                    "it the unwrapped model and has every rank wait after each call",
                )
            )
            reviews.append(
                Note(
                    at,
                    "the model's state is taken here on the main process alone: right under "
                    "DDP, but under FSDP or ZeRO-3 that state is sharded and gathering it needs "
                    "every rank",
                )
            )
        for printed in print_lines(statement) if saves else []:
            # the class runs on every rank (each call waited after): its prints would
            # show once per rank; beside a guarded save they share its ``if``
            plan.add(rewrites.main_process_only(printed, STATE))
            changes.append(
                Note(
                    model.line(printed),
                    f"print on the main process only (if {STATE}.is_main_process:): "
                    f"every rank calls {name}'s methods",
                )
            )
    if not changes:
        return None
    converted = model.module.visit(ApplyPlan(plan, model.position))
    return converted, changes, reviews, import_lines(options.target, ["PartialState"])


def print_lines(cls: cst.ClassDef) -> list[cst.SimpleStatementLine]:
    """The lines of ``cls``'s methods that are a bare ``print(...)`` of their own: the ones a
    module's conversion can put under a main-process test as they stand."""
    return [
        node
        for node in walk(cls)
        if isinstance(node, cst.SimpleStatementLine)
        and len(node.body) == 1
        and isinstance(node.body[0], cst.Expr)
        and isinstance(node.body[0].value, cst.Call)
        and isinstance(node.body[0].value.func, cst.Name)
        and node.body[0].value.func.value == "print"
    ]
