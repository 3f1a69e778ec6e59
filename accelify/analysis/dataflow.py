"""Reads and writes of names inside a block, for questions like "does this metric read a value
that was never gathered": which names a statement reads (with the conditions around it), which it
binds, whether a name is a target, and a fresh local name that shadows nothing."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from accelify.analysis.script_model import Loop, ScriptModel
from accelify.analysis.syntax import (
    children_of,
    dotted,
    has_parameter,
    root_name,
    strip_self_methods,
    target_names,
    walk,
)


def statements(block: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The small statements under ``block`` in source order (not inside nested functions)."""
    for node in walk(block):
        if isinstance(node, cst.SimpleStatementLine):
            yield from node.body


def names_read(small: cst.CSTNode, replaced: set[int], model: ScriptModel, loop: Loop) -> set[str]:
    """Names ``small`` reads, including the tests of the ``if``s and loops around it inside the
    evaluation loop (a count under ``if pred == y:`` depends on both)."""
    skipped: set[int] = set()
    for node in walk(small):
        if id(node) in replaced:
            skipped |= {id(n) for n in walk(node)}
    reads = {
        n.value
        for n in walk(small)
        if isinstance(n, cst.Name)
        and id(n) not in skipped
        and not is_binding(model, n)
        and not is_attribute_name(model, n)
    }
    if isinstance(small, cst.AugAssign):
        reads.discard(root_name(small.target) or "")
    for ancestor in model.ancestors(small):
        if ancestor is loop.node:
            break
        test = (
            getattr(ancestor, "test", None) if isinstance(ancestor, (cst.If, cst.While)) else None
        )
        if isinstance(ancestor, cst.For):
            test = ancestor.iter
        if test is not None:
            reads |= {n.value for n in walk(test) if isinstance(n, cst.Name)}
    return reads


def is_attribute_name(model: ScriptModel, name: cst.Name) -> bool:
    """``data`` of ``outputs.data``: a member's name, not a read of a variable."""
    parent = model.parent(name)
    return isinstance(parent, cst.Attribute) and parent.attr is name


def is_keyword_name(model: ScriptModel, name: cst.Name) -> bool:
    """``model`` of ``build(model=None)``: a parameter's name at a call, not a read."""
    parent = model.parent(name)
    return isinstance(parent, cst.Arg) and parent.keyword is name


def is_name_read(model: ScriptModel, node: cst.CSTNode, name: str) -> bool:
    """``node`` reads the variable ``name``: not a binding of it (``model = ...``), not a
    member's name (``cfg.model``), not a keyword at a call (``build(model=None)``)."""
    return (
        isinstance(node, cst.Name)
        and node.value == name
        and not is_binding(model, node)
        and not is_attribute_name(model, node)
        and not is_keyword_name(model, node)
    )


def variables_in(model: ScriptModel, node: cst.CSTNode) -> set[str]:
    """The variable names under ``node``: ``x`` and ``args`` of ``x.view(args.batch_size)``,
    not the member names ``view`` and ``batch_size``. Read from the tree under ``node`` alone,
    so a tree the analysis never saw (an expression rewritten in memory) is read the same."""
    if isinstance(node, cst.Name) and is_attribute_name(model, node):
        return set()
    found: set[str] = set()
    pending = [node]
    while pending:
        current = pending.pop()
        kind = type(current)
        if kind is cst.Name:
            found.add(current.value)  # type: ignore[attr-defined]
        elif kind is cst.Attribute or kind is cst.Arg:  # not ``model=`` of ``f(model=None)``
            pending.append(current.value)  # type: ignore[attr-defined]
        else:
            pending += children_of(current)
    return found


def bound_by(small: cst.CSTNode) -> set[str]:
    if isinstance(small, cst.Assign):
        return {n for t in small.targets for n in target_names(t.target)}
    if isinstance(small, (cst.AnnAssign, cst.AugAssign)):
        return target_names(small.target)
    return set()


def assigns(scope: cst.CSTNode, name: str) -> bool:
    """``name`` is assigned somewhere under ``scope`` (``=``, ``+=``, an annotated one)."""
    return any(name in bound_by(node) for node in walk(scope))


def sees_binding(model: ScriptModel, node: cst.CSTNode, name: str, scope: cst.CSTNode) -> bool:
    """``node`` reads the ``name`` that ``scope`` binds: it is in that scope, or in functions
    nested in it none of which binds a ``name`` of its own (a parameter, an assignment)."""
    if model.scope_of(node) is scope:
        return True
    for ancestor in model.ancestors(node):
        if ancestor is scope:
            return True
        if isinstance(ancestor, cst.FunctionDef) and (
            has_parameter(ancestor, name) or assigns(ancestor, name)
        ):
            return False
    return False


def plain_targets(target: cst.BaseExpression) -> list[str] | None:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)) and all(
        isinstance(e, cst.Element) and isinstance(e.value, cst.Name) for e in target.elements
    ):
        return [e.value.value for e in target.elements]  # type: ignore[union-attr]
    return None


def is_binding(model: ScriptModel, node: cst.CSTNode) -> bool:
    """``node`` is (part of) an assignment target, not a read."""
    current: cst.CSTNode | None = node
    while current is not None:
        parent = model.parent(current)
        if isinstance(parent, (cst.AssignTarget,)):
            return True
        if isinstance(parent, (cst.AugAssign, cst.AnnAssign)) and parent.target is current:
            return True
        if isinstance(parent, cst.For) and parent.target is current:
            return True
        if not isinstance(parent, (cst.Tuple, cst.List, cst.Element, cst.StarredElement)):
            return False
        current = parent
    return False


def within(model: ScriptModel, node: cst.CSTNode, container: cst.CSTNode | None) -> bool:
    return container is not None and (
        node is container or any(a is container for a in model.ancestors(node))
    )


def between(model: ScriptModel, node: cst.CSTNode, top: cst.CSTNode) -> Iterator[cst.CSTNode]:
    for ancestor in model.ancestors(node):
        if ancestor is top:
            return
        yield ancestor


def names_in_scope(model: ScriptModel, scope: cst.CSTNode) -> set[str]:
    """Names a new local of ``scope`` could shadow: its own, and the module's globals."""

    taken = variables_in(model, scope)
    for statement in model.module.body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            taken.add(statement.name.value)
        else:
            taken |= variables_in(model, statement)
    return taken


def fresh(base: str, taken: set[str]) -> str:
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


def local_alias(model: ScriptModel, name: str, at: cst.CSTNode) -> str | None:
    """What a function's local ``name`` stands for at ``at`` when the function binds it once,
    to another object's name (``model = self.model.train()``: ``self.model``; ``.train()``,
    ``.eval()`` and ``.to()`` hand the module back). None when it binds it otherwise or not at
    all: then ``name`` is not the module-level object of the same name either."""
    function = model.index.enclosing_function(at)
    if function is None:
        return None
    values = model.index.assigned_under(function).get(name, [])
    if len(values) != 1:
        return None
    return dotted(strip_self_methods(values[0]))
