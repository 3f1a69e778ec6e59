"""Tests of a value's structure, not of its numbers: ``'loss' not in out``, ``isinstance(out,
dict)``, ``hasattr(out, "loss")``, ``out.aux is None``, ``len(outputs) > 1`` of what the model
returns. What the model returns has the same keys, types and optional heads on every rank (the
same code and config built it), so such a test decides alike on every rank even where the
values inside come from this rank's batch. Stops decided per rank (ACC420, `own_stops`) read
values: a loss, a NaN check, a counter; a name the test reads only in these positions is left
out of them (vilmedic's ``if 'loss' not in out: continue`` for a model that trains itself)."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.loss_sources import last_binding
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import children_of, dotted

#: Calls whose answer depends on the argument's type or members, not on its numbers.
_STRUCTURE_CALLS = frozenset({"isinstance", "hasattr", "callable", "type"})


def structure_only_names(
    test: cst.BaseExpression, returned: frozenset[str] = frozenset()
) -> set[str]:
    """The names ``test`` reads only in tests of structure: a constant key's presence, a type,
    a member's presence, ``is None``; ``len(name)`` only where ``name`` is in ``returned`` (what
    a model call returned: the number of its outputs). A name read anywhere else in the test
    (``out is not None and out.loss.isnan()``) is a value read and not in the result."""
    structural: set[str] = set()
    valued: set[str] = set()
    pending: list[tuple[cst.CSTNode, bool]] = [(test, False)]
    while pending:
        node, inside = pending.pop()
        if isinstance(node, cst.Name):
            (structural if inside else valued).add(node.value)
            continue
        if isinstance(node, cst.Attribute):
            pending.append((node.value, inside))  # ``out`` of ``out.aux``, not the member's name
            continue
        parts = _structure_parts(node, returned)
        if parts is not None:
            pending += [(part, True) for part in parts]
            continue
        pending += [(child, inside) for child in children_of(node)]
    return structural - valued


def _structure_parts(node: cst.CSTNode, returned: frozenset[str]) -> list[cst.CSTNode] | None:
    """The operands ``node`` tests the structure of, or None when it is no structure test."""
    if isinstance(node, cst.Comparison) and len(node.comparisons) == 1:
        target = node.comparisons[0]
        operator = target.operator
        if isinstance(operator, cst.In | cst.NotIn) and _constant(node.left):
            return [target.comparator]  # ``'loss' not in out``
        if isinstance(operator, cst.Is | cst.IsNot):
            if _none(target.comparator):
                return [node.left]  # ``out.aux is None``
            if _none(node.left):
                return [target.comparator]
        if _length_of_returned(node.left, returned) and _constant(target.comparator):
            return [node.left]  # ``len(outputs) > 1``
        if _type_call(node.left) and isinstance(operator, cst.Is | cst.IsNot | cst.Equal):
            return [node.left]  # ``type(out) is dict``
    if (
        isinstance(node, cst.Call)
        and dotted(node.func) in _STRUCTURE_CALLS
        and node.args
        and all(_constant(a.value) or _typeish(a.value) for a in node.args[1:])
    ):
        return [node.args[0].value]  # ``isinstance(out, dict)``, ``hasattr(out, "loss")``
    return None


def _constant(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.SimpleString | cst.Integer | cst.ConcatenatedString)


def _none(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def _typeish(node: cst.CSTNode) -> bool:
    """A type or tuple of types: ``dict``, ``torch.Tensor``, ``(list, tuple)``."""
    if isinstance(node, cst.Tuple):
        return all(_typeish(e.value) for e in node.elements)
    return isinstance(node, cst.Name | cst.Attribute)


def _type_call(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Call) and dotted(node.func) == "type" and len(node.args) == 1


def _length_of_returned(node: cst.CSTNode, returned: frozenset[str]) -> bool:
    return (
        isinstance(node, cst.Call)
        and dotted(node.func) == "len"
        and len(node.args) == 1
        and isinstance(node.args[0].value, cst.Name)
        and node.args[0].value.value in returned
    )


def model_outputs(script: ScriptModel, names: set[str], at: cst.CSTNode) -> frozenset[str]:
    """Those of ``names`` whose last binding above ``at`` holds what a call of a model returned
    (``out = self.model(**batch)``): its number of outputs is the model's, not the batch's."""
    models = script.names_of(Kind.MODEL) | script.prepared_names
    found = set()
    for name in names:
        binding = last_binding(script, name, at)
        value = getattr(binding, "value", None)
        if isinstance(value, cst.Call) and dotted(value.func) in models:
            found.add(name)
    return frozenset(found)
