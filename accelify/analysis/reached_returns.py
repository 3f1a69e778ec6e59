"""The ``return`` of a forward one call reaches, where an argument the call passes decides it.

A language model's ``forward(self, x, targets=None)`` returns ``logits`` when ``targets is
None`` and ``logits, loss`` otherwise: ``_, loss = model(x, targets)`` reaches the second, and
drops only what it returns, which says which members go without a gradient. Only the plain
shape is read: top-level ``if <parameter> is None:`` / ``is not None:`` tests (``elif`` and
``else`` included) on a parameter the call passes (anything but ``None``) or leaves at its
default of ``None``, and ``return`` statements outside any other block. Anything else that may
return (a loop, a ``with``, another test) leaves the answer unknown.
"""

from __future__ import annotations

import libcst as cst

from accelify.analysis.objects import bound_arguments
from accelify.analysis.syntax import holds_own

#: `_walk`'s answer where the statements run to their end without a ``return``.
_FALLS_THROUGH = object()


def reached_return(forward: cst.FunctionDef, call: cst.Call) -> cst.Return | None:
    """The ``return`` of ``forward`` (a method: its first parameter is the instance) that
    ``call`` reaches; None where it cannot be told (see the module's docstring)."""
    if any(argument.star for argument in call.args):
        return None
    passed = {name: argument.value for name, argument in bound_arguments(forward, call, 1)}
    parameters = [*forward.params.params, *forward.params.kwonly_params]
    defaults = {p.name.value: p.default for p in parameters}
    found = _walk(forward.body, passed, defaults)
    return found if isinstance(found, cst.Return) else None


def _walk(
    block: cst.BaseSuite,
    passed: dict[str, cst.BaseExpression],
    defaults: dict[str, cst.BaseExpression | None],
) -> object:
    """The ``return`` the statements of ``block`` reach, `_FALLS_THROUGH`, or None (unknown)."""
    statements = block.body if isinstance(block, cst.IndentedBlock) else [block]
    for statement in statements:
        if isinstance(statement, cst.SimpleStatementLine):
            returned = [s for s in statement.body if isinstance(s, cst.Return)]
            if returned:
                return returned[0]
            continue
        if isinstance(statement, cst.If):
            found = _walk_if(statement, passed, defaults)
            if found is not _FALLS_THROUGH:
                return found
            continue
        if holds_own(statement, cst.Return):
            return None
    return _FALLS_THROUGH


def _walk_if(
    statement: cst.If,
    passed: dict[str, cst.BaseExpression],
    defaults: dict[str, cst.BaseExpression | None],
) -> object:
    decided = _none_test(statement.test, passed, defaults)
    if decided is None:
        return None if holds_own(statement, cst.Return) else _FALLS_THROUGH
    if decided:
        return _walk(statement.body, passed, defaults)
    other = statement.orelse
    if isinstance(other, cst.If):
        return _walk_if(other, passed, defaults)
    if isinstance(other, cst.Else):
        return _walk(other.body, passed, defaults)
    return _FALLS_THROUGH


def _none_test(
    test: cst.BaseExpression,
    passed: dict[str, cst.BaseExpression],
    defaults: dict[str, cst.BaseExpression | None],
) -> bool | None:
    """Whether ``test`` (``targets is None``, ``targets is not None``) holds at the call."""
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1):
        return None
    target = test.comparisons[0]
    if not (
        isinstance(test.left, cst.Name)
        and _is_none(target.comparator)
        and isinstance(target.operator, (cst.Is, cst.IsNot))
    ):
        return None
    name = test.left.value
    if name in passed:
        # a value the call passes (``targets`` of the batch) is taken as not None: unpacking
        # the other return's outputs (``_, loss = model(x, None)``) would fail in the original
        holds = _is_none(passed[name])
    elif name in defaults and defaults[name] is not None and _is_none(defaults[name]):
        holds = True
    else:
        return None
    return holds if isinstance(target.operator, cst.Is) else not holds


def _is_none(node: cst.CSTNode | None) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"
