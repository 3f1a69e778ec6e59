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
    embeddings``): each caller's ``result = function(...)`` that binds the result to one name,
    and that name. Empty where a return hands back anything else (a tuple, an expression)."""
    script = facts.model
    returns = script.index.own_returns(function)
    if not returns or not all(
        isinstance(r.value, cst.Name) and r.value.value in names for r in returns
    ):
        return []
    found = []
    for call, _ in facts.flow.calls_of(function):
        statement = script.parent(call)
        if (
            isinstance(statement, cst.Assign)
            and statement.value is call
            and len(statement.targets) == 1
            and isinstance(statement.targets[0].target, cst.Name)
        ):
            found.append((statement, statement.targets[0].target.value))
    return found
