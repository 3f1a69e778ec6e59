"""Dicts of named loaders read with a key the analysis cannot read (``loaders[split]``): what
makes one safe to follow, and what says the loop may read a DataLoader when it is not.

A gather is right only when every loader the key may pick is known prepared. A dict that gains
an entry after it is made (``loaders["test"] = DataLoader(...)``), is bound twice, by a walrus,
in another function (a closure), or handed a list at another call site holds loaders the
analysis does not see: followed as it was made, its loop would be gathered over an unprepared
loader (the whole set counted N times), and not followed at all, the loop would report one
rank's shard with no word. `may_hold_a_loader` tells the evaluation to leave such a loop as it
is, with a review line."""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from accelify.analysis.syntax import dotted, walk

#: The methods of a dict that change its entries in place.
_MUTATORS = frozenset({"update", "setdefault", "pop", "popitem", "clear", "__setitem__"})


def keyed_subscript(iterated: cst.BaseExpression) -> cst.Subscript | None:
    """``loaders[split]`` (also inside ``enumerate(...)``/``tqdm(...)``) with one key that is not
    a literal: None for anything else."""
    node = iterated
    while isinstance(node, cst.Call) and node.args:
        node = node.args[0].value
    if (
        isinstance(node, cst.Subscript)
        and len(node.slice) == 1
        and isinstance(node.slice[0].slice, cst.Index)
        and not isinstance(node.slice[0].slice.value, (cst.SimpleString, cst.Integer))
    ):
        return node
    return None


def mutated_keys(name: str, scope: cst.CSTNode) -> set[str] | None:
    """The string keys of ``name`` stored or deleted in ``scope`` after it is made
    (``name["test"] = v``, ``del name["val"]``): a display's other entries still hold what it
    was made with. None where what changes is not known: a key that is not a literal, a
    mutating method (``name.update(...)``), ``name |= ...``."""
    keys: set[str] = set()
    for node in walk(scope):
        if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.Del)):
            targets = (
                [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            )
            for target in targets:
                if isinstance(node, cst.AugAssign) and dotted(target) == name:
                    return None
                if isinstance(target, cst.Subscript) and dotted(target.value) == name:
                    key = _string_key(target)
                    if key is None:
                        return None
                    keys.add(key)
        elif (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value in _MUTATORS
            and dotted(node.func.value) == name
        ):
            return None
    return keys


def _string_key(target: cst.Subscript) -> str | None:
    """``"test"`` of ``name["test"]``; None for any other key."""
    if len(target.slice) != 1 or not isinstance(target.slice[0].slice, cst.Index):
        return None
    key = target.slice[0].slice.value
    if isinstance(key, cst.SimpleString):
        value = key.evaluated_value
        return value if isinstance(value, str) else None
    return None


def may_hold_a_loader(
    names: set[str], module: cst.Module, is_loader: Callable[[str, cst.CSTNode], bool]
) -> bool:
    """Any value bound anywhere in the file to one of ``names`` (an assignment, an annotated
    one, a walrus, an item stored into it) holds a DataLoader: a name ``is_loader`` says is one,
    or a ``DataLoader(...)`` call, at any depth of the value."""
    for node in walk(module):
        value: cst.BaseExpression | None = None
        if isinstance(node, cst.Assign):
            targets = [t.target for t in node.targets]
        elif isinstance(node, (cst.AnnAssign, cst.NamedExpr)):
            targets = [node.target]
        else:
            continue
        if any(_binds(t, names) for t in targets):
            value = node.value
        if value is not None and holds_a_loader(value, is_loader):
            return True
    return False


def holds_a_loader(
    value: cst.BaseExpression, is_loader: Callable[[str, cst.CSTNode], bool]
) -> bool:
    """``value`` holds a DataLoader at any depth: a name ``is_loader`` says is one, or a
    ``DataLoader(...)`` call (``{"val": vl, "test": DataLoader(...)}`` written in a call)."""
    for part in walk(value):
        if isinstance(part, cst.Call) and _names_a_loader_class(part.func):
            return True
        name = dotted(part) if isinstance(part, (cst.Name, cst.Attribute)) else None
        if name is not None and is_loader(name, part):
            return True
    return False


def _binds(target: cst.BaseExpression, names: set[str]) -> bool:
    """``target`` binds one of ``names`` or stores an item into it."""
    if isinstance(target, cst.Subscript):
        target = target.value
    return dotted(target) in names


def _names_a_loader_class(func: cst.BaseExpression) -> bool:
    """``DataLoader(...)``/``data.DataLoader(...)``: over-reading here costs a review line."""
    return (dotted(func) or "").rsplit(".", 1)[-1] == "DataLoader"
