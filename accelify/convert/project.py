"""Training that runs in another file of the project: ``train.py`` makes the model, optimizer and
loaders and calls ``train_one_epoch(...)`` from its sibling ``engine.py``, where the
``.backward()`` is. The conversion reads one file at a time: it converts neither file for
this (``engine.py`` gets its own review line, `planner._trains_only_for_other_files`). The
entry script is not "not a training script": it gets a review line at each such call naming
the file and line of the backward it reaches, and what to do there."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from accelify.analysis import collectives, side_effects
from accelify.analysis.facts import facts_of
from accelify.analysis.idle_members import OutputMembers, members_behind_outputs
from accelify.analysis.imported_returns import Returned, returned_by_project
from accelify.analysis.loss_sources import backwards
from accelify.analysis.names import DATALOADERS, MAKEDIRS, MODULE_API, TORCH_SAVE
from accelify.analysis.outside_forward import layer_members
from accelify.analysis.project_modules import (
    defining_module,
    imported_files,
    module_file,
    read,
    resolved,
)
from accelify.analysis.script_model import ScriptModel, analyze
from accelify.analysis.shard_totals import accumulating_classes
from accelify.analysis.syntax import dotted, is_main_guard, target_names, walk
from accelify.analysis.writing_helpers import (
    module_state,
    prints_only,
    saves_only,
    writes_only,
)
from accelify.edits.plan import Note
from accelify.errors import UserError
from accelify.source import parse

#: A call of a function imported from a module of the file's own folder: the call, its name
#: there (``utils.write_log``), the function's name in the module, the module's file and its
#: analysis (`sibling_calls`)
SiblingCall = tuple[cst.Call, str, str, Path, ScriptModel]


@dataclass(frozen=True)
class TrainedElsewhere:
    """A call of this file that runs a backward of a sibling module."""

    line: int  # of the call
    function: str  # as the call names it
    module: Path
    backward_line: int
    call: cst.Call
    defined: str  # the function's or class's name in ``module``


def may_train_elsewhere(path: Path, data: bytes) -> bool:
    """A cheap test for a file without ``.backward(``: it imports a module of the project
    whose source has one, itself or through a package that re-exports its functions
    (``from wann.utils import run_epoch`` of ``wann/utils/trainer.py``), or through the
    modules those import (a subclass in ``small.py`` of a base class of ``base.py`` that
    trains), three imports deep."""
    seen: set[Path] = set()
    todo = [(path, data, 0)]
    while todo:
        file, text, depth = todo.pop()
        for found in imported_files(file, text).values():
            if found in seen:
                continue
            seen.add(found)
            source = read(found)
            if b".backward(" in source:
                return True
            if depth < 2:
                todo.append((found, source, depth + 1))
    return False


def trained_elsewhere(path: str | Path, model: ScriptModel) -> list[TrainedElsewhere]:
    """Calls of ``model`` (a file with no backward of its own) of functions imported from a
    module of its own folder that run a backward there, directly or through the functions of
    that module they call."""
    found = []
    for call, name, function, file, other in _sibling_calls(Path(path), model):
        reached = _backward_of_class_or_bases(file, other, function)
        if reached is not None:
            there, defined, backward = reached
            found.append(TrainedElsewhere(model.line(call), name, there, backward, call, defined))
    return found + _subclasses_trained_elsewhere(Path(path), model)


def _subclasses_trained_elsewhere(script: Path, model: ScriptModel) -> list[TrainedElsewhere]:
    """The constructions of the file's own classes whose base class, imported from a module
    of the project, runs the backward (``class ClassifierTrainer(BaseTrainer)`` that only says
    how a batch makes its loss, the loop in ``BaseTrainer`` of ``base.py``): each trains there,
    as a call of that module's class would."""
    if not script.is_file():
        return []
    found = []
    for cls in model.module.body:
        if not isinstance(cls, cst.ClassDef) or not cls.bases:
            continue
        reached = _backward_of_class_or_bases(script, model, cls.name.value)
        if reached is None:
            continue
        there, defined, backward = reached
        for call in model.index.calls_named(cls.name.value):
            found.append(
                TrainedElsewhere(model.line(call), cls.name.value, there, backward, call, defined)
            )
    return found


def _backward_of_class_or_bases(
    file: Path, other: ScriptModel, function: str, depth: int = 0
) -> tuple[Path, str, int] | None:
    """Where the backward ``function`` of ``other`` (the module ``file``) runs is, as the file,
    the function's or class's name there and the backward's line: in ``other`` itself, or, for
    a class, in a base class it imports from another module of the project (``class
    SmallStealer(Model)`` whose ``Model.train()`` of ``model.py`` trains: the driver that builds
    a ``SmallStealer`` trains there; or a base class of ``file`` itself), three bases deep at
    most."""
    backward = _backward_reached(other, function)
    if backward is not None:
        return file, function, backward
    if depth == 3:
        return None
    defined = next(
        (s for s in other.module.body if isinstance(s, cst.ClassDef) and s.name.value == function),
        None,
    )
    for base in defined.bases if defined is not None else ():
        name = dotted(base.value)
        if name and any(
            isinstance(s, cst.ClassDef) and s.name.value == name for s in other.module.body
        ):  # a base class of the same module (``class ClassifierTrainer(BaseTrainer)``)
            reached = _backward_of_class_or_bases(file, other, name, depth + 1)
            if reached is not None:
                return reached
            continue
        sibling = _sibling_definition(file, other, name)
        if sibling is not None:
            found, member, analysed = sibling
            reached = _backward_of_class_or_bases(found, analysed, member, depth + 1)
            if reached is not None:
                return reached
    return None


def imported_writers(
    path: str | Path, model: ScriptModel, siblings: list[SiblingCall] | None = None
) -> dict[str, str]:
    """Names this file calls (``dump_results``, ``utils.write_log``) that are functions of a
    module of its own folder which write files and do nothing else another rank needs
    (`writing_helpers.writes_only`), with where they are (``utils.py:12``). ``siblings``: the
    file's `sibling_calls`, where the caller has them already."""

    def write_only(other: ScriptModel, function: str) -> int | None:
        facts = facts_of(other)
        return writes_only(other, facts.placement, facts.calls, facts.flow, function)

    return _sibling_functions(path, model, siblings, write_only)


def imported_printers(
    path: str | Path, model: ScriptModel, siblings: list[SiblingCall] | None = None
) -> dict[str, str]:
    """Names this file calls (``progress_bar``, ``utils.log``) that are functions of a module of
    its own folder which only show text on the terminal (`writing_helpers.prints_only`), with
    where they are (``utils.py:12``): run on every rank, each line would show N times."""

    def print_only(other: ScriptModel, function: str) -> int | None:
        facts = facts_of(other)
        defined = _top_level_function(other, function)
        state = module_state(other, defined) if defined is not None else None
        if state and any(_mentions(model, name) for name in state):
            return None  # this file reads the counter the helper keeps: every rank keeps it
        return prints_only(other, facts.placement, facts.calls, facts.flow, function)

    return _sibling_functions(path, model, siblings, print_only)


def _mentions(model: ScriptModel, name: str) -> bool:
    """``_state`` or ``utils._state`` anywhere in ``model``."""
    return any(
        (isinstance(n, cst.Name) and n.value == name)
        or (isinstance(n, cst.Attribute) and n.attr.value == name)
        for n in walk(model.module)
    )


def imported_file_writers(
    path: str | Path, model: ScriptModel, siblings: list[SiblingCall] | None = None
) -> dict[str, str]:
    """Names this file calls (``generate_new_image``) that are functions of a module of its own
    folder whose body writes a file itself (``torch.save``, a file opened for writing, any
    write `side_effects` knows), with where the first write is (``utils.py:12``): whatever
    else they do, every rank that calls one writes that file."""

    def first_write(other: ScriptModel, function: str) -> int | None:
        defined = _top_level_function(other, function)
        if defined is None or any(
            isinstance(node, cst.Call) and other.call_names(node) & collectives.FUNCTIONS
            for node in walk(defined.body)
        ):
            return None  # one that meets the other ranks cannot run on the main process alone
        write = next(
            (
                node
                for node in walk(defined.body)
                if isinstance(node, cst.Call)
                and (side_effects.opens_for_writing(node) or side_effects.once_per_run(other, node))
                and not other.call_names(node) & {"builtins.input"}
            ),
            None,
        )
        return None if write is None else other.line(write)

    return _sibling_functions(path, model, siblings, first_write)


def folder_maker_reviews(
    path: str | Path, model: ScriptModel, siblings: list[SiblingCall]
) -> list[tuple[int, str]]:
    """Calls this file makes on every rank (``out = make_run_dir(args.out)``) of a function of a
    module of its own folder that makes a folder every rank would race on: ``os.mkdir(d)``
    without ``exist_ok`` (bare, or after ``if not os.path.exists(d):``, which two ranks pass at
    once: ``FileExistsError`` on the second), or one named from the clock (each rank its own
    name). That module is not converted with this file: the call is reviewed, naming where."""
    script, ranks = Path(path), facts_of(model).ranks
    found = []
    for call, name, function, file, other in siblings:
        made = _made_folder(other, function)
        if made is None or ranks.under_rank_guard(call):
            continue
        line, racing, clock = made
        where = f"{_relative(file, script)}:{line}"
        why = (
            ["two ranks may both find it missing, and the second's mkdir fails (FileExistsError)"]
            if racing
            else []
        )
        if clock is not None:
            why.append(
                f"its name comes from {clock}(), which each rank reads itself: ranks a "
                "second apart make two folders and each gets back its own"
            )
        fix = ["create it with exist_ok=True there"] if racing else []
        if clock is not None:
            fix.append(
                "make the name once on the main process and hand it to every rank "
                "(broadcast_object_list([name])[0])"
            )
        found.append(
            (
                model.line(call),
                f"{name}() makes a folder ({where}) on every rank: {'; '.join(why)}; left as is: "
                f"{', and '.join(fix)}",
            )
        )
    return found


def _made_folder(other: ScriptModel, function: str) -> tuple[int, bool, str | None] | None:
    """The line of the folder ``function`` of ``other`` makes, whether ranks race on it (no
    ``exist_ok``), and the clock call its name comes from; None when it makes none of those."""
    defined = _top_level_function(other, function)
    if defined is None:
        return None
    facts = facts_of(other)
    inside = facts.placement.inside
    races = [r.call for r in side_effects.makedirs_races(other, facts.placement)]
    clocks = dict(
        (id(made), source) for made, source in side_effects.folders_named_by_the_clock(other, facts)
    )
    for call in other.calls:
        if not inside(call, defined) or not other.call_names(call) & MAKEDIRS:
            continue
        racing = any(call is r for r in races)
        source = clocks.get(id(call))
        if racing or source is not None:
            clock = None if source is None else other.module.code_for_node(source.func)
            return other.line(call), racing, clock
    return None


def _sibling_functions(
    path: str | Path,
    model: ScriptModel,
    siblings: list[SiblingCall] | None,
    line_of: Callable[[ScriptModel, str], int | None],
) -> dict[str, str]:
    """Each name this file calls of a function of a module of its own folder for which
    ``line_of`` (given that module and the function's name) names a line, with where that is
    (``utils.py:12``)."""
    script = Path(path)
    found: dict[str, str] = {}
    calls = siblings if siblings is not None else _sibling_calls(script, model)
    for _, name, function, file, other in calls:
        if name in found:
            continue
        line = line_of(other, function)
        if line is not None:
            found[name] = f"{_relative(file, script)}:{line}"
    return found


def sibling_calls(path: str | Path, model: ScriptModel) -> list[SiblingCall]:
    """`_sibling_calls`, kept: the conversion asks about the same calls four times (writers,
    evaluators, their model methods, state savers), each sibling module analysed once for all."""
    return list(_sibling_calls(Path(path), model))


def _top_level_function(module: ScriptModel, name: str) -> cst.FunctionDef | None:
    """The function a module defines at its top level under ``name``."""
    return next(
        (s for s in module.module.body if isinstance(s, cst.FunctionDef) and s.name.value == name),
        None,
    )


def _sibling_calls(script: Path, model: ScriptModel) -> Iterator[SiblingCall]:
    """The calls of ``model`` (the file ``script``) of functions imported from a module of its
    own folder that parses: each call, its name there (``utils.write_log``), the function's
    name in the module, the module's file and its analysis. Each module is looked up on disk
    and analysed once."""
    if not script.is_file():
        return
    modules: dict[Path, ScriptModel | None] = {}
    files: dict[str, Path | None] = {}
    for node in walk(model.module):
        if not isinstance(node, cst.Call):
            continue
        name = dotted(node.func)
        imported = model.imports.resolve(name) if name else None
        if name is None or imported is None or "." not in imported.lstrip("."):
            continue
        module_name, _, function = imported.rpartition(".")
        if module_name not in files:  # one look on disk per module
            files[module_name] = module_file(script, module_name)
        file = files[module_name]
        if file is None:
            continue
        # a package's ``__init__.py`` that only re-exports it: the module that defines it
        file, function = defining_module(file, function)
        if file not in modules:
            modules[file] = _analyzed(file)
        other = modules[file]
        if other is not None:
            yield node, name, function, file, other


def imported_meters(siblings: list[SiblingCall]) -> dict[str, cst.ClassDef]:
    """Names this file calls (``AverageMeter``, ``utils.AverageMeter``) that make an instance of
    a meter class of a module of its own folder (`shard_totals.accumulating_classes`: its
    ``update`` adds into its own attributes), with that class: the ImageNet example's meters of
    ``utils.py``, which a training loop fills with its rank's batches only once sharded."""
    found = {}
    for _, name, member, _, other in siblings:
        kind = accumulating_classes(other.module).get(member)
        if kind is not None:
            found[name] = kind
    return found


def imported_evaluators(siblings: list[SiblingCall]) -> set[str]:
    """Names this file calls (``test``, ``engine.evaluate``) that are top-level functions of a
    module of its own folder which run no backward, neither in their body nor in the functions
    of that module they call (`_backward_reached`), and step nothing (no ``.step()`` call in
    their body): whatever they are handed, an optimizer among it, they only evaluate."""
    found = set()
    for _, name, function, _, other in siblings:
        defined = _top_level_function(other, function)
        if defined is None or _backward_reached(other, function) is not None:
            continue
        steps = any(
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "step"
            for node in walk(defined)
        )
        if not steps:
            found.add(name)
    return found


def imported_model_methods(
    path: str | Path, siblings: list[SiblingCall], evaluators: set[str]
) -> dict[str, str]:
    """Names this file calls of functions of a module of its own folder that run no backward
    (``evaluators``: `imported_evaluators`) and call a method of the model they are handed
    besides its forward and ``nn.Module``'s own (``model.loss(...)`` beside ``model(x)``), with
    the first such call and where it is (``model.loss() at test.py:16``): a prepared model
    reaches them as the DDP wrapper, which has no such attribute."""
    script = Path(path)
    found: dict[str, str] = {}
    for _, name, function, file, other in siblings:
        if name not in evaluators or name in found:
            continue
        defined = _top_level_function(other, function)
        if defined is None:
            continue
        forwarded = {
            node.func.value
            for node in walk(defined)
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Name)
        }
        for node in walk(defined):
            if (
                isinstance(node, cst.Call)
                and isinstance(node.func, cst.Attribute)
                and isinstance(node.func.value, cst.Name)
                and node.func.value.value in forwarded
                and node.func.attr.value not in MODULE_API
                and not node.func.attr.value.startswith("_")
            ):
                method = f"{node.func.value.value}.{node.func.attr.value}()"
                found[name] = f"{method} at {_relative(file, script)}:{other.line(node)}"
                break
    return found


def imported_loader_evaluators(path: str | Path, siblings: list[SiblingCall]) -> dict[str, str]:
    """Names this file calls (``Evaluator``) of classes of a module of its own folder that run
    no backward and build a DataLoader of their own that they loop over (``self.loader =
    DataLoader(dataset)`` in ``__init__``, ``for x, y in self.loader`` in a method), with
    where the loader is built (``evaluator.py:8``): the conversion of this file prepares what
    it makes, not that loader, so every rank evaluates the whole set there."""
    script = Path(path)
    found: dict[str, str] = {}
    for _, name, defined, file, other in siblings:
        cls = saver_class(other, defined)
        if name in found or cls is None or _backward_reached(other, defined) is not None:
            continue
        built = _loader_built_and_iterated(other, cls)
        if built is not None:
            found[name] = f"{_relative(file, script)}:{other.line(built)}"
    return found


def _loader_built_and_iterated(module: ScriptModel, cls: cst.ClassDef) -> cst.Call | None:
    """The ``DataLoader(...)`` call of ``cls`` bound to a name or attribute that a ``for`` loop
    of the class iterates (``for x, y in self.loader``, or ``tqdm(self.loader)``)."""
    made: dict[str, cst.Call] = {}
    for node in walk(cls):
        if (
            isinstance(node, cst.Assign)
            and len(node.targets) == 1
            and isinstance(node.value, cst.Call)
            and module.call_names(node.value) & DATALOADERS
            and (target := dotted(node.targets[0].target)) is not None
        ):
            made[target] = node.value
    for node in walk(cls):
        if isinstance(node, cst.For):
            for inner in walk(node.iter):
                shown = dotted(inner) if isinstance(inner, (cst.Name, cst.Attribute)) else None
                if shown in made:
                    return made[shown]
    return None


def imported_layer_members(
    path: str | Path, siblings: list[SiblingCall], model: ScriptModel | None = None
) -> dict[str, str]:
    """Members that run a model's layers (`outside_forward.layer_members`) of the module classes
    this file builds from a module of its own folder (``model = Classifier()`` with
    ``from litbase import Classifier``), or names as the type of a parameter (KDD-NPA's
    ``def train(model: NPAModel, ...)``, the model built by the driver), with where each is
    defined (``litbase.py:33``): a ``module.training_step(batch, i)`` whose body runs
    ``self(x)`` there bypasses the prepared model's forward wherever this file calls it."""
    script = Path(path)
    found: dict[str, str] = {}
    seen: set[tuple[Path, str]] = set()
    classes = [(defined, file, other) for _, _, defined, file, other in siblings]
    if model is not None:
        classes += _annotated_classes(script, model)
    for defined, file, other in classes:
        if (file, defined) in seen or defined not in other.module_classes:
            continue
        seen.add((file, defined))
        for member, node in layer_members(other, defined).items():
            found.setdefault(member, f"{_relative(file, script)}:{other.line(node)}")
    return found


def _annotated_classes(script: Path, model: ScriptModel) -> list[tuple[str, Path, ScriptModel]]:
    """The classes of modules of this file's folder that a parameter of its functions is
    annotated with (``model: NPAModel`` with ``from model import NPAModel``): the class's
    name there, its module's file and that module's analysis."""
    found: list[tuple[str, Path, ScriptModel]] = []
    if not script.is_file():
        return found
    for node in walk(model.module):
        if not isinstance(node, cst.Param) or node.annotation is None:
            continue
        defined = _sibling_definition(script, model, dotted(node.annotation.annotation))
        if defined is not None:
            file, name, other = defined
            found.append((name, file, other))
    return found


def _sibling_definition(
    file: Path, model: ScriptModel, name: str | None
) -> tuple[Path, str, ScriptModel] | None:
    """Where a name this file imports from a module of its project is defined (following
    re-exports, `defining_module`): that module's file, the name there and its analysis; None
    for a name not imported, imported from outside the project, or a module that does not
    parse."""
    imported = model.imports.resolve(name) if name else None
    if imported is None or "." not in imported.lstrip("."):
        return None
    module_name, _, member = imported.rpartition(".")
    found = module_file(file, module_name)
    if found is None:
        return None
    found, member = defining_module(found, member)
    analysed = _analyzed(found)
    return None if analysed is None else (found, member, analysed)


def imported_output_members(siblings: list[SiblingCall]) -> dict[str, OutputMembers]:
    """For the model classes this file builds from a module of its own folder (``model =
    CharGRU(...)`` with ``from model import CharGRU``), by the name calls use, what each output
    their forward returns is computed with (`idle_members.members_behind_outputs`): a training
    call that drops one (``logits, _ = model(x)``) leaves without a gradient only the layers no
    kept output needs."""
    found: dict[str, OutputMembers] = {}
    for _, name, defined, _, other in siblings:
        if name not in found and defined in other.module_classes:
            found[name] = members_behind_outputs(other, defined)
    return found


def imported_loggers(siblings: list[SiblingCall]) -> set[str]:
    """Names this file calls (``get_logger``, ``tools.logger.get_logger``) that are top-level
    functions of a module of the project which return a logger of the ``logging`` module (their
    body calls ``logging.getLogger``): what a name bound to their result logs goes through
    ``logging`` as surely as ``logging.getLogger(...)`` made here (a model-stealing project's
    ``self.logger = get_logger("Model " + self.name)`` of its ``tools/logger.py``)."""
    found: set[str] = set()
    for _, name, function, _, other in siblings:
        defined = _top_level_function(other, function)
        if defined is None or name in found:
            continue
        if _returns_a_logger(other, defined):
            found.add(name)
    return found


def _returns_a_logger(other: ScriptModel, defined: cst.FunctionDef) -> bool:
    """Every ``return`` of ``defined`` hands back what ``logging.getLogger(...)`` made: the call
    itself, or a name bound to it once and to nothing else. A factory that only configures a
    ``logging`` logger and returns an object of its own (a printer) logs nothing through
    ``logging``: guarding ``logging`` would leave its lines on every rank."""

    def made_by_get_logger(value: cst.BaseExpression | None) -> bool:
        return isinstance(value, cst.Call) and "logging.getLogger" in other.qualified(value.func)

    bound: dict[str, list[cst.BaseExpression | None]] = {}
    for node in walk(defined):
        if isinstance(node, (cst.Assign, cst.AnnAssign, cst.AugAssign, cst.For, cst.With)):
            value = getattr(node, "value", None)
            for target in _bound_names(node):
                bound.setdefault(target, []).append(value)
    returns = [node for node in walk(defined) if isinstance(node, cst.Return)]
    if not returns:
        return False
    for node in returns:
        value = node.value
        if made_by_get_logger(value):
            continue
        if not isinstance(value, cst.Name):
            return False
        values = bound.get(value.value, [])
        if len(values) != 1 or not made_by_get_logger(values[0]):
            return False
    return True


def _bound_names(node: cst.CSTNode) -> list[str]:
    """The plain names an assignment, ``for`` or ``with`` binds (unpacked)."""
    if isinstance(node, cst.Assign):
        tops = [t.target for t in node.targets]
    elif isinstance(node, (cst.AnnAssign, cst.AugAssign, cst.For)):
        tops = [node.target]
    elif isinstance(node, cst.With):
        tops = [item.asname.name for item in node.items if item.asname is not None]
    else:
        tops = []
    return [name for top in tops for name in target_names(top)]


@dataclass(frozen=True)
class StateSaver:
    """A function of a sibling module that saves the state dict of a model it is handed
    (``def save_checkpoint(path, model, opt): torch.save({"model": model.state_dict()}, path)``):
    handed a prepared model, it saves the DDP wrapper's keys, each prefixed ``module.``, which
    no plain model loads back."""

    parameters: tuple[str, ...]  # positional, in order
    saved: frozenset[str]  # the parameters whose ``.state_dict()`` it saves
    where: str  # ``utils.py:4``: the save
    #: it does nothing else another rank needs (`writing_helpers.saves_only`): each call may
    #: run on the main process alone, between two barriers
    guardable: bool = True
    #: the parameters it saves as they are (``torch.save(state, path)``): the state in them is
    #: taken at the call, by the caller
    whole: frozenset[str] = frozenset()


def imported_state_savers(path: str | Path, siblings: list[SiblingCall]) -> dict[str, StateSaver]:
    """Names this file calls (``utils.save_checkpoint``, ``save_checkpoint``) of top-level
    functions of a module of its own folder that ``torch.save`` what holds the
    ``.state_dict()`` of one of their parameters, or one of their parameters whole (``def
    save_checkpoint(state, is_best, path): torch.save(state, path)``, handed ``{"model":
    model.state_dict(), ...}``), read from that module's own source: what it saves is its
    caller's to unwrap, and its calls are what the conversion guards where it does nothing
    else another rank needs (`saves_only`: ``guardable``)."""
    script = Path(path)
    found: dict[str, StateSaver] = {}
    for _, name, function, file, other in siblings:
        if name in found:
            continue
        defined = _top_level_function(other, function)
        if defined is None:
            continue
        parameters = tuple(p.name.value for p in defined.params.params)
        saved, save_line = _parameter_states_saved(other, defined, parameters)
        whole, whole_line = _parameters_saved_whole(other, defined, parameters)
        if not (saved or whole) or any(
            isinstance(node, cst.Call) and other.call_names(node) & collectives.FUNCTIONS
            for node in walk(defined)
        ):  # a collective inside: run on the main process alone, it would wait forever
            continue
        facts = facts_of(other)
        only = saves_only(other, facts.placement, facts.calls, facts.flow, function)
        line = min(n for n in (save_line, whole_line) if n is not None)
        found[name] = StateSaver(
            parameters,
            frozenset(saved),
            f"{_relative(file, script)}:{line}",
            only,
            frozenset(whole),
        )
    return found


def _parameters_saved_whole(
    module: ScriptModel, function: cst.FunctionDef, parameters: tuple[str, ...]
) -> tuple[set[str], int | None]:
    """The ``parameters`` of ``function`` a ``torch.save`` call of its body saves as they are
    (``torch.save(state, path)``), with the line of the first such save (None where none)."""
    saved: set[str] = set()
    line = None
    for node in walk(function):
        if not isinstance(node, cst.Call) or not module.call_names(node) & TORCH_SAVE:
            continue
        first = node.args[0].value if node.args and node.args[0].keyword is None else None
        if isinstance(first, cst.Name) and first.value in parameters:
            saved.add(first.value)
            line = line or module.line(node)
    return saved, line


def _parameter_states_saved(
    module: ScriptModel, function: cst.FunctionDef, parameters: tuple[str, ...]
) -> tuple[set[str], int | None]:
    """The ``parameters`` of ``function`` whose ``.state_dict()`` a ``torch.save`` call of its
    body saves (``torch.save({"model": model.state_dict()}, path)``), with the line of the
    first such save (None where there is none): the one reading that a saving function and a
    saving method share."""
    saved: set[str] = set()
    line = None
    for node in walk(function):
        if not isinstance(node, cst.Call) or not module.call_names(node) & TORCH_SAVE:
            continue
        for inner in walk(node):
            if (
                isinstance(inner, cst.Call)
                and isinstance(inner.func, cst.Attribute)
                and inner.func.attr.value == "state_dict"
                and isinstance(inner.func.value, cst.Name)
                and inner.func.value.value in parameters
            ):
                saved.add(inner.func.value.value)
                line = line or module.line(node)
    return saved, line


@dataclass(frozen=True)
class ObjectSaver:
    """A class of a sibling module whose methods save the state dict of a model they are
    handed (pytorchtools' ``EarlyStopping``: ``__call__(self, val_loss, model)`` calls
    ``self.save_checkpoint(model)``, which does ``torch.save(model.state_dict(), self.path)``).
    Handed a prepared model its file holds the DDP wrapper's ``module.``-prefixed keys, every
    rank writes it at once, and a rank reading it back after the call may find it half
    written. The call does more than save (a patience counter, a stop flag every rank needs),
    so it cannot run on the main process alone the way a saving function's call can."""

    methods: Mapping[str, StateSaver]  # by method name: its parameters past ``self``, saved ones
    module: Path
    class_name: str  # in ``module``
    where: str  # ``stopping.py:25``: the first save
    #: its saves are lines of their own, which the module's conversion guards (`guarded_saves`)
    guardable: bool


def imported_object_savers(path: str | Path, siblings: list[SiblingCall]) -> dict[str, ObjectSaver]:
    """Classes this file makes (``EarlyStopping(...)``, ``stopping.EarlyStopping(...)``) of a
    module of its own folder whose methods ``torch.save`` what holds the ``.state_dict()`` of
    one of their parameters, directly or through another method of the class they hand it to
    (`class_state_savers`), by the name the file's calls use."""
    script = Path(path)
    found: dict[str, ObjectSaver] = {}
    for _, name, defined, file, other in siblings:
        if name in found:
            continue
        cls = saver_class(other, defined)
        if cls is None:
            continue
        methods = class_state_savers(other, cls)
        if methods:
            first = min(int(saver.where) for saver in methods.values())
            found[name] = ObjectSaver(
                {
                    method: StateSaver(
                        saver.parameters, saver.saved, f"{_relative(file, script)}:{saver.where}"
                    )
                    for method, saver in methods.items()
                },
                file,
                defined,
                f"{_relative(file, script)}:{first}",
                guarded_saves(other, cls) is not None,
            )
    return found


def saver_instances(model: ScriptModel, name: str) -> set[str]:
    """``self.early_stopping`` or ``stopper`` bound to ``name(...)`` (the saver class) and to
    nothing else anywhere in the file."""
    found = set()
    for node in walk(model.module):
        if not (
            isinstance(node, cst.Assign)
            and len(node.targets) == 1
            and isinstance(node.value, cst.Call)
            and dotted(node.value.func) == name
        ):
            continue
        target = dotted(node.targets[0].target)
        if target is None:
            continue
        bound = model.index.assignments_to(target)
        if all(
            isinstance(a, cst.Assign)
            and isinstance(a.value, cst.Call)
            and dotted(a.value.func) == name
            for a in bound
        ):
            found.add(target)
    return found


def saver_method(call: cst.Call, instances: set[str]) -> tuple[str, str] | None:
    """(instance, method) for ``instance(...)`` (``__call__``) or ``instance.method(...)``."""
    called = dotted(call.func)
    if called in instances:
        return called, "__call__"  # type: ignore[return-value]
    if isinstance(call.func, cst.Attribute) and dotted(call.func.value) in instances:
        return dotted(call.func.value), call.func.attr.value  # type: ignore[return-value]
    return None


def own_line(model: ScriptModel, call: cst.Call) -> cst.SimpleStatementLine | None:
    """The line that holds ``call`` alone, as a statement of its own (``stopper(loss,
    model)``), where it is one: a barrier can follow it."""
    expression = model.parent(call)
    line = model.parent(expression) if isinstance(expression, cst.Expr) else None
    if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
        return line
    return None


def object_saves_waited(model: ScriptModel, name: str, saver: ObjectSaver) -> bool:
    """Every call in ``model`` of a saving method of an instance of ``name`` (`ObjectSaver`) is
    a statement of its own that every rank reaches, none having left before it (any test of a
    per-process stop above it counts, agreed or not): the driver's conversion can have every
    rank wait after each, so the save may run on the main process alone. Where one cannot
    wait, a rank could read the file back before it is written: the save stays on every
    rank (`saver_modules.saves_guarded`)."""
    instances = saver_instances(model, name)
    if not instances or unfollowed_instances(model, name, instances):
        return False
    shared = facts_of(model).shared_files
    calls = 0
    for call in model.calls:
        found = saver_method(call, instances)
        if found is None or found[1] not in saver.methods:
            continue
        if own_line(model, call) is None or shared.parting_before(call) is not None:
            return False
        calls += 1
    return calls > 0


def unfollowed_instances(model: ScriptModel, name: str, instances: set[str]) -> list[cst.Call]:
    """The saver class's constructions in the driver that `saver_instances` cannot follow to
    their calls (returned by a factory, handed straight to a call, kept in a list): the
    driver cannot wait after those calls nor unwrap what they are handed, so the save must
    stay on every rank (review8b: ``self.stopper = make_stopper(cfg)``,
    ``trainer.fit(EarlyStopping())``)."""
    found = []
    for node in walk(model.module):
        if not isinstance(node, cst.Call) or dotted(node.func) != name:
            continue
        parent = model.parent(node)
        if not (
            isinstance(parent, cst.Assign)
            and len(parent.targets) == 1
            and dotted(parent.targets[0].target) in instances
        ):
            found.append(node)
    return found


def class_state_savers(module: ScriptModel, cls: cst.ClassDef) -> dict[str, StateSaver]:
    """The methods of ``cls`` (plain methods, ``self`` first) that save the state dict of a
    parameter they are handed, each as a `StateSaver` (parameters past ``self``, the saved
    ones, the line of the save as its ``where``): a ``torch.save`` of ``p.state_dict()`` in
    the method's own body, or ``self.other(p)`` of a method that saves that parameter. None
    where any method of the class runs a collective (saved on the main process alone, the
    collective would wait forever)."""
    methods = {
        s.name.value: s
        for s in cls.body.body
        if isinstance(s, cst.FunctionDef) and not s.decorators and s.params.params
    }
    if any(
        isinstance(node, cst.Call) and module.call_names(node) & collectives.FUNCTIONS
        for node in walk(cls)
    ):
        return {}
    parameters = {
        name: tuple(p.name.value for p in f.params.params[1:]) for name, f in methods.items()
    }
    saved: dict[str, set[str]] = {}
    lines: dict[str, int] = {}
    for name, function in methods.items():
        saved[name], line = _parameter_states_saved(module, function, parameters[name])
        if line is not None:
            lines[name] = line
    changed = True
    while changed:  # ``self.save_checkpoint(model)``: the caller saves what it hands on
        changed = False
        for name, function in methods.items():
            for node in walk(function):
                callee = _self_method(node, methods)
                if callee is None or not saved[callee]:
                    continue
                for index, argument in enumerate(node.args):  # type: ignore[attr-defined]
                    if argument.star or not isinstance(argument.value, cst.Name):
                        continue
                    if argument.keyword is not None:
                        target = argument.keyword.value
                    elif index < len(parameters[callee]):
                        target = parameters[callee][index]
                    else:
                        continue
                    handed = argument.value.value
                    if (
                        target in saved[callee]
                        and handed in parameters[name]
                        and handed not in saved[name]
                    ):
                        saved[name].add(handed)
                        lines.setdefault(name, lines[callee])
                        changed = True
    return {
        name: StateSaver(parameters[name], frozenset(saved[name]), str(lines[name]))
        for name in methods
        if saved[name]
    }


def guarded_saves(module: ScriptModel, cls: cst.ClassDef) -> list[cst.SimpleStatementLine] | None:
    """The statements of ``cls``'s methods that save a parameter's state dict
    (`class_state_savers`), each a line of its own holding only the ``torch.save(...)`` call:
    what the module's conversion puts under ``if PartialState().is_main_process:`` when a
    file that makes the class is converted with it. None where one is not such a line (it
    could not be guarded alone: the module is then left as it is)."""
    savers = class_state_savers(module, cls)
    if not savers:
        return None
    found: list[cst.SimpleStatementLine] = []
    for node in walk(cls):
        if not isinstance(node, cst.Call) or not module.call_names(node) & TORCH_SAVE:
            continue
        if not any(
            isinstance(inner, cst.Call)
            and isinstance(inner.func, cst.Attribute)
            and inner.func.attr.value == "state_dict"
            for inner in walk(node)
        ):
            continue
        expression = module.parent(node)
        line = module.parent(expression) if isinstance(expression, cst.Expr) else None
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            return None
        found.append(line)
    return found or None


def saver_class(module: ScriptModel, name: str) -> cst.ClassDef | None:
    """The class ``name`` of the module's own body."""
    return next(
        (s for s in module.module.body if isinstance(s, cst.ClassDef) and s.name.value == name),
        None,
    )


def _self_method(node: cst.CSTNode, methods: Mapping[str, cst.FunctionDef]) -> str | None:
    """``save_checkpoint`` for ``self.save_checkpoint(...)``, a method of the class."""
    if (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and isinstance(node.func.value, cst.Name)
        and node.func.value.value == "self"
        and node.func.attr.value in methods
    ):
        return node.func.attr.value
    return None


def imported_returns(path: str | Path, model: ScriptModel) -> dict[int, Returned]:
    """The calls of ``model`` (the file ``path``) that return DataLoaders made in a module of its
    own folder, by the call's id, with what each returns by position (the analysis the linter
    asks too: `imported_returns.returned_by_project`). The conversion prepares them as it
    prepares what a factory of the file returns."""
    script = Path(path)
    if not script.is_file():
        return {}
    modules: dict[Path, ScriptModel | None] = {}

    def load(file: Path) -> ScriptModel | None:
        if file not in modules:  # each module analysed once
            modules[file] = _analyzed(file)
        return modules[file]

    found: dict[int, Returned] = {}
    for node in walk(model.module):
        if isinstance(node, cst.Call):
            kinds, _ = returned_by_project(script, model, node, load)
            if kinds:
                found[id(node)] = kinds
    return found


def review_notes(
    script: str | Path,
    found: list[TrainedElsewhere],
    prepared: Mapping[Path, list[str]],
    unpaired: Mapping[int, str],
) -> list[Note]:
    """A line per call that trains in another module. ``prepared``: what the conversion of
    each such module prepares there by itself (a trainer class that makes its model, optimizer
    and loaders and gets ``self.accelerator``); for those, nothing is to be done here.
    ``unpaired``: by the line of the call, why the two files are not converted as one
    (`across.unpaired_because`)."""
    notes = []
    for entry in found:
        if prepared.get(entry.module):
            continue
        where = _relative(entry.module, Path(script))
        why = unpaired.get(entry.line, "")
        notes.append(
            Note(
                entry.line,
                f"{entry.function}() trains in {where} (its .backward() at line "
                f"{entry.backward_line}): neither file is converted for it ({why}); by hand: "
                "create the "
                "Accelerator here, prepare the model, optimizer and loaders "
                f"here, and hand the accelerator to {entry.function}() (there: "
                "accelerator.backward(loss), the evaluation's predictions and labels gathered "
                "with accelerator.gather_for_metrics, prints through accelerator.print)",
            )
        )
    return notes


def prepared_there_note(
    script: str | Path,
    entry: TrainedElsewhere,
    names: list[str],
    accelerator: str | None,
    when: str,
) -> Note:
    """What the other module's own conversion does for the training this file drives
    (``when``: "converted" in this run, or "converted alone": not in this run)."""
    where = _relative(entry.module, Path(script))
    trains = f"{entry.function}() trains in {where} (its .backward() at line {entry.backward_line})"
    prepares = ", ".join(names)
    reach = f"this file reaches it as {accelerator}" if accelerator else "no handle to it here"
    if when == "already converted":
        return Note(
            entry.line,
            f"{trains}, which already creates the Accelerator there and prepares {prepares}: "
            f"nothing to create or prepare here ({reach})",
        )
    if when == "converted alone":
        return Note(
            entry.line,
            f"{trains}: its own conversion creates the Accelerator there and prepares "
            f"{prepares}, and it is not converted in this run: convert {where} as well "
            "(accelify convert on the folder); nothing to create or prepare here, and this "
            f"file's prints then run on every rank: print through {accelerator or 'it'}.print",
        )
    return Note(
        entry.line,
        f"{trains}, whose own conversion creates the Accelerator there and prepares "
        f"{prepares}: nothing to create or prepare here ({reach})",
    )


def instance_accelerator(
    model: ScriptModel, entry: TrainedElsewhere, converted: bytes
) -> tuple[str, cst.CSTNode] | None:
    """``trainer.accelerator`` for ``trainer = Trainer(...)`` (a statement of the module's own
    body, or of a function's own body: a ``def main()`` driver; binding the one name
    ``trainer``, nowhere rebound) when the converted class of the other module holds its
    Accelerator as ``self.accelerator`` (read from the converted source: what that file does
    once converted), with the binding statement; else None. The statement is in no branch or
    loop of its scope: every statement below it in that scope runs with ``trainer`` bound."""
    assign = model.parent(entry.call)
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        return None
    target = assign.targets[0].target
    statement = model.parent(assign)
    if not isinstance(target, cst.Name) or not _of_its_scopes_own_body(model, statement):
        return None
    if len(model.index.values_bound_to(target.value)) != 1:
        return None
    try:
        other = cst.parse_module(converted)
    except cst.ParserSyntaxError:
        return None
    classes = [
        s for s in other.body if isinstance(s, cst.ClassDef) and s.name.value == entry.defined
    ]
    if len(classes) != 1:
        return None
    for node in walk(classes[0]):
        if (
            isinstance(node, cst.FunctionDef)
            and node.name.value == "__init__"
            and (attribute := accelerator_attribute(node)) is not None
        ):
            return f"{target.value}.{attribute}", statement  # type: ignore[return-value]
    return None


def _of_its_scopes_own_body(model: ScriptModel, statement: cst.CSTNode) -> bool:
    """A statement of the module's body, of a function's own indented block, or of a
    module-level ``if __name__ == "__main__":`` block (it runs once, as the module's own
    statements do: the most common driver shape)."""
    parent = model.parent(statement)
    if parent is model.module:
        return True
    return isinstance(parent, cst.IndentedBlock) and _a_scope(model, model.parent(parent))


def _a_scope(model: ScriptModel, owner: cst.CSTNode | None) -> bool:
    """A function, or a main guard of the module's own body: its block is a scope's body."""
    if isinstance(owner, cst.FunctionDef):
        return True
    return is_main_guard(owner) and model.parent(owner) is model.module  # type: ignore[arg-type]


def in_scope_below(model: ScriptModel, node: cst.CSTNode, statement: cst.CSTNode) -> bool:
    """``node`` runs after ``statement`` in the same scope (not in a function or class defined
    there, which may run anywhere): below it in source order. The scope of a statement of a
    function's block or of a main guard's block is that block."""
    if model.order(node) <= model.order(statement):
        return False
    scope = model.parent(statement)  # the module, or the block holding the statement
    if scope is not model.module and not model.inside(node, scope):
        return False
    return not any(
        isinstance(a, (cst.FunctionDef, cst.ClassDef, cst.Lambda))
        for a in model.ancestors(node)
        if a is not scope and model.inside(a, scope)
    )


def accelerator_attribute(init: cst.FunctionDef) -> str | None:
    """``accelerator`` for ``self.accelerator = Accelerator(...)`` in ``init``'s own body."""
    for node in walk(init.body):
        if (
            isinstance(node, cst.Assign)
            and len(node.targets) == 1
            and isinstance(node.value, cst.Call)
            and (dotted(node.value.func) or "").rsplit(".", 1)[-1] == "Accelerator"
        ):
            name = dotted(node.targets[0].target) or ""
            if name.startswith("self.") and name.count(".") == 1:
                return name.partition(".")[2]
    return None


def _backward_reached(model: ScriptModel, function: str) -> int | None:
    """The line of a backward that ``function`` (a top-level function of ``model``, or a class
    of it: its methods) runs, in its body or in a function of the module it calls (three calls
    deep at most). An accelerator's (``self.accelerator.backward(loss)`` of a module already
    converted) counts: the file that drives it trains there all the same."""
    top = {
        s.name.value: s for s in model.module.body if isinstance(s, (cst.FunctionDef, cst.ClassDef))
    }
    todo = [(top.get(function), 0)]  # a class: any of its methods
    seen: set[int] = set()
    while todo:
        current, depth = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        for backward in backwards(model):
            if any(a is current for a in model.ancestors(backward.call)):
                return model.line(backward.call)
        if depth < 3:
            for node in walk(current):
                if isinstance(node, cst.Call):
                    for target in model.call_graph.targets(node):
                        todo.append((target, depth + 1))
    return None


def prepared_by_hand(source: bytes, label: str) -> list[str]:
    """What a module that already uses an Accelerator prepares itself (``model, optimizer,
    loader`` of ``self.accelerator.prepare(model, optimizer, loader)``), as written. A dict of
    loaders prepared entry by entry (``self.loaders = {k: self.accelerator.prepare(v) for k, v
    in self.loaders.items()}``) by the name it is kept as, as the engine's own conversion
    lists it (its input is no name: trial20's "prepares , self.model")."""
    try:
        module = parse(source, label)
    except UserError:
        return []
    model = analyze(module)
    found = []
    for prepare in model.prepare_calls:
        entry_by_entry = isinstance(model.parent(prepare.call), cst.DictComp)
        found += [name for name in (prepare.outputs if entry_by_entry else prepare.inputs) if name]
    return found


def _analyzed(file: Path) -> ScriptModel | None:
    try:
        return analyze(parse(read(file), str(file)))
    except (UserError, RecursionError):
        return None


def _relative(module: Path, script: Path) -> str:
    for there, here in ((module, script.parent), (resolved(module), resolved(script).parent)):
        try:  # a module found through a base class may be named by its absolute path
            return str(there.relative_to(here))
        except ValueError:
            continue
    return str(module)
