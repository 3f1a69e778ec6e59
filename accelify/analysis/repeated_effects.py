"""Files written or deleted by every rank: N writers of one path race (a reader can see a torn
file), and N deleters of one path fail on every rank but the fastest (FileNotFoundError).

A write counts where every rank that runs it runs it together: outside any rank guard, or in a
block every rank enters on some backend (``if accelerator.is_main_process or
accelerator.distributed_type == DistributedType.DEEPSPEED:`` under DeepSpeed). A write inside a
function counts at the function's call sites: a helper called only under a main-process guard
(or never called, like a hook handed to the Accelerator) writes once. A path made per process
(a temporary directory, a pid) is N files, none racing another.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from accelify.analysis import side_effects
from accelify.analysis.placement import Placement
from accelify.analysis.rank_dependence import BackendGuards
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.shared_files import SharedFiles
from accelify.analysis.syntax import dotted

_MAX_DEPTH = 4


@dataclass(frozen=True)
class RepeatedEffect:
    reported: cst.Call  # the write itself, or the call of the helper that writes
    effect: cst.Call  # the call that writes or deletes
    deletes: bool
    backends: frozenset[str]  # where every rank runs it

    @property
    def through_helper(self) -> bool:
        return self.reported is not self.effect


def repeated_effects(
    model: ScriptModel, placement: Placement, guards: BackendGuards, files: SharedFiles
) -> list[RepeatedEffect]:
    found = []
    for write in side_effects.writes(model, placement, with_torch_save=True):
        call = write.call
        if side_effects.per_rank_path(call) or side_effects.main_process_only(call):
            continue
        if files.unique_per_process(call):
            continue  # a temporary directory, a pid: each rank its own file
        deletes = side_effects.deletes(model, call)
        for reported, backends in _every_rank_sites(model, placement, guards, call, 0):
            found.append(RepeatedEffect(reported, call, deletes, backends))
    return found


def _every_rank_sites(
    model: ScriptModel,
    placement: Placement,
    guards: BackendGuards,
    node: cst.Call,
    depth: int,
) -> list[tuple[cst.Call, frozenset[str]]]:
    """Where ``node`` is run by every rank: itself, or the outermost call sites of the
    functions around it, with the backends on which that holds."""
    function = placement.enclosing_function(node)
    entered = guards.entered_by_all(node, within=function)
    if not entered:
        return []
    if function is None:
        return [(node, entered)]
    callers = _callers(model, placement, function)
    if depth >= _MAX_DEPTH:
        return []
    sites = []
    for caller in callers:
        for site, backends in _every_rank_sites(model, placement, guards, caller, depth + 1):
            if backends & entered:
                sites.append((site, backends & entered))
    return sites


def _callers(model: ScriptModel, placement: Placement, function: cst.FunctionDef) -> list[cst.Call]:
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
