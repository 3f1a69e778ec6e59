"""Where a helper's returned local goes: the object model treats a list a helper builds and
returns as the same object its callers hold (``embeddings = extract(loader, model)``), so what
happens to it there (a gather after the helper's loop) is what happens to the helper's local."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

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


def _places_returned(returns: list[cst.Return], names: set[str]) -> list[int | None]:
    """Where the returns hand back one of ``names``: ``[None]`` for the whole value, else the
    tuple places that hold one in every return (all returns tuples of one length)."""
    if not returns:
        return []
    if all(isinstance(r.value, cst.Name) and r.value.value in names for r in returns):
        return [None]
    tuples = [r.value for r in returns]
    if not all(isinstance(t, cst.Tuple) for t in tuples):
        return []
    sizes = {len(t.elements) for t in tuples}  # type: ignore[union-attr]
    if len(sizes) != 1 or any(
        isinstance(e, cst.StarredElement)
        for t in tuples
        for e in t.elements  # type: ignore[union-attr]
    ):
        return []
    return [
        place
        for place in range(sizes.pop())
        if all(
            isinstance(e := t.elements[place].value, cst.Name) and e.value in names  # type: ignore[union-attr]
            for t in tuples
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
