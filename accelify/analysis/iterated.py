"""Names a loop takes from a collection: ``loader`` in ``for name, loader in loaders.items():``,
``for loader in loaders.values():`` or ``for loader in (val_loader, test_loader):``, written as a
``for`` statement or a comprehension around the place that reads it.

Evaluating several sets by one loop (``{name: evaluate(model, loader) for name, loader in
eval_loaders.items()}``) is common; without this, ``loader`` is no DataLoader to the analysis,
the loop that reads it gathers nothing, and each rank's totals cover its own shard.
"""

from __future__ import annotations

import libcst as cst

from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted

_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)
_COMPREHENSION_TYPES = frozenset(_COMPREHENSIONS)


def iterated_sources(model: ScriptModel, name: str, at: cst.CSTNode) -> list[str]:
    """What ``name`` is taken from by the innermost loop around ``at`` whose target binds it:
    the collection's name for ``.items()`` and ``.values()``, the elements' names for a literal
    tuple or list of names. Empty when no such loop binds it."""
    for ancestor in model.ancestors(at):
        for target, iterable in _loops_binding(ancestor, at, model):
            sources = _taken_from(target, iterable, name)
            if sources is not None:
                return sources
    return []


def _loops_binding(
    node: cst.CSTNode, at: cst.CSTNode, model: ScriptModel
) -> list[tuple[cst.BaseExpression, cst.BaseExpression]]:
    """(target, iterable) of the loop ``node`` is, when ``at`` is inside what it repeats."""
    kind = type(node)  # exact types (none has subclasses): asked of every ancestor of ``at``
    if kind is cst.For and not _within(model, at, node.iter):  # type: ignore[attr-defined]
        return [(node.target, node.iter)]  # type: ignore[attr-defined]
    if kind in _COMPREHENSION_TYPES:
        found = []
        clause: cst.CompFor | None = node.for_in
        while clause is not None:
            if not _within(model, at, clause.iter):
                found.append((clause.target, clause.iter))
            clause = clause.inner_for_in
        return found
    return []


def _within(model: ScriptModel, node: cst.CSTNode, container: cst.CSTNode) -> bool:
    return node is container or any(a is container for a in model.ancestors(node))


def _taken_from(
    target: cst.BaseExpression, iterable: cst.BaseExpression, name: str
) -> list[str] | None:
    """What ``name`` takes from ``iterable`` when ``target`` binds it, or None."""
    if dotted(target) == name:
        return _yields(iterable)
    if not isinstance(target, cst.Tuple | cst.List):
        return None
    parts = [element.value for element in target.elements]
    method = _method(iterable)
    if method == "items" and len(parts) == 2 and dotted(parts[1]) == name:
        return [dotted(iterable.func.value)]  # type: ignore[attr-defined, list-item]
    if _displayed_items(iterable) and len(parts) == 2 and dotted(parts[1]) == name:
        return _names([e.value for e in iterable.func.value.elements])  # type: ignore[attr-defined]
    rows = _rows(iterable, len(parts))
    if rows is not None:
        for index, part in enumerate(parts):
            if dotted(part) == name:
                return _names([row[index] for row in rows])
    if isinstance(iterable, cst.Call) and dotted(iterable.func) in {"zip", "enumerate"}:
        arguments = [a.value for a in iterable.args if not a.star and a.keyword is None]
        if dotted(iterable.func) == "enumerate":
            arguments = [cst.Name("_"), *arguments[:1]]
        if len(arguments) == len(parts):
            for part, argument in zip(parts, arguments, strict=True):
                if dotted(part) == name:
                    return _taken_from(part, argument, name)
    return None


def _yields(iterable: cst.BaseExpression) -> list[str] | None:
    """The names iterating ``iterable`` yields: ``loaders.values()``, ``(val_loader,
    test_loader)``; None for anything else."""
    if _method(iterable) == "values":
        return [dotted(iterable.func.value)]  # type: ignore[attr-defined, list-item]
    if isinstance(iterable, cst.Tuple | cst.List):
        elements = [dotted(e.value) for e in iterable.elements]
        if elements and all(e is not None for e in elements):
            return elements  # type: ignore[return-value]
    return None


def _method(iterable: cst.BaseExpression) -> str | None:
    """``items`` or ``values`` for ``loaders.items()`` on a named collection, else None."""
    if (
        isinstance(iterable, cst.Call)
        and isinstance(iterable.func, cst.Attribute)
        and not iterable.args
        and dotted(iterable.func.value) is not None
    ):
        return iterable.func.attr.value
    return None


def _displayed_items(iterable: cst.BaseExpression) -> bool:
    """``{"train": tl, "val": vl}.items()``: a dict written where it is iterated."""
    return (
        isinstance(iterable, cst.Call)
        and not iterable.args
        and isinstance(iterable.func, cst.Attribute)
        and iterable.func.attr.value == "items"
        and isinstance(iterable.func.value, cst.Dict)
        and all(isinstance(e, cst.DictElement) for e in iterable.func.value.elements)
    )


def _rows(iterable: cst.BaseExpression, width: int) -> list[list[cst.BaseExpression]] | None:
    """The elements of ``[("train", tl), ("val", vl)]``, a literal list or tuple of tuples as
    wide as the loop's target: each row binds the target's names in turn. None otherwise."""
    if not isinstance(iterable, cst.Tuple | cst.List) or not iterable.elements:
        return None
    rows = []
    for element in iterable.elements:
        row = element.value
        if not isinstance(row, cst.Tuple | cst.List) or len(row.elements) != width:
            return None
        rows.append([e.value for e in row.elements])
    return rows


def _names(values: list[cst.BaseExpression]) -> list[str] | None:
    """Each value's name, or None unless every value is one."""
    found = [dotted(value) for value in values]
    return found if found and all(f is not None for f in found) else None  # type: ignore[return-value]
