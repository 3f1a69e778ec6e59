"""Sizes the ranks agree on although the tensor comes from this rank's batch: a clip cut from
each sample at its own random start but of one length every rank agrees on (StyleTTS2's
``train_first.py``: ``mel_len = min(int(gather(mel_input_length).min() / 2 - 1), max_len // 2)``,
``gt.append(mels[bib, :, start * 2:(start + mel_len) * 2])``, ``gt = torch.stack(gt)``, then
``if gt.shape[-1] < 80: continue``). The slice's extent, ``(start + mel_len) * 2 - start * 2``,
does not change with the rank's own ``start``; ``mel_len`` came through a gather. A test of
that size decides alike on every rank, so ACC420 leaves it (`own_stops`).

Only a slice on a later axis than the first is judged (the first is the batch's, cut by
the last batch's size), and only arithmetic (``+ - * //``, integers, names): the extent is
evaluated with the rank's own names set to several values, those the ranks agree on held."""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from accelify.analysis.loss_sources import last_binding
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted, walk

#: The values the rank's own names take in turn; the ranks' agreed names hold ``_HELD``.
_TRIALS = (3, 11, 29)
_HELD = 7

#: Calls that join a list of equal tensors along a new or the first axis.
_JOINS = frozenset({"torch.stack", "torch.cat", "torch.vstack"})

#: Tensor methods that keep the shape (``.detach()``, ``.float()``, ``.to(device)``).
_SHAPE_KEEPING = frozenset({"detach", "float", "half", "to", "contiguous", "clone", "cpu"})

OwnName = Callable[[cst.Name, cst.CSTNode], bool]


def agreed_size_names(
    script: ScriptModel, test: cst.BaseExpression, at: cst.CSTNode, own: OwnName
) -> set[str]:
    """The names ``test`` reads only as a size the ranks agree on (``gt.shape[-1]``,
    ``gt.size(2)``). ``own(name, at)``: whether a name read at ``at`` holds this rank's own
    value (from its shard), as the rule asking judges it."""
    sized: set[str] = set()
    valued: set[str] = set()
    for node in walk(test):
        size = _size_read(node)
        if size is not None:
            name, axis = size
            if _agreed_extent(script, name, axis, at, own):
                sized.add(name)
                continue
    for node in walk(test):
        if isinstance(node, cst.Name) and not _inside_size(node, test):
            valued.add(node.value)
    return sized - valued


def _size_read(node: cst.CSTNode) -> tuple[str, int] | None:
    """``x.shape[k]`` or ``x.size(k)`` with a constant ``k``: (``x``, ``k``)."""
    if (
        isinstance(node, cst.Subscript)
        and isinstance(node.value, cst.Attribute)
        and node.value.attr.value == "shape"
        and isinstance(node.value.value, cst.Name)
        and len(node.slice) == 1
        and isinstance(node.slice[0].slice, cst.Index)
    ):
        axis = _constant(node.slice[0].slice.value)
        if axis is not None:
            return node.value.value.value, axis
    if (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "size"
        and isinstance(node.func.value, cst.Name)
        and len(node.args) == 1
    ):
        axis = _constant(node.args[0].value)
        if axis is not None:
            return node.func.value.value, axis
    return None


def _inside_size(name: cst.Name, test: cst.BaseExpression) -> bool:
    for node in walk(test):
        if _size_read(node) is None:
            continue
        receiver = node.value.value if isinstance(node, cst.Subscript) else node.func.value
        if receiver is name:
            return True
    return False


def _constant(node: cst.BaseExpression) -> int | None:
    if isinstance(node, cst.Integer):
        return int(node.value)
    if (
        isinstance(node, cst.UnaryOperation)
        and isinstance(node.operator, cst.Minus)
        and isinstance(node.expression, cst.Integer)
    ):
        return -int(node.expression.value)
    return None


def _agreed_extent(
    script: ScriptModel, name: str, axis: int, at: cst.CSTNode, own: OwnName
) -> bool:
    """``name`` holds ``torch.stack(parts)`` of slices whose extent on ``axis`` is agreed."""
    if axis == 0:
        return False  # the batch's axis
    binding = last_binding(script, name, at)
    value = getattr(binding, "value", None)
    join = _joined_list(value)
    if join is None:
        return False
    call, listed = join
    element_axis = axis - 1 if dotted(call.func) == "torch.stack" and axis > 0 else axis
    if dotted(call.func) != "torch.stack" and axis > 0:
        return False  # cat/vstack along the first axis: later axes are the parts' own
    parts = _appended(script, listed, binding)
    return bool(parts) and all(_part_agreed(p, element_axis, own) for p in parts)


def _joined_list(value: cst.BaseExpression | None) -> tuple[cst.Call, str] | None:
    """``torch.stack(parts)`` (through ``.detach()`` and the like): the call and ``parts``."""
    while (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in _SHAPE_KEEPING
    ):
        value = value.func.value
    if (
        isinstance(value, cst.Call)
        and dotted(value.func) in _JOINS
        and value.args
        and isinstance(value.args[0].value, cst.Name)
    ):
        return value, value.args[0].value.value
    return None


def _appended(script: ScriptModel, listed: str, before: cst.CSTNode) -> list[cst.BaseExpression]:
    """What ``listed.append(...)`` adds in the function of ``before``, above it."""
    function = next(
        (a for a in script.ancestors(before) if isinstance(a, cst.FunctionDef)), script.module
    )
    found = []
    for node in walk(function):
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "append"
            and dotted(node.func.value) == listed
            and len(node.args) == 1
            and script.order(node) < script.order(before)
        ):
            found.append(node.args[0].value)
    return found


def _part_agreed(part: cst.BaseExpression, axis: int, own: OwnName) -> bool:
    """``part`` is a subscript whose slice on ``axis`` has an extent the ranks agree on."""
    if not isinstance(part, cst.Subscript):
        return False
    kept = []  # the slice elements that keep an axis (an index drops one)
    for element in part.slice:
        if isinstance(element.slice, cst.Slice):
            kept.append(element.slice)
        elif isinstance(element.slice.value, cst.Ellipsis):
            return False
    if not -len(kept) <= axis < len(kept):
        return False
    cut = kept[axis]
    if cut.upper is None or cut.step is not None:
        return False
    return _invariant(cut.lower, cut.upper, own)


def _invariant(lower: cst.BaseExpression | None, upper: cst.BaseExpression, own: OwnName) -> bool:
    """``upper - lower`` is the same whatever this rank's own names hold."""
    names = [n for side in (lower, upper) if side is not None for n in walk(side)]
    if not all(_arithmetic(n) for n in names):
        return False
    varying = {n.value for n in names if isinstance(n, cst.Name) and own(n, upper)}
    held = {n.value for n in names if isinstance(n, cst.Name)} - varying
    results = set()
    for trial in _TRIALS:
        bound = {name: trial + index for index, name in enumerate(sorted(varying))}
        bound |= dict.fromkeys(held, _HELD)
        extent = _evaluate(upper, bound) - (0 if lower is None else _evaluate(lower, bound))
        results.add(extent)
    return len(results) == 1


def _arithmetic(node: cst.CSTNode) -> bool:
    return isinstance(
        node,
        cst.Name
        | cst.Integer
        | cst.BinaryOperation
        | cst.Add
        | cst.Subtract
        | cst.Multiply
        | cst.FloorDivide
        | cst.LeftParen
        | cst.RightParen
        | cst.SimpleWhitespace
        | cst.ParenthesizedWhitespace
        | cst.TrailingWhitespace
        | cst.Newline
        | cst.EmptyLine,
    )


def _evaluate(node: cst.BaseExpression, bound: dict[str, int]) -> int:
    if isinstance(node, cst.Integer):
        return int(node.value)
    if isinstance(node, cst.Name):
        return bound[node.value]
    assert isinstance(node, cst.BinaryOperation)
    left, right = _evaluate(node.left, bound), _evaluate(node.right, bound)
    operator = node.operator
    if isinstance(operator, cst.Add):
        return left + right
    if isinstance(operator, cst.Subtract):
        return left - right
    if isinstance(operator, cst.Multiply):
        return left * right
    return left // right if right else 0
