"""Files written or deleted by every rank: N writers of one path race (a reader can see a torn
file), and N deleters of one path fail on every rank but the fastest (FileNotFoundError).

A write counts where every rank that runs it runs it together: outside any rank guard, or in a
block every rank enters on some backend (``if accelerator.is_main_process or
accelerator.distributed_type == DistributedType.DEEPSPEED:`` under DeepSpeed). A write inside a
function counts when some call of the function is run by every rank, or when nothing in the file
calls it but it synchronises the ranks (``prepare``, ``backward``, a collective: it runs on all
of them). A helper called only under a main-process guard, or a hook handed to the Accelerator,
writes once. A path made per process (a temporary directory, a pid) is N files, none racing
another.

A call of another project module's function that writes (``save_checkpoint(...)`` of
``utils.py``, `helper_writes`) counts as a write where it is made: that module has no
accelerator to test.

It is reported at the write, where a guard (or ``is_main_process=`` for ``save_pretrained``)
fixes it; at the call sites every rank runs only when other call sites of the same function are
guarded (the author meant it for the main process) and the function synchronises nothing: a
function that reaches ``prepare``, ``backward`` or a collective must never run on one rank.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import libcst as cst

from accelify.analysis import names, side_effects
from accelify.analysis.accelerator_objects import without_accelerator
from accelify.analysis.helper_writes import HelperWrite, helper_writes
from accelify.analysis.placement import Placement
from accelify.analysis.rank_dependence import BackendGuards
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.shared_files import SharedFiles
from accelify.analysis.syntax import dotted

_MAX_DEPTH = 4


@dataclass(frozen=True)
class RepeatedEffect:
    reported: cst.Call  # the write itself, or a call of the helper that writes
    effect: cst.Call  # the call that writes or deletes
    deletes: bool
    backends: frozenset[str]  # where every rank runs it
    #: ``effect`` is a call of another project module's function that writes (`helper_writes`)
    helper: HelperWrite | None = None

    @property
    def through_helper(self) -> bool:
        return self.reported is not self.effect


Synchronising = Callable[..., "cst.Call | None"]


def repeated_effects(
    model: ScriptModel,
    placement: Placement,
    guards: BackendGuards,
    synchronising: Synchronising,
    files: SharedFiles,
    calls_into_project: Iterable[tuple[cst.Call, Path, str]] = (),
) -> list[RepeatedEffect]:
    found: list[RepeatedEffect] = []
    judge = _Judge(model, placement, guards, synchronising)
    reported_opens: set[int] = set()  # one finding per file a handle was opened on
    for write in side_effects.writes(model, placement, with_torch_save=True):
        call = write.call
        if (
            side_effects.per_rank_path(model, call)
            or files.unique_per_process(call)
            or files.named_from_share(call)
        ):
            continue  # a temporary directory, a pid, an item of its share: each rank its own file
        effects = judge.effects(call)
        opened = side_effects.opened_for_writing(model, call)
        if effects and opened is not None:
            reported_opens.add(id(opened))
        found += effects
    for write in side_effects.handle_writes(model, placement):
        call = write.call
        opened = side_effects.opened_for_writing(model, call)
        if opened is None or id(opened) in reported_opens:
            continue
        if model.call_names(call) & names.FILE_WRITERS:
            continue  # judged above, as the writer it is
        if (
            side_effects.per_rank_path(model, opened)
            or files.unique_per_process_path(opened)
            or files.named_from_share(opened)
        ):
            continue
        if not guards.entered_by_all(opened, within=placement.enclosing_function(opened)):
            continue  # opened on some ranks only: the others have no file to write
        effects = judge.effects(call)
        if effects:
            reported_opens.add(id(opened))
        found += effects
    for helper in helper_writes(model, calls_into_project):
        found += [replace(effect, helper=helper) for effect in judge.effects(helper.call)]
    return found


class _Judge:
    """Whether every rank runs a write (outside a rank guard, or in a function some call of
    which every rank makes), and where to report it."""

    def __init__(
        self,
        model: ScriptModel,
        placement: Placement,
        guards: BackendGuards,
        synchronising: Synchronising,
    ) -> None:
        self.model = model
        self.placement = placement
        self.guards = guards
        self.synchronising = synchronising

    def effects(self, call: cst.Call) -> list[RepeatedEffect]:
        model, placement, guards = self.model, self.placement, self.guards
        if side_effects.main_process_only(call):
            return []
        function = placement.enclosing_function(call)
        entered = guards.entered_by_all(call, within=function)
        if not entered:
            return []
        if without_accelerator(model, call):  # asked after the cheaper tests: it walks up
            return []  # ``else:`` of ``if self.accelerator is not None:``: one plain process
        deletes = side_effects.deletes(model, call)
        if function is None:
            return [RepeatedEffect(call, call, deletes, entered)]
        sites = _CallSites(model, placement, guards, self.synchronising)
        every_rank, guarded = sites.of(function, 0, frozenset())
        every_rank = [(site, backends & entered) for site, backends in every_rank]
        every_rank = [(site, backends) for site, backends in every_rank if backends]
        if not every_rank:
            if not guarded and sites.entry_point(function):
                return [RepeatedEffect(call, call, deletes, entered)]
            return []
        if guarded and self.synchronising(function) is None:
            return [RepeatedEffect(site, call, deletes, b) for site, b in every_rank]
        backends = frozenset().union(*(b for _, b in every_rank))
        return [RepeatedEffect(call, call, deletes, backends)]


def run_by_every_rank(
    model: ScriptModel,
    placement: Placement,
    guards: BackendGuards,
    synchronising: Synchronising,
    function: cst.FunctionDef,
) -> bool:
    """Some call of ``function`` (followed up through its callers) is made by every rank on
    some backend, or nothing in the file calls it and it synchronises the ranks."""
    sites = _CallSites(model, placement, guards, synchronising)
    every_rank, guarded = sites.of(function, 0, frozenset())
    if every_rank:
        return True
    return not guarded and sites.entry_point(function)


class _CallSites:
    """Where a function is called by every rank (with the backends on which that holds), and
    whether some call of it runs on some ranks only (under a main-process guard)."""

    def __init__(
        self,
        model: ScriptModel,
        placement: Placement,
        guards: BackendGuards,
        synchronising: Synchronising,
    ) -> None:
        self.model = model
        self.placement = placement
        self.guards = guards
        self.synchronising = synchronising

    def entry_point(self, function: cst.FunctionDef) -> bool:
        """Called nowhere in the file (from another module, ``trainer.fit()``, a callback) yet
        synchronising the ranks on every backend, or called by the project's other modules
        outside any rank test (`ProjectView.run_by_every_rank`): every rank runs it. One that
        synchronises nothing (a hook), or only where a checkpoint is a collective
        (``save_state``, called on the main process alone under HF's DDP), may run on one
        rank: not counted."""
        if callers_of(self.model, self.placement, function):
            return False
        project = self.model.project
        if project is not None and function in project.run_by_every_rank:
            return True  # every call of the project's other modules is outside a rank test
        return self.synchronising(function, everywhere=True) is not None

    def of(
        self, function: cst.FunctionDef, depth: int, seen: frozenset[int]
    ) -> tuple[list[tuple[cst.Call, frozenset[str]]], bool]:
        if depth >= _MAX_DEPTH or id(function) in seen:
            return [], False
        seen = seen | {id(function)}
        every_rank: list[tuple[cst.Call, frozenset[str]]] = []
        guarded = False
        for site in callers_of(self.model, self.placement, function):
            if without_accelerator(self.model, site):
                continue  # called only where the script runs without an accelerator
            outer = self.placement.enclosing_function(site)
            entered = self.guards.entered_by_all(site, within=outer)
            if not entered:
                guarded = True
                continue
            if outer is None or self.entry_point(outer):
                every_rank.append((site, entered))
                continue
            outer_sites, _ = self.of(outer, depth + 1, seen)
            reached = frozenset().union(*(b for _, b in outer_sites)) & entered
            if reached:
                every_rank.append((site, reached))
        return every_rank, guarded


def callers_of(
    model: ScriptModel, placement: Placement, function: cst.FunctionDef
) -> list[cst.Call]:
    """Calls of ``function`` by name (``save(...)``) or, for a method, as ``self.save(...)``
    inside its class; calls through other objects cannot be told from same-named methods of
    other classes (``accelerator.save``), so a method called only that way counts as never
    called."""
    owner = placement.class_of(function)
    if owner is None:
        return placement.callers(function)
    name = function.name.value
    return [
        call
        for call in model.calls
        if isinstance(call.func, cst.Attribute)
        and call.func.attr.value == name
        and dotted(call.func.value) == "self"
        and placement.class_of(call) is owner
    ]
