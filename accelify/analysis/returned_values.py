"""Where a helper's returned local goes: the object model treats a list a helper builds and
returns as the same object its callers hold (``embeddings = extract(loader, model)``), so what
happens to it there (a gather after the helper's loop) is what happens to the helper's local.

Also which slot of a returned tuple a caller's name holds (``loss, stats = forward(...)`` of a
``return loss, stats``): `unpacked_slot` on the caller's side, `returned_tuples` on the
function's; `own_values` and ACC403's statistics dicts ask them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.syntax import dotted, walk

if TYPE_CHECKING:
    from accelify.analysis.facts import Facts


def held_by_callers(
    facts: Facts, function: cst.FunctionDef, names: set[str]
) -> list[tuple[cst.Assign, str]]:
    """Where every ``return`` of ``function`` hands back one of ``names`` whole (``return
    embeddings``) or at one place of a tuple (``return predictions, references``): each caller's
    ``result = function(...)`` (``predictions, references = function(...)``) that binds that
    value to one name, and that name. Empty where a return hands back anything else (an
    expression, tuples of other shapes)."""
    script = facts.model
    places = _places_returned(script.index.own_returns(function), names)
    if not places:
        return []
    found = []
    for call, _ in facts.flow.calls_of(function):
        statement = script.parent(call)
        if not (
            isinstance(statement, cst.Assign)
            and statement.value is call
            and len(statement.targets) == 1
        ):
            continue
        bound = _bound_at(statement.targets[0].target, places)
        found += [(statement, name) for name in bound]
    return found


def unpacked_slot(binding: cst.CSTNode, name: str) -> tuple[cst.Assign, int, int] | None:
    """For ``a, b, _ = call(...)``: the assignment, where ``name`` stands in its one tuple
    target and how many targets it has (the caller checks the call's returned tuples are as
    long: `returned_tuples`); None for any other binding, or a starred target."""
    if not (
        isinstance(binding, cst.Assign)
        and len(binding.targets) == 1
        and isinstance(binding.targets[0].target, cst.Tuple | cst.List)
        and isinstance(binding.value, cst.Call)
    ):
        return None
    elements = binding.targets[0].target.elements
    if any(isinstance(e, cst.StarredElement) for e in elements):
        return None
    slots = [i for i, e in enumerate(elements) if dotted(e.value) == name]
    return (binding, slots[0], len(elements)) if len(slots) == 1 else None


def returned_tuples(values: list[cst.BaseExpression | None]) -> list[cst.Tuple] | None:
    """The tuples a function's returns hand back (``values``: what each ``return`` gives),
    when every one is a tuple written out with nothing starred and all are as long: then a
    caller's slot (`unpacked_slot`) is the element at that place of each. None otherwise."""
    if not values or not all(
        isinstance(v, cst.Tuple) and not any(isinstance(e, cst.StarredElement) for e in v.elements)
        for v in values
    ):
        return None
    tuples = [v for v in values if isinstance(v, cst.Tuple)]
    return tuples if len({len(t.elements) for t in tuples}) == 1 else None


def _places_returned(returns: list[cst.Return], names: set[str]) -> list[int | None]:
    """Where the returns hand back one of ``names``: ``[None]`` for the whole value, else the
    tuple places that hold one in every return (all returns tuples of one length)."""
    if not returns:
        return []
    if all(isinstance(r.value, cst.Name) and r.value.value in names for r in returns):
        return [None]
    tuples = returned_tuples([r.value for r in returns])
    if tuples is None:
        return []
    return [
        place
        for place in range(len(tuples[0].elements))
        if all(
            isinstance(e := t.elements[place].value, cst.Name) and e.value in names for t in tuples
        )
    ]


def _bound_at(target: cst.BaseAssignTargetExpression, places: list[int | None]) -> list[str]:
    """The names ``target`` binds at ``places`` of the returned value."""
    if places == [None]:
        return [target.value] if isinstance(target, cst.Name) else []
    if not isinstance(target, (cst.Tuple, cst.List)) or any(
        isinstance(e, cst.StarredElement) for e in target.elements
    ):
        return []
    return [
        target.elements[place].value.value  # type: ignore[union-attr]
        for place in places
        if place is not None
        and place < len(target.elements)
        and isinstance(target.elements[place].value, cst.Name)
    ]


def discarded_by_every_caller(facts: Facts, returned: cst.Return) -> bool:
    """Every call in the file of the function that ``returned`` leaves drops what it hands back
    (``train_epoch(...)`` alone on its line) or binds it to a name its own function never reads
    (``loss = train_epoch(...)`` inside a k-fold loop that prints only the folds' accuracies):
    the value is never shown, so nothing about how it is computed reaches the user. False
    where a caller is unknown (no call in the file, or the function is handed on by name)."""
    script = facts.model
    function = facts.placement.enclosing_function(returned)
    if not isinstance(function, cst.FunctionDef) or facts.calls.references(function):
        return False
    calls = facts.calls.calls_of(function)
    if not calls:
        return False
    for call, _ in calls:
        line = script.parent(call)
        if isinstance(line, cst.Expr):
            continue
        if not (
            isinstance(line, cst.Assign)
            and len(line.targets) == 1
            and isinstance(line.targets[0].target, cst.Name)
        ):
            return False
        name = line.targets[0].target.value
        scope = facts.placement.enclosing_function(call) or script.module
        spelled = sum(isinstance(n, cst.Name) and n.value == name for n in walk(scope))
        bound = sum(
            isinstance(n, cst.AssignTarget)
            and isinstance(n.target, cst.Name)
            and n.target.value == name
            for n in walk(scope)
        )
        if spelled != bound:
            return False
    return True
