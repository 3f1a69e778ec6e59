"""Names a loop takes from a collection: ``loader`` in ``for name, loader in loaders.items():``,
``for loader in loaders.values():``, ``for loader in (val_loader, test_loader):`` or ``for name,
loader, opt in [("train", train_loader, optimizer), ("val", val_loader, None)]:``, written as a
``for`` statement or a comprehension around the place that reads it.

Evaluating several sets by one loop (``{name: evaluate(model, loader) for name, loader in
eval_loaders.items()}``) is common; without this, ``loader`` is no DataLoader to the analysis,
the loop that reads it gathers nothing, and each rank's totals cover its own shard.
"""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted, has_parameter, target_names, walk

_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)
_COMPREHENSION_TYPES = frozenset(_COMPREHENSIONS)


def iterated_sources(model: ScriptModel, name: str, at: cst.CSTNode) -> list[str]:
    """What ``name`` is taken from by the innermost loop around ``at`` whose target binds it:
    the collection's name for ``.items()`` and ``.values()``, the elements' names for a literal
    tuple or list of names. Empty when no such loop binds it."""
    for ancestor in model.ancestors(at):
        for target, iterable in _loops_binding(ancestor, at, model):
            sources = _taken_from(target, iterable, name)
            if sources is None:
                sources = _taken_from_rows(model, target, iterable, ancestor, name)
            if sources is not None:
                return sources
    return []


def _taken_from_rows(
    model: ScriptModel,
    target: cst.BaseExpression,
    iterable: cst.BaseExpression,
    at: cst.CSTNode,
    name: str,
) -> list[str] | None:
    """The names ``name`` takes pass by pass from rows written out (`row_bindings`), when each
    pass binds it to a name; None when the loop does not bind it so."""
    passes = row_bindings(model, target, iterable, at)
    if not passes or any(name not in bound for bound in passes):
        return None
    names = [dotted(bound[name]) for bound in passes]
    return names if all(n is not None for n in names) else None  # type: ignore[return-value]


def row_bindings(
    model: ScriptModel, target: cst.BaseExpression, iterable: cst.BaseExpression, at: cst.CSTNode
) -> list[dict[str, cst.BaseExpression]] | None:
    """What ``for target in iterable`` binds in each pass, when the rows are written out: a
    list or tuple of tuples (``[("train", train_loader, optimizer), ("val", val_loader,
    None)]``), also through the one name assigned it, or a ``zip``/``enumerate`` of such lists
    (``zip(["train", "val"], [train_loader, val_loader])``). The target may nest (``name,
    (loader, opt)``) and star (``name, loader, *_``): a starred name and an ``enumerate`` count
    are left out of the mapping. What the loop's body unpacks from the row or its starred tail
    (``for name, *rest in rows: loader, opt = rest``) is bound too, where its shape is written
    out: it is the same entry of the row. None when a row or its shape is not written out."""
    rows = _rows(model, iterable, at)
    if rows is None:
        return None
    unpacks = _body_unpacks(model, at) if type(at) is cst.For and at.target is target else []
    passes = []
    for row in rows:
        bound: dict[str, cst.BaseExpression] = {}
        tails: dict[str, _Row] = {}
        if not _bind(target, row, bound, tails):
            return None
        for unpacked, source in unpacks:
            value = _entry(source, bound, tails)
            read = dict(bound)
            if value is not None and _bind(unpacked, value, read, tails):
                bound = read
        passes.append(bound)
    return passes


def unread_row_entries(model: ScriptModel, name: str, at: cst.CSTNode) -> list[str]:
    """Every name an entry of the written-out rows holds (``train_loader``, ``val_loader``,
    ``optimizer``), when the innermost ``for`` over them around ``at`` does not bind ``name``
    by its target, yet a statement of its body takes ``name`` from what the target binds in a
    way `row_bindings` cannot read (``loader, opt = rest.pop(0), rest.pop(0)``): ``name`` may
    be any of them in each pass. Empty when no such loop binds it."""
    for ancestor in model.ancestors(at):
        if type(ancestor) is not cst.For or _within(model, at, ancestor.iter):
            continue
        if name in target_names(ancestor.target):
            return []
        if not _takes_from_the_row(model, ancestor, name):
            continue
        rows = _rows(model, ancestor.iter, ancestor)
        passes = row_bindings(model, ancestor.target, ancestor.iter, ancestor)
        if rows is None or (passes is not None and all(name in p for p in passes)):
            return []
        return list(dict.fromkeys(n for row in rows for n in _held_names(row)))
    return []


def _takes_from_the_row(model: ScriptModel, loop: cst.For, name: str) -> bool:
    """A statement directly in ``loop``'s body assigns ``name`` from a name its target binds."""
    return any(
        name in target_names(t.target)
        for statement in _assigned_from_the_row(loop)
        for t in statement.targets
    )


def _assigned_from_the_row(loop: cst.For) -> Iterator[cst.Assign]:
    """The assignments directly in ``loop``'s body whose value reads a name its target binds
    (``loader, opt = rest``, ``loader = rest.pop(0)``)."""
    bound_by_loop = target_names(loop.target)
    for line in loop.body.body:
        if type(line) is not cst.SimpleStatementLine:
            continue
        for statement in line.body:
            if type(statement) is cst.Assign and any(
                type(n) is cst.Name and n.value in bound_by_loop for n in walk(statement.value)
            ):
                yield statement


def _held_names(value: cst.BaseExpression | None) -> list[str]:
    """The names a row holds, also inside tuples and lists it nests (and a ``zip``'s rows)."""
    if value is None:
        return []
    if isinstance(value, (_Row, tuple)):
        return [n for entry in value for n in _held_names(entry)]
    if isinstance(value, (cst.Tuple, cst.List)):
        return [n for e in value.elements for n in _held_names(e.value)]
    name = dotted(value)
    return [name] if name is not None else []


def _body_unpacks(
    model: ScriptModel, loop: cst.For
) -> list[tuple[cst.BaseExpression, cst.BaseExpression]]:
    """``(loader, opt)`` and ``rest`` of ``loader, opt = rest`` (or ``loader = rest[0]``), a
    statement of the loop's own body taking entries of a name its target binds, when nothing
    else in the loop binds what it assigns (a later ``loader = ...`` would make the row's entry
    only its first value)."""
    return [
        (statement.targets[0].target, statement.value)
        for statement in _assigned_from_the_row(loop)
        if len(statement.targets) == 1 and _only_binding_in(model, statement, loop)
    ]


def _entry(
    value: cst.BaseExpression, bound: dict[str, cst.BaseExpression], tails: dict[str, _Row]
) -> cst.BaseExpression | _Row | None:
    """What ``value`` is in one pass: a name the row binds, its starred tail, an entry of
    either by a written index (``rest[0]``), or a tuple of those; None when not written out."""
    if type(value) is cst.Name:
        return tails.get(value.value, bound.get(value.value))
    if type(value) in (cst.Tuple, cst.List):
        if any(isinstance(e, cst.StarredElement) for e in value.elements):  # type: ignore[attr-defined]
            return None
        return _Row(_entry(e.value, bound, tails) for e in value.elements)  # type: ignore[attr-defined]
    if type(value) is not cst.Subscript or len(value.slice) != 1:  # type: ignore[attr-defined]
        return None
    index = value.slice[0].slice  # type: ignore[attr-defined]
    if type(index) is not cst.Index or type(index.value) is not cst.Integer:
        return None
    whole = _entry(value.value, bound, tails)  # type: ignore[attr-defined]
    entries = _entries_of(whole)
    if entries is None:
        return None
    position = int(index.value.value)
    return entries[position] if position < len(entries) else None


def _only_binding_in(model: ScriptModel, assign: cst.Assign, loop: cst.For) -> bool:
    """Nothing in ``loop`` but ``assign`` binds a name ``assign`` binds."""
    for name in target_names(assign.targets[0].target):
        bindings = model.index.assignments_to(name) + model.index.unpacked_assignments_to(name)
        if any(other is not assign and _within(model, other, loop) for other in bindings):
            return False
        if any(
            _within(model, node, loop) and name in target_names(node.target)
            for node in model.index.of_type(cst.For)
        ):
            return False
    return True


def _rows(
    model: ScriptModel, iterable: cst.BaseExpression, at: cst.CSTNode
) -> list[cst.BaseExpression | None] | None:
    """The values iterating ``iterable`` gives, in order; None (an element) where a pass gives
    a value not written out (the count of ``enumerate``, a row ``zip`` builds holds them)."""
    literal = literal_sequence(model, iterable, at)
    if literal is not None:
        if any(isinstance(e, cst.StarredElement) for e in literal.elements):
            return None
        return [e.value for e in literal.elements]
    if not isinstance(iterable, cst.Call) or dotted(iterable.func) not in ("zip", "enumerate"):
        return None
    if any(a.star or a.keyword is not None for a in iterable.args) or not iterable.args:
        return None
    columns = [_rows(model, a.value, at) for a in iterable.args]
    if any(c is None for c in columns):
        return None
    if dotted(iterable.func) == "enumerate":
        if len(columns) != 1:
            return None
        columns = [[None] * len(columns[0]), columns[0]]  # type: ignore[arg-type]
    return [_Row(values) for values in zip(*columns, strict=False)]  # type: ignore[misc]


class _Row(tuple):  # type: ignore[type-arg]
    """The values one pass of a ``zip`` gives, one per zipped sequence: a row no tuple of the
    source holds as written."""


def _entries_of(
    value: cst.BaseExpression | _Row | None,
) -> list[cst.BaseExpression | _Row | None] | None:
    """The entries of a row as written (a ``zip``'s `_Row`, a tuple or list display without a
    starred entry), in order; None when they are not written out."""
    if isinstance(value, _Row):
        return list(value)
    if isinstance(value, (cst.Tuple, cst.List)) and not any(
        isinstance(e, cst.StarredElement) for e in value.elements
    ):
        return [e.value for e in value.elements]
    return None


def _bind(
    target: cst.BaseExpression,
    value: cst.BaseExpression | _Row | None,
    bound: dict[str, cst.BaseExpression],
    tails: dict[str, _Row],
) -> bool:
    """Adds what ``target`` binds when assigned ``value`` to ``bound``, and the entries a
    starred name takes to ``tails``; False when the value's shape is not written out where
    the target unpacks it."""
    if isinstance(target, cst.Name):
        if value is not None and not isinstance(value, _Row):
            bound[target.value] = value
        return True
    if not isinstance(target, (cst.Tuple, cst.List)):
        return False
    values = _entries_of(value)
    if values is None:
        return False
    parts = list(target.elements)
    stars = [i for i, e in enumerate(parts) if isinstance(e, cst.StarredElement)]
    if len(stars) > 1:
        return False
    if stars:
        star = stars[0]
        after = len(parts) - star - 1
        if len(values) < len(parts) - 1:
            return False
        paired = list(zip(parts[:star], values, strict=False))
        paired += list(zip(parts[star + 1 :], values[len(values) - after :], strict=True))
        starred = parts[star].value
        if type(starred) is cst.Name:
            tails[starred.value] = _Row(values[star : len(values) - after])
    elif len(values) != len(parts):
        return False
    else:
        paired = list(zip(parts, values, strict=True))
    return all(_bind(part.value, v, bound, tails) for part, v in paired)


def literal_sequence(
    model: ScriptModel, node: cst.BaseExpression, at: cst.CSTNode
) -> cst.List | cst.Tuple | None:
    """``["train", "val"]`` written in the ``for``, or in the one assignment of the name it
    reads (``phases = ["train", "val"]`` in the same function, or at module level)."""
    if isinstance(node, (cst.List, cst.Tuple)):
        return node
    if not isinstance(node, cst.Name):
        return None
    scope = model.scope_of(at)
    if isinstance(scope, cst.FunctionDef) and has_parameter(scope, node.value):
        return None  # a parameter: what the callers pass
    assigns = [
        a
        for a in model.index.assignments_to(node.value)
        if model.scope_of(a) in (scope, model.module)
    ]
    if len(assigns) != 1 or not isinstance(assigns[0].value, (cst.List, cst.Tuple)):
        return None
    return assigns[0].value


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


def _names(values: list[cst.BaseExpression]) -> list[str] | None:
    """Each value's name, or None unless every value is one."""
    found = [dotted(value) for value in values]
    return found if found and all(f is not None for f in found) else None  # type: ignore[return-value]
