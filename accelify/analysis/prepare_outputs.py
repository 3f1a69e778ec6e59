"""What a name that ``prepare`` binds under another name holds. ``model, opt, loader, sched2 =
accelerator.prepare(model, opt, loader, scheduler)`` returns each object, wrapped, at its
argument's position: ``sched2`` is ``scheduler``'s kind of object (a scheduler), made by the
same constructor and sized the same way. Without this, a renamed output has no binding, so
`flow.Flow.kind_of` knows nothing of it and every rule that asks what ``sched2.step()`` steps
misses it (ACC408, ACC410, ACC415; ACC409 followed the rename by itself)."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from accelify.analysis.script_model import PrepareCall, ScriptModel
from accelify.analysis.syntax import all_params, assigned_targets, dotted


@dataclass(frozen=True)
class Renamed:
    """One ``prepare`` that binds an output under another name than its argument's."""

    source: str  # the argument's name: ``scheduler``
    prepare: PrepareCall


def renamed_outputs(script: ScriptModel) -> dict[str, list[Renamed]]:
    """Each output name ``prepare`` binds from an argument of another name, with the calls that
    do, where those calls are the name's only bindings in the file (or ``x = None`` before
    them: a trainer's ``self.sched = None`` in ``__init__``). A name bound any other way too
    (``sched2 = make()`` elsewhere) is left out: which object it holds depends on the path.
    Arguments and outputs must line up one to one (no ``*objects``, no single target for
    several objects)."""
    cached = script.__dict__.get("_renamed_outputs")
    if cached is not None:
        return cached
    found: dict[str, list[Renamed]] = {}
    for prepare in script.prepare_calls:
        arguments = prepare.call.args
        if any(a.star for a in arguments) or not (
            len(arguments) == len(prepare.inputs) == len(prepare.outputs)
        ):
            continue
        for given, output in zip(prepare.inputs, prepare.outputs, strict=True):
            if given and output and given != output:
                found.setdefault(output, []).append(Renamed(given, prepare))
    kept = {name: each for name, each in found.items() if _bound_only_by(script, name, each)}
    script.__dict__["_renamed_outputs"] = kept
    return kept


def _bound_only_by(script: ScriptModel, name: str, renamed: list[Renamed]) -> bool:
    calls = {id(r.prepare.call) for r in renamed}
    binds = [*script.index.assignments_to(name), *script.index.unpacked_assignments_to(name)]
    return all(
        id(b.value) in calls or (isinstance(b.value, cst.Name) and b.value.value == "None")
        for b in binds
    )


def same_object_names(script: ScriptModel, name: str) -> list[str]:
    """``name`` and the arguments every renaming ``prepare`` of it was handed (``scheduler``
    for ``sched2``): where the object was made, for the questions asked of its construction
    (is it a ``ReduceLROnPlateau``, what sizes it). Only ``name`` where it is not renamed."""
    return [name, *dict.fromkeys(r.source for r in renamed_outputs(script).get(name, []))]


def source_of(script: ScriptModel, name: str) -> str:
    """The one argument a renamed output was prepared from (``scheduler`` for ``sched2``);
    ``name`` itself where it is not renamed, or renamed from several."""
    names = same_object_names(script, name)
    return names[1] if len(names) == 2 else name


def renamed_from(script: ScriptModel, name: str | None, at: cst.CSTNode) -> list[Renamed]:
    """The renaming ``prepare`` calls of ``name`` that ``at`` sees: in the same function (or
    ``at`` nested in it), at the module's level, or for ``self.x`` in a method of the same
    class."""
    if name is None:
        return []
    index = script.index
    found = []
    for renamed in renamed_outputs(script).get(name, []):
        bound_in = script.scope_of(renamed.prepare.call)
        if name.startswith("self."):
            owner = index.enclosing_class(renamed.prepare.call)
            if owner is not None and index.enclosing_class(at) is owner:
                found.append(renamed)
        elif bound_in is script.scope_of(at) or (
            (isinstance(bound_in, cst.Module) or script.inside(at, bound_in))
            and not _shadowed(script, name, at, bound_in)
        ):
            found.append(renamed)
    return found


def _shadowed(script: ScriptModel, name: str, at: cst.CSTNode, bound_in: cst.CSTNode) -> bool:
    """A function between ``at`` and the scope of the ``prepare`` names ``name`` itself (a
    parameter, or its own binding): ``at`` reads that one."""
    function = script.index.enclosing_function(at)
    while function is not None and function is not bound_in:
        if any(p.name.value == name for p in all_params(function.params)):
            return True
        if script.index.assigned_under(function).get(name):
            return True
        function = script.index.enclosing_function(function)
    return False


def made_like_a_prepared_input(script: ScriptModel, name: str, at: cst.CSTNode) -> str | None:
    """``test_loader`` of ``test_data, test_loader = self._get_data(flag="test")`` where another
    call of the same function in the file binds, at the same position, a name that a
    ``prepare`` of its function is handed (``train_loader`` of ``self._get_data(flag="train")``):
    the function makes objects ``prepare`` takes (a time-series Exp's loaders from a data
    factory of another module), and this one is not prepared. That name; None otherwise, or
    where ``name`` is bound more than once in the function around ``at``."""
    function = script.index.enclosing_function(at)
    binds = [
        b
        for b in (*script.index.assignments_to(name), *script.index.unpacked_assignments_to(name))
        if script.index.enclosing_function(b) is function
    ]
    if len(binds) != 1 or not isinstance(binds[0].value, cst.Call):
        return None
    made = binds[0]
    maker = dotted(made.value.func)  # type: ignore[union-attr]
    position = _position(made, name)
    if maker is None or position is None:
        return None
    for other in script.assignments:
        if other is made or not isinstance(other.value, cst.Call):
            continue
        if dotted(other.value.func) != maker:
            continue
        twin = _at_position(other, position)
        where = script.index.enclosing_function(other)
        if twin and any(
            twin in prepare.inputs
            and script.index.enclosing_function(prepare.call) is where
            and script.order(prepare.call) > script.order(other)
            for prepare in script.prepare_calls
        ):
            return twin
    return None


def _position(assign: cst.CSTNode, name: str) -> int | None:
    """Where ``name`` is among the one target's elements (-1: the whole target)."""
    targets = assigned_targets(assign)
    if len(targets) != 1:
        return None
    target = targets[0]
    if isinstance(target, (cst.Tuple, cst.List)):
        spelled = [dotted(e.value) for e in target.elements]
        return spelled.index(name) if spelled.count(name) == 1 else None
    return -1 if dotted(target) == name else None


def _at_position(assign: cst.CSTNode, position: int) -> str | None:
    targets = assigned_targets(assign)
    if len(targets) != 1:
        return None
    target = targets[0]
    if position == -1:
        return None if isinstance(target, (cst.Tuple, cst.List)) else dotted(target)
    if not isinstance(target, (cst.Tuple, cst.List)) or position >= len(target.elements):
        return None
    return dotted(target.elements[position].value)
