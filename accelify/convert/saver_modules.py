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
from accelify.analysis.script_model import ScriptModel
from accelify.convert import across, project
from accelify.convert.steps.context import Options, import_lines
from accelify.edits import rewrites
from accelify.edits.apply import ApplyPlan
from accelify.edits.plan import Note, Plan

#: The process state, reachable without an Accelerator: the object has none
STATE = "PartialState()"


def may_save_for_another_file(data: bytes, options: Options) -> bool:
    """A cheap test for a file without ``.backward(``, converted with others: a class of it may
    save a model's state dict (`guard_saves` reads it)."""
    return bool(options.converted_with) and b"class " in data and b".state_dict()" in data


def guard_saves(
    path: Path, model: ScriptModel, options: Options
) -> tuple[cst.Module, list[Note], list[Note], list[str]] | None:
    """The module with the saves of its saver classes under ``if
    PartialState().is_main_process:``, the changes and review lines, and the import lines to
    add; None where no training file of the folder converted in this run makes such a class."""
    if not options.converted_with or not path.is_file():
        return None
    drivers = [
        (file, read(file))
        for file in across.importers_of(path.resolve())
        if str(file) in options.converted_with
    ]
    # a file that already uses an Accelerator is left as it is: it would not wait after a call
    drivers = [
        (file, data)
        for file, data in drivers
        if b".backward(" in data and b"Accelerator" not in data
    ]
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
        saves = project.guarded_saves(model, statement) if made_by else None
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
    if not changes:
        return None
    converted = model.module.visit(ApplyPlan(plan))
    return converted, changes, reviews, import_lines(options.target, ["PartialState"])
