"""One script in, its distributed version and a summary out.

Data flows one way: bytes -> libcst module -> `ScriptModel` -> `Plan` -> new module -> bytes.
Nothing here writes files; `accelify.convert.files` does that for the CLI.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import libcst as cst

from accelify.analysis import names, project_modules
from accelify.analysis.base_inits import own_init
from accelify.analysis.facts import facts_of
from accelify.analysis.objects import bound_arguments
from accelify.analysis.script_model import Kind, ScriptModel, analyze
from accelify.analysis.side_effects import writes
from accelify.analysis.star_imports import star_imported_names
from accelify.analysis.syntax import dotted, is_docstring, walk
from accelify.convert import (
    across,
    handed_listeners,
    imported_helpers,
    project,
    saver_modules,
    subclass_inits,
)
from accelify.convert.handed_loaders import handed_loaders
from accelify.convert.import_prints import import_time_prints
from accelify.convert.planner import Options, plan_conversion
from accelify.convert.unread_devices import drop_unread_devices
from accelify.convert.waited_reads import waited_before
from accelify.convert.wrap_lines import wrap_long_lines
from accelify.edits.apply import ApplyPlan
from accelify.edits.plan import Note, statement
from accelify.errors import UserError
from accelify.source import parse, render, room_for_deep_trees

ALREADY_ACCELERATED = "already uses an Accelerator"
LEFT_AS_IS = "left as it is (the review line says why)"
#: left as it is for a subclass in another module that would lack the accelerator
#: (`subclass_inits`): a driver of this module says that reason
SUBCLASS_SKIPS_INIT = "left as it is: a subclass elsewhere skips its __init__ (the review says why)"


@dataclass
class Conversion:
    path: str
    original: bytes
    converted: bytes
    changes: list[Note] = field(default_factory=list)
    reviews: list[Note] = field(default_factory=list)
    prepared: list[str] = field(default_factory=list)
    skipped: str | None = None
    #: what the conversion did where it prepared nothing (a module whose saves it guards)
    done: str | None = None

    @property
    def changed(self) -> bool:
        return self.converted != self.original


@room_for_deep_trees
def convert_source(
    data: bytes, path: str | Path, options: Options | None = None, together: bool = True
) -> Conversion:
    """Convert one script's source; raises `UserError` for a file that does not parse.
    ``together``: a driver and its engine module converted in the same run are converted as
    one (`across`); False for that combined script itself."""
    label = str(path)
    module = parse(data, label)
    star_imported = star_imported_names(Path(path), module)
    model = analyze(module, star_imported=star_imported)
    if model.uses_accelerator:
        return Conversion(label, data, data, skipped=ALREADY_ACCELERATED)
    if together:
        both = _converted_together(data, Path(path), model, options or Options())
        if both is not None:
            return both
    if not model.trains:
        elsewhere = project.trained_elsewhere(path, model)
        if elsewhere:
            return _drives_another_file(data, label, module, model, elsewhere, options)
        guarded = _guarded_module(data, label, model, options or Options())
        if guarded is not None:
            return guarded
        return Conversion(label, data, data, skipped="no .backward() call: not a training script")
    returns = project.imported_returns(path, model)
    # DataLoaders a driver of the folder hands a class of this file (`handed_loaders`)
    handed = handed_loaders(Path(path), module) if model.classes else {}
    if returns or handed:  # DataLoaders made by the project's other modules: as made here
        model = analyze(module, imported_returns=returns, given=handed, star_imported=star_imported)
    siblings = project.sibling_calls(path, model)  # each sibling module analysed once
    evaluators = project.imported_evaluators(siblings)
    plan = plan_conversion(
        model,
        options or Options(),
        project.imported_writers(path, model, siblings),
        evaluators,
        project.imported_model_methods(path, siblings, evaluators),
        project.imported_state_savers(path, siblings),
        project.imported_loggers(siblings),
        project.imported_object_savers(path, siblings),
        imported_layer_members=project.imported_layer_members(path, siblings, model),
        imported_printers=project.imported_printers(path, model, siblings),
        imported_file_writers=project.imported_file_writers(path, model, siblings),
        imported_output_members=project.imported_output_members(siblings),
        imported_meters=project.imported_meters(siblings),
    )
    for line, text in import_time_prints(Path(path), data, model):
        plan.review(line, text)
    for line, text in project.folder_maker_reviews(path, model, siblings):
        plan.review(line, text)
    for line, text in handed_listeners.listener_reviews(
        Path(path), model, siblings, (options or Options()).converted_with
    ):
        plan.review(line, text)
    if plan.empty:
        # a plan of review lines only: the script was left as it is for the reason they give
        why = LEFT_AS_IS if plan.reviews else "nothing to convert"
        return Conversion(label, data, data, reviews=plan.reviews, skipped=why)
    converted = module.visit(ApplyPlan(plan, model.position if model.module is module else None))
    skipped_init = _subclass_skipping_init(Path(path), model, converted)
    if skipped_init is not None:  # the file is left as it is, with this line
        return Conversion(label, data, data, reviews=[skipped_init], skipped=SUBCLASS_SKIPS_INIT)
    for code in plan.imports:
        converted = _add_import(converted, code, Path(label))
    converted, changes = drop_unread_devices(converted, data, plan.changes)
    converted = wrap_long_lines(converted, data)
    rendered = render(converted, data)
    _check_parses(rendered, label, data)
    # helpers that read the global accelerator, imported by another file of the folder
    imported = imported_helpers.imported_readers(Path(path), module, converted, plan.accelerator)
    imported += _loaders_built_elsewhere(
        model, project.imported_loader_evaluators(path, siblings), plan.prepared
    )
    return Conversion(
        label,
        data,
        rendered,
        changes=sorted(changes, key=lambda n: n.line),
        reviews=sorted([*plan.reviews, *imported], key=lambda n: n.line),
        prepared=plan.prepared,
    )


def _loaders_built_elsewhere(
    model: ScriptModel, builders: dict[str, str], prepared: list[str]
) -> list[Note]:
    """A review line at each construction of a class of another module that builds the
    DataLoader it evaluates over (`project.imported_loader_evaluators`) and is handed what
    this conversion prepares (the model): that loader is not prepared."""
    notes = []
    for name, where in builders.items():
        for node in walk(model.module):
            if (
                isinstance(node, cst.Call)
                and dotted(node.func) == name
                and any(dotted(a.value) in prepared for a in node.args)
            ):
                notes.append(
                    Note(
                        model.line(node),
                        f"{name}() builds the DataLoader it evaluates over ({where}), which "
                        "is not prepared: every rank evaluates the whole set there (its "
                        "totals are the whole set's, the work is not shared); to share it, "
                        f"hand {name} the accelerator, prepare that loader where it is built "
                        "(accelerator.prepare(DataLoader(...))) and gather each batch's "
                        "predictions and labels with accelerator.gather_for_metrics",
                    )
                )
    return notes


def _subclass_skipping_init(path: Path, model: ScriptModel, converted: cst.Module) -> Note | None:
    """A subclass in another module of the folder that does not run the ``__init__`` of a
    class this conversion creates ``self.accelerator`` in (`subclass_inits`)."""
    if not path.is_file():
        return None
    lines = {
        cls.name.value: model.line(init)
        for cls in model.module.body
        if isinstance(cls, cst.ClassDef) and (init := own_init(cls)) is not None
    }
    return subclass_inits.skipped_in_other_modules(path, model.module, converted, lines)


def _converted_together(
    data: bytes, path: Path, model: ScriptModel, options: Options
) -> Conversion | None:
    """This file's part of the conversion of a driver and the engine module it trains
    through, converted as one script (`across`); None where they are not both converted in
    this run, or the pair is not one `across` handles (then each is converted as today)."""
    if not options.converted_with or not path.is_file():
        return None
    file = path.resolve()
    if model.trains:
        driver = across.driver_of_engine(file, model.module, options.converted_with)
        if driver is None or _engine_of_driver(driver) != file:
            return None  # the driver's own conversion would not pair them: both as today
        pair = across.Pair(driver, file, project_modules.read(driver), data)
    else:
        engine = _engine_of(file, model)
        if engine is None or str(engine) not in options.converted_with:
            return None
        pair = across.Pair(file, engine, data, project_modules.read(engine))
    # the engine's own conversion, where it prepares by itself: this file's, for the engine
    alone = _conversion_on_its_own(path if file == pair.engine else pair.engine, pair, options)
    if alone is not None:
        return alone if file == pair.engine else None
    split = across.combine_and_split(
        pair,
        lambda source, where, engine_from: convert_source(
            source, where, replace(options, foreign_from=engine_from), together=False
        ),
    )
    if split is None:
        return None
    label = str(path)
    prepared = split.driver[3]
    if file == pair.driver:
        converted, changes, reviews, _ = split.driver
        _check_parses(converted, label, data)
        reviews = [*reviews, *_sibling_prints(label, model, {pair.engine.resolve()})]
        return Conversion(
            label, data, converted, changes, reviews, [] if split.engine_creates else prepared
        )
    converted, changes, reviews = split.engine
    _check_parses(converted, label, data)
    driver = _relative_to(pair.driver, file)
    if split.engine_creates:
        told = Note(
            0,
            f"converted with {driver}, which builds what this file trains and hands it in: the "
            "Accelerator is created and what trains prepared here, where it is received",
        )
        return Conversion(label, data, converted, [told, *changes], reviews, prepared)
    told = Note(
        0,
        f"converted with {driver}, which creates the Accelerator, prepares what trains and "
        "hands the accelerator to these functions at each of its calls",
    )
    return Conversion(label, data, converted, [told, *changes], reviews)


def _engine_of_driver(driver: Path) -> Path | None:
    """The engine module the driver's own conversion pairs it with (the other side of the
    same decision: an engine converted with a driver that is not converted with it would
    leave the driver's prints, loads and loaders as if nothing had changed)."""
    try:
        module = parse(project_modules.read(driver), str(driver))
    except UserError:
        return None
    model = analyze(module)
    if model.trains or model.uses_accelerator:
        return None
    return _engine_of(driver, model)


def _engine_of(driver: Path, model: ScriptModel) -> Path | None:
    """The one engine module ``driver`` (resolved; ``model``: its analysis, a file with no
    backward of its own) trains through, as `across.pair_of_driver` pairs them."""
    elsewhere = project.trained_elsewhere(driver, model)
    return across.pair_of_driver(driver, {e.module.resolve() for e in elsewhere})


def _conversion_on_its_own(label: Path, pair: across.Pair, options: Options) -> Conversion | None:
    """The engine's conversion on its own (under ``label``), where the engine holds a class
    whose own conversion prepares what it trains (a trainer class that builds its model,
    optimizer and loaders): converted alone, its driver reaching ``trainer.accelerator``, as
    a module of functions never is; None otherwise (the pair is converted as one). The
    engine's run returns it as its conversion: what it would compute next anyway."""
    try:
        module = parse(pair.engine_data, str(label))
    except UserError:
        return None
    if not any(isinstance(s, cst.ClassDef) for s in module.body):
        return None
    alone = convert_source(pair.engine_data, label, options, together=False)
    return alone if alone.prepared else None


def _unpaired(
    label: str,
    model: ScriptModel,
    elsewhere: list[project.TrainedElsewhere],
    prepared: dict[Path, list[str]],
    options: Options,
) -> dict[int, str]:
    """Why this driver and each module it trains through that prepares nothing itself are not
    converted as one script (`across.unpaired_because`), by the line of the call."""
    placement = facts_of(model).placement
    found: dict[int, str] = {}
    for entry in elsewhere:
        if prepared.get(entry.module):
            continue
        try:
            engine = parse(project_modules.read(entry.module), str(entry.module))
        except UserError:
            found[entry.line] = f"{entry.module.name} does not parse"
            continue
        top = placement.enclosing_function(entry.call) is None
        found[entry.line] = across.unpaired_because(
            Path(label), entry.module, engine, top, options.converted_with
        )
    return found


def _relative_to(other: Path, file: Path) -> str:
    """``other`` as seen from ``file``'s folder (``../train.py`` for a module of a package)."""
    return os.path.relpath(other, file.parent)


def _drives_another_file(
    data: bytes,
    label: str,
    module: cst.Module,
    model: ScriptModel,
    elsewhere: list[project.TrainedElsewhere],
    options: Options | None,
) -> Conversion:
    """A file with no backward of its own that trains through another module of its folder
    (``trainer = Trainer(lr=0.1)`` of ``trainer.py``, then ``trainer.train_epoch()``). Where
    that module's own conversion creates the Accelerator and prepares what trains, nothing is
    to be prepared here, but this file's prints run on every rank: those after the instance
    is made go through the accelerator it holds (``trainer.accelerator.print``) when the
    other module is converted in the same run (else it would not hold one yet); the others
    get a review line. Where it does not, a review line says what to do by hand."""
    options = options or Options()
    there: dict[Path, _There] = {}
    for entry in elsewhere:
        if entry.module not in there:
            there[entry.module] = _there(entry.module, options)
    first = elsewhere[0]
    skipped = (
        f"no .backward() call in this file: it trains through {first.function}() of another "
        f"module (line {first.line})"
    )
    prepared = {file: state.prepared for file, state in there.items()}
    unpaired = _unpaired(label, model, elsewhere, prepared, options)
    for entry in elsewhere:
        left = there[entry.module].left
        if left is not None:  # its own conversion says why it is left as it is
            unpaired[entry.line] = f"{entry.module.name}: {left}"
    reviews = project.review_notes(label, elsewhere, prepared, unpaired)
    driven = [e for e in elsewhere if prepared[e.module]]
    if not driven:
        return Conversion(label, data, data, reviews=reviews, skipped=skipped)
    changes: list[Note] = []
    reach: tuple[str, cst.CSTNode] | None = None
    told = False
    for entry in driven:
        state = there[entry.module]
        found = project.instance_accelerator(model, entry, state.source)
        note = project.prepared_there_note(
            label, entry, state.prepared, found[0] if found else None, state.when
        )
        if state.when == "converted alone":
            reviews.append(note)  # the other file is not converted with this one: say so
            told |= found is not None  # and where this file's prints are to go
            continue
        reach = reach or found
        changes.append(note)
    prints = _builtin_prints(model)
    after = [p for p in prints if reach is not None and project.in_scope_below(model, p, reach[1])]
    for call in prints:
        if reach is not None and call in after:
            changes.append(
                Note(model.line(call), f"print -> {reach[0]}.print (local main process only)")
            )
        elif not told:
            reviews.append(Note(model.line(call), _PRINT_ON_EVERY_RANK))
    if not told:
        reviews += _sibling_prints(label, model, {e.module.resolve() for e in elsewhere})
    wrapped = {name for e in driven for name in there[e.module].prepared}
    models = {name for e in driven for name in _prepared_models(there[e.module])}
    saved = _saves_once(model, reach, wrapped, models)
    changes += [note for _, _, note in saved.values()]
    reviews += _writes_on_every_rank(model, reach, wrapped, skip=set(saved))
    barrier = None
    if reach is not None:
        writers = [there[e.module] for e in driven if there[e.module].when != "converted alone"]
        found_read = _read_back(model, reach, writers, own_saves=bool(saved))
        if found_read is not None and found_read[1] is None:
            reviews.append(
                Note(
                    model.line(found_read[0]),
                    "this read of a file may come before the module it trains through has "
                    "written it (that module writes its files on the main process only), and "
                    "a condition the ranks may disagree on holds it, so no barrier is placed "
                    f"here: call {reach[0]}.wait_for_everyone() where every rank runs it, "
                    "before this read",
                )
            )
        elif found_read is not None:
            barrier = found_read
    if barrier is not None:
        read = barrier[0]
        changes.append(
            Note(
                model.line(read),
                f"{reach[0]}.wait_for_everyone() before this read of a file: "  # type: ignore[index]
                + (
                    "this file's saves above now write on the main process only"
                    if saved
                    else "the module it trains through writes its files on the main process only"
                )
                + ", and the other ranks would read before it has written",
            )
        )
    changes.sort(key=lambda n: n.line)
    reviews.sort(key=lambda n: n.line)
    if reach is None or not (after or barrier or saved):
        return Conversion(label, data, data, changes=changes, reviews=reviews, skipped=skipped)
    wait = statement(f"{reach[0]}.wait_for_everyone()")
    replaced = {key: lines for key, (lines, _, _) in saved.items()}
    visitor = _PrintThrough(after, reach[0], barrier[1] if barrier else None, wait, replaced)
    converted = module.visit(visitor)
    if saved:  # the saves it writes are long lines (the prints are left as they were)
        converted = wrap_long_lines(converted, data)
    rendered = render(converted, data)
    _check_parses(rendered, label, data)
    return Conversion(label, data, rendered, changes=changes, reviews=reviews)


def _sibling_prints(label: str, model: ScriptModel, trained_through: set[Path]) -> list[Note]:
    """``test(model_name="LeNet5", device=device)`` after ``train(...)`` in a driver whose
    training module is converted: ``test()`` of a sibling module that trains nothing (so it is
    not converted) prints, and once the launcher runs this file on every rank, each of its
    lines shows once per process (HandwrittenDigitRecognition's ``common/test.py``). A
    review line at the call, as for this file's own prints; where it also loads a file
    (``torch.load``), the one the training module now saves on the main process only may not
    be written yet when another rank reads it."""
    notes: list[Note] = []
    for call, name, function, file, other in project.sibling_calls(label, model):
        if file.resolve() in trained_through:
            continue
        defined = next(
            (
                s
                for s in other.module.body
                if isinstance(s, cst.FunctionDef) and s.name.value == function
            ),
            None,
        )
        if defined is None:
            continue
        inside = {id(node) for node in walk(defined)}
        if not any(id(printed) in inside for printed in _builtin_prints(other)):
            continue
        loads = any(
            isinstance(node, cst.Call) and "torch.load" in other.qualified(node.func)
            for node in walk(defined)
        )
        notes.append(
            Note(
                model.line(call),
                f"{name}() ({_relative_to(file, Path(label))}, not converted: it trains nothing) "
                "prints on every rank "
                "once the file this one trains through is converted (each line printed once per "
                "process): print there only where int(os.environ.get('RANK', 0)) == 0"
                + (
                    "; it also loads a file the converted module may save on the main process "
                    "only: have every rank wait (accelify.PartialState().wait_for_everyone()) "
                    "before this call"
                    if loads
                    else ""
                ),
            )
        )
    return notes


def _writes_on_every_rank(
    model: ScriptModel,
    reach: tuple[str, cst.CSTNode] | None,
    wrapped: set[str] = frozenset(),  # type: ignore[assignment]
    skip: set[int] = frozenset(),  # type: ignore[assignment]
) -> list[Note]:
    """A line per statement of this file that writes a file (``torch.save(model.state_dict(),
    path)``): once the file it trains through is converted, every rank runs it and writes the
    same path. Said, not rewritten: this file is not converted itself. ``reach``: the
    accelerator the other file's instance holds, and the statement after which it exists.
    ``wrapped``: what the other file prepares (``self.model``); a write of the state dict of
    the instance's one (``stealer.model.state_dict()``) saves the DDP wrapper's keys, each
    prefixed ``module.``, which a plain model does not load: the line says to unwrap it."""
    notes = []
    for write in writes(model, facts_of(model).placement, with_torch_save=True):
        if model.under_rank_guard(write.call):
            continue  # written once already (``if int(os.environ.get("RANK", 0)) == 0:``)
        if id(project.own_line(model, write.call)) in skip:
            continue  # saved once through the accelerator (`_saves_once`)
        handed = _instance_parameter(model, write.call, reach)
        acc = None
        if reach is not None and project.in_scope_below(model, write.call, reach[1]):
            acc = reach[0]
        elif handed is not None:  # ``def checkpoint(tr, path)`` handed ``trainer``
            acc = f"{handed}.accelerator"
        if acc is not None:
            guard = f"after {acc}.wait_for_everyone(), under if {acc}.is_main_process:"
        else:
            guard = "on the process where int(os.environ.get('RANK', 0)) == 0, once all are done"
        text = (
            "this write runs on every rank once the file it trains through runs them all "
            f"(each process writes the same file, racing): write it once, {guard}"
        )
        held = _wrapped_state_saved(write.call, reach, wrapped, handed)
        if held is not None:
            acc = acc or reach[0]  # type: ignore[index]
            text += (
                f"; and {held} is the model that file prepares (on more than one process its "
                f"DDP wrapper): its state_dict() saves every key with a module. prefix, which "
                "the plain model does not load (load_state_dict raises Missing/Unexpected "
                f"key(s)): save {acc}.unwrap_model({held}).state_dict() instead of "
                f"{held}.state_dict()"
            )
        notes.append(Note(model.line(write.call), text))
    return notes


def _prepared_models(there: _There) -> list[str]:
    """What ``there``'s conversion prepares that is a model (``self.model``, not
    ``self.optimizer``): the names its converted source binds to a model."""
    if not there.prepared or not there.source:
        return []
    try:
        other = analyze(cst.parse_module(there.source))
    except cst.ParserSyntaxError:
        return []
    models = {binding.name for binding in other.of_kind(Kind.MODEL)}
    return [name for name in there.prepared if name in models]


def _saves_once(
    model: ScriptModel,
    reach: tuple[str, cst.CSTNode] | None,
    wrapped: set[str],
    models: set[str],
) -> dict[int, tuple[list[cst.BaseStatement], cst.Call, Note]]:
    """``torch.save(trainer.model.state_dict(), path)`` of a driver whose engine's conversion
    prepares ``self.model`` and holds the accelerator (``trainer.accelerator``): the same save
    the engine's own conversion writes, ``trainer.accelerator.wait_for_everyone()`` then
    ``trainer.accelerator.save(trainer.accelerator.get_state_dict(trainer.model), path)`` (once,
    on the main process, with the plain model's keys, not the DDP wrapper's ``module.``
    ones). By the id of the save's statement: its new lines, the call and the change line.
    Left to `_writes_on_every_rank`'s review line: a save whose statement is not a plain
    ``torch.save(obj, path)`` line, one a condition the ranks may disagree on holds or some
    ranks may not reach (the barrier would hang them), one of a prepared model itself
    (``torch.save(trainer.model, path)``: a pickled wrapper)."""
    if reach is None:
        return {}
    acc = reach[0]
    instance = acc.rpartition(".")[0]
    shared = facts_of(model).shared_files
    found: dict[int, tuple[list[cst.BaseStatement], cst.Call, Note]] = {}
    for write in writes(model, facts_of(model).placement, with_torch_save=True):
        call = write.call
        line = project.own_line(model, call)
        if (
            line is None
            or len(line.body) != 1
            or not isinstance(line.body[0], cst.Expr)
            or line.body[0].value is not call
            or not model.call_names(call) & names.TORCH_SAVE
            or model.under_rank_guard(call)
            or not project.in_scope_below(model, call, reach[1])
            or shared.divergent_around(call) is not None
            or shared.parting_before(call) is not None
        ):
            continue
        if len(call.args) != 2 or any(a.keyword or a.star for a in call.args):
            continue
        obj = _gathered_state(call.args[0].value, acc, instance, wrapped, models, model)
        if obj is None:
            continue
        path = cst.Module([]).code_for_node(call.args[1].value)
        lines = [
            statement(f"{acc}.wait_for_everyone()"),
            statement(f"{acc}.save({obj}, {path})").with_changes(leading_lines=[]),
        ]
        lines[0] = lines[0].with_changes(leading_lines=line.leading_lines)
        text = (
            f"torch.save -> {acc}.wait_for_everyone(), then {acc}.save (once, on the main "
            "process: every rank runs this line once the file it trains through is converted)"
        )
        if obj != cst.Module([]).code_for_node(call.args[0].value):
            text += f", of {acc}.get_state_dict() of the model that file prepares (plain keys)"
        found[id(line)] = (lines, call, Note(model.line(call), text))
    return found


def _gathered_state(
    obj: cst.BaseExpression,
    acc: str,
    instance: str,
    wrapped: set[str],
    models: set[str],
    model: ScriptModel | None = None,
) -> str | None:
    """``obj`` (what a driver saves) with each ``trainer.model.state_dict()`` of a model the
    engine prepares as ``{acc}.get_state_dict(trainer.model)``; None where it holds such a
    model otherwise (the wrapper itself) or a prepared object not known to be no model."""

    class _Gather(cst.CSTTransformer):
        def __init__(self) -> None:
            super().__init__()
            self.left = False

        def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
            receiver = _state_of_model(original)
            if receiver is None:
                return updated
            return cst.parse_expression(
                f"{acc}.get_state_dict({cst.Module([]).code_for_node(receiver)})"
            )

        def visit_Attribute(self, node: cst.Attribute) -> bool:
            if _held(node) in models:
                self.left = True  # not a receiver of .state_dict(): the wrapper itself
            return True

        def visit_Name(self, node: cst.Name) -> bool:
            if _alias(node) in models:
                self.left = True  # ``m = trainer.model``, then ``m`` saved: the wrapper itself
            return True

        def visit_Call(self, node: cst.Call) -> bool:
            # ``trainer.model.state_dict()`` is gathered whole: its receiver is no stray use
            return _state_of_model(node) is None

    def _state_of_model(call: cst.Call) -> cst.BaseExpression | None:
        func = call.func
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value == "state_dict"
            and not call.args
            and (_held(func.value) or _alias(func.value)) in models
        ):
            return func.value
        return None

    def _alias(node: cst.BaseExpression) -> str | None:
        """The engine's model a plain name of the driver is set to (``m = trainer.model``,
        review10a: ``m.state_dict()`` was saved with the wrapper's ``module.`` keys)."""
        if model is None or not isinstance(node, cst.Name):
            return None
        for _, value in model.index.values_set_to(node.value):
            if isinstance(value, cst.BaseExpression):
                held = _held(value)
                if held in models:
                    return held
        return None

    def _held(node: cst.BaseExpression) -> str | None:
        name = dotted(node)
        if not name or not name.startswith(instance + "."):
            return None
        attribute = f"self.{name[len(instance) + 1 :]}"
        return attribute if attribute in wrapped else None

    gather = _Gather()
    rebuilt = cst.ensure_type(obj.visit(gather), cst.BaseExpression)  # type: ignore[arg-type]
    if gather.left:
        return None
    return cst.Module([]).code_for_node(rebuilt)


def _instance_parameter(
    model: ScriptModel, node: cst.CSTNode, reach: tuple[str, cst.CSTNode] | None
) -> str | None:
    """``tr`` for ``node`` in ``def checkpoint(tr, path)`` where every call of the file that
    binds ``tr`` hands it the instance ``reach`` names (``checkpoint(trainer, p)``): there
    ``tr.model`` is the instance's prepared model and ``tr.accelerator`` its accelerator."""
    if reach is None:
        return None
    instance = reach[0].rpartition(".")[0]
    function = facts_of(model).placement.enclosing_function(node)
    if function is None:
        return None
    found: set[str] = set()
    for call, implicit in model.call_graph.calls_of(function):
        for parameter, argument in bound_arguments(function, call, implicit):
            if dotted(argument.value) == instance:
                found.add(parameter)
    for call, implicit in model.call_graph.calls_of(function):
        for parameter, argument in bound_arguments(function, call, implicit):
            if parameter in found and dotted(argument.value) != instance:
                found.discard(parameter)
    return next(iter(found)) if len(found) == 1 else None


def _wrapped_state_saved(
    call: cst.Call,
    reach: tuple[str, cst.CSTNode] | None,
    wrapped: set[str],
    handed: str | None = None,
) -> str | None:
    """``stealer.model`` of ``stealer.model.state_dict()`` inside ``call`` (a write), where
    ``stealer.accelerator`` is ``reach``'s accelerator and the other file prepares
    ``self.model``; ``handed``: the name of the instance in the write's own function (a
    parameter handed it, `_instance_parameter`)."""
    if reach is None:
        return None
    instance = handed or reach[0].rpartition(".")[0]
    for node in walk(call):
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "state_dict"
        ):
            held = dotted(node.func.value)
            attribute = held[len(instance) + 1 :] if held else ""
            if held and held.startswith(instance + ".") and f"self.{attribute}" in wrapped:
                return held
    return None


_PRINT_ON_EVERY_RANK = (
    "this print runs on every rank once the file it trains through is converted (each line "
    "printed once per process), and no accelerator is reachable here: print only where "
    "int(os.environ.get('RANK', 0)) == 0, or through the Accelerator that file creates"
)


@dataclass
class _There:
    """The module a file trains through: what its own conversion prepares and its source once
    converted; ``when`` says whether it is converted in this run, alone (not in this run), or
    was already (it uses an Accelerator: what it prepares itself, and its own source).
    Nothing prepared: it is not converted on its own (a module of helpers handed everything,
    one that already uses an Accelerator)."""

    prepared: list[str]
    source: bytes
    when: str
    #: why its own conversion leaves it as it is (its review line), when it does
    left: str | None = None


def _there(file: Path, options: Options) -> _There:
    try:
        data = file.read_bytes()
        conversion = convert_source(data, file, options)
    except (OSError, UserError):
        return _There([], b"", "")
    if conversion.skipped == SUBCLASS_SKIPS_INIT and conversion.reviews:
        return _There([], b"", "", left=conversion.reviews[0].text)
    if conversion.skipped == ALREADY_ACCELERATED:  # converted by hand, or by an earlier run
        return _There(project.prepared_by_hand(data, str(file)), data, "already converted")
    if conversion.skipped or not conversion.prepared:
        return _There([], b"", "")
    converting = str(file.resolve()) in options.converted_with
    return _There(
        conversion.prepared, conversion.converted, "converted" if converting else "converted alone"
    )


def _builtin_prints(model: ScriptModel) -> list[cst.Call]:
    """The file's calls of the builtin ``print`` (none where the file binds or imports the
    name)."""
    if model.index.values_bound_to("print") or model.imports.resolve("print") is not None:
        return []
    return [
        node
        for node in walk(model.module)
        if isinstance(node, cst.Call)
        and isinstance(node.func, cst.Name)
        and node.func.value == "print"
    ]


def _read_back(
    model: ScriptModel,
    reach: tuple[str, cst.CSTNode],
    writers: list[_There],
    own_saves: bool = False,
) -> tuple[cst.Call, cst.CSTNode | None] | None:
    """The first read of a file (``torch.load(f"{out}/best.pt")``) that every rank runs below
    the statement that makes the trainer (``reach``, with the accelerator the trainer holds),
    in its scope, where a module this file trains through writes files on the main process
    only (``accelerator.save`` of its best checkpoint): the paths are spelled in two modules,
    so any such read may be of what was written; a barrier costs one wait. With the read's own
    statement in its innermost block, where the barrier goes (in ``for r in ...: trainer.fit();
    torch.load(...)`` each round's read waits for that round's write), or None there when a
    condition the ranks may disagree on holds the read (a barrier there would hang the ranks
    that skip it: said, not placed). None where nothing is read back, or where a barrier on
    that accelerator already stands before the read (`waited_before`: a driver converted
    already, which must convert to itself). ``own_saves``: this file's own saves were moved
    onto the main process (`_saves_once`), so its reads wait for them alike."""
    if not own_saves and not any(_writes_on_one_rank(there.source) for there in writers):
        return None
    acc, bound = reach
    shared = facts_of(model).shared_files
    for read, _ in sorted(shared.file_reads(), key=lambda pair: model.order(pair[0])):
        if not project.in_scope_below(model, read, bound) or model.under_rank_guard(read):
            continue
        own = next(
            a
            for a in [read, *model.ancestors(read)]
            if isinstance(model.parent(a), (cst.Module, cst.IndentedBlock))
        )
        if waited_before(model, own, acc):
            return None
        if shared.divergent_around(read) is not None or shared.parting_before(read) is not None:
            return read, None
        return read, own
    return None


def _writes_on_one_rank(source: bytes) -> bool:
    try:
        other = analyze(cst.parse_module(source))
    except cst.ParserSyntaxError:
        return False
    return bool(facts_of(other).shared_files.written_on_one_rank)


class _PrintThrough(cst.CSTTransformer):
    """``print(...)`` -> ``trainer.accelerator.print(...)`` for the given calls; ``wait``
    (``trainer.accelerator.wait_for_everyone()``) above the statement ``before``."""

    def __init__(
        self,
        calls: list[cst.Call],
        accelerator: str,
        before: cst.CSTNode | None = None,
        wait: cst.BaseStatement | None = None,
        replaced: dict[int, list[cst.BaseStatement]] | None = None,
    ) -> None:
        super().__init__()
        self.calls = {id(c) for c in calls}
        self.func = cst.parse_expression(f"{accelerator}.print")
        self.ahead_of, self.wait = before, wait
        self.replaced = replaced or {}

    def _with_wait(self, original: Any, updated: Any) -> Any:
        body: list[Any] = []
        for line, new in zip(original.body, updated.body, strict=True):
            if line is self.ahead_of and self.wait is not None:
                body.append(self.wait)
            body.extend(self.replaced.get(id(line), [new]))
        return updated.with_changes(body=body)

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        return self._with_wait(original, updated)

    def leave_IndentedBlock(
        self, original: cst.IndentedBlock, updated: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        return self._with_wait(original, updated)

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if id(original) in self.calls:
            return updated.with_changes(func=self.func)
        return updated


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


def printing_module(data: bytes, path: Path, options: Options) -> Conversion | None:
    """A file that neither trains nor may save for another (`files.convert_file` skips those
    unread), read only for the prints of the classes a trainer converted in this run is handed
    (`handed_listeners.guard_prints`); None where it has none. Raises `UserError` for a file
    that does not parse."""
    model = analyze(parse(data, str(path)))
    if model.uses_accelerator or model.trains:
        return None
    return _guarded_module(data, str(path), model, options, saves=False)


def _guarded_module(
    data: bytes, label: str, model: ScriptModel, options: Options, saves: bool = True
) -> Conversion | None:
    """A module that trains nothing, its saves (`saver_modules.guard_saves`) or else the prints
    of its handed listeners (`handed_listeners.guard_prints`) put on the main process; None
    where it has neither."""
    guarded = saver_modules.guard_saves(Path(label), model, options) if saves else None
    if guarded is not None:
        converted, changes, reviews, imports = guarded
    else:
        printing = handed_listeners.guard_prints(Path(label), model, options)
        if printing is None:
            return None
        (converted, changes, imports), reviews = printing, []
    for code in imports:
        converted = _add_import(converted, code, Path(label))
    rendered = render(converted, data)
    _check_parses(rendered, label, data)
    done = f"nothing to prepare here; {_saves_and_prints(changes)} put on the main process only"
    return Conversion(label, data, rendered, changes=changes, reviews=reviews, done=done)


def _saves_and_prints(changes: list[Note]) -> str:
    """``1 torch.save and 1 print``: what a saver module's conversion put under the main
    process (`saver_modules.guard_saves`: one change line each)."""
    prints = sum(note.text.startswith("print ") for note in changes)
    saves = len(changes) - prints
    said = ["1 torch.save" if saves == 1 else f"{saves} torch.save calls"] if saves else []
    if prints:
        said.append("1 print" if prints == 1 else f"{prints} prints")
    return " and ".join(said)
