"""5b. ``.numpy()`` of a tensor the original left on the CPU and the conversion puts on the
device: the prepared loader hands every batch over on ``accelerator.device`` and ``prepare``
places the model there, so ``labels.numpy()`` (only the inputs were moved), ``model(x).numpy()``
or ``model[0].weight.detach().numpy()`` of a CPU-only script, harmless in the original, raise on
a GPU once converted (a CUDA tensor has no NumPy view). Each becomes ``... .cpu().numpy()``,
which is the same tensor where it already was on the host. A chain that already says where the
tensor goes (``.cpu()``, ``.to(...)``, ``numpy(force=True)``) is left as written. Likewise
``np.array(pred)``/``np.asarray(a=pred)`` of a model's output followed through tensor methods
becomes ``np.array(pred.cpu())`` (`_array_of_a_model_output`)."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.dataflow import variables_in
from accelify.analysis.objects import callee
from accelify.analysis.script_model import Kind
from accelify.analysis.syntax import dotted, target_names, walk
from accelify.convert.steps.context import Context
from accelify.convert.steps.host_inputs import (
    SAME_DEVICE_METHODS,
    reaching_assignment,
    reaching_value,
)
from accelify.edits import rewrites

#: Methods in a receiver chain that already say where the tensor goes.
_PLACING_METHODS = frozenset({"cpu", "to", "cuda"})


def run(ctx: Context) -> None:
    done: set[int] = set()
    for loop in ctx.model.loops:
        if not ctx.facts.flow.reads_loader(loop) or ctx.unprepared_loaders(loop):
            continue  # a loader left unprepared hands its batches over where they were
        on_device = set(loop.batch_names) | ctx.facts.flow.derived_batch_names(loop)
        for node in walk(loop.node.body):  # in source order: a name is bound before it is read
            if isinstance(node, cst.Assign) and variables_in(ctx.model, node.value) & on_device:
                for target in node.targets:
                    on_device |= target_names(target.target)
            receiver = _numpy_receiver(node)
            if receiver is not None and variables_in(ctx.model, receiver) & on_device:
                _on_host_first(ctx, node, done, "batches arrive on accelerator.device")  # type: ignore[arg-type]
    for call in ctx.model.calls:
        copied = _of_a_prepared_model(ctx, call) and not _brought_back(ctx, call)
        if copied or _array_of_a_model_output(ctx, call):
            _on_host_first(ctx, call, done, "prepare places the model on accelerator.device")
    for call in ctx.model.calls:
        receiver = _numpy_receiver(call)
        if receiver is not None and _on_the_device(ctx, receiver, call, 0, tensor=False):
            why = "it holds a prepared model's outputs or a prepared loader's batches"
            _on_host_first(ctx, call, done, why)


#: NumPy functions that copy a tensor into an array (through its host memory).
_ARRAY_FUNCTIONS = frozenset({"numpy.array", "numpy.asarray", "numpy.asanyarray"})

#: Tensor methods whose result is a tensor on the same device as the one they are called on
#: (not ``topk``/``max(dim)``: a named tuple, which has no ``.cpu()``; not ``type()``: a string).
_TENSOR_METHODS = (SAME_DEVICE_METHODS - {"type"}) | {
    "argmax", "argmin", "softmax", "log_softmax", "sigmoid", "exp", "round", "abs", "sum",
    "mean",
}  # fmt: skip


def _array_of_a_model_output(ctx: Context, call: cst.Call) -> bool:
    """``np.array(pred)`` where ``pred`` is the output of a model the conversion prepares
    (``pred = model(x).argmax(1)``, or that expression itself), after its ``prepare``: NumPy
    reads host memory, so on a GPU the copy raises where the original's CPU tensor did not.
    Only a value followed to the model's call through tensor methods, indexing and names
    assigned once before the call counts (a batch's item may be a list or a string), and only
    through a tensor method (``.argmax(1)``): a bare model call's output may be a tuple or a
    dict, which has no ``.cpu()``. The array is the first positional argument or ``a=``
    (``np.asarray(a=pred)``); other arguments (``dtype=np.int64``) are kept."""
    argument = array_argument(call)
    if argument is None or not ctx.model.qualified(call.func) & _ARRAY_FUNCTIONS:
        return False
    return _model_output(ctx, argument.value, call, 0, tensor=False)


def array_argument(call: cst.Call) -> cst.Arg | None:
    """The argument of ``np.array(...)``/``np.asarray(...)`` that holds the array: the first
    positional one, else ``a=``; None when it is passed by ``*``/``**``."""
    if any(argument.star for argument in call.args):
        return None
    first = call.args[0] if call.args else None
    if first is not None and first.keyword is None:
        return first
    return next((a for a in call.args if a.keyword is not None and a.keyword.value == "a"), None)


def _model_output(
    ctx: Context, value: cst.BaseExpression, at: cst.CSTNode, depth: int, tensor: bool
) -> bool:
    """``value`` is a tensor (``tensor``: a tensor method was met on the way) computed from
    the output of a prepared model's call."""
    if depth > 6:
        return False
    if isinstance(value, cst.Subscript):
        return _model_output(ctx, value.value, at, depth + 1, tensor)
    if isinstance(value, cst.Name):
        bound = reaching_value(ctx, value.value, at)
        return bound is not None and _model_output(ctx, bound, at, depth + 1, tensor)
    if not isinstance(value, cst.Call):
        return False
    func = value.func
    if isinstance(func, cst.Attribute) and func.attr.value in _PLACING_METHODS:
        return False  # ``pred.cpu()``: the original says where it goes
    if isinstance(func, cst.Attribute) and func.attr.value in _TENSOR_METHODS:
        return _model_output(ctx, func.value, at, depth + 1, tensor=True)
    if not tensor:
        return False  # ``np.array(model(x))``: a tuple or dict as well as a tensor
    name = dotted(func)
    if name is None or ctx.facts.flow.kind_of(name, value) is not Kind.MODEL:
        return False
    if value is not at and id(value) in ctx.host_calls:
        return False  # `host_inputs` sends this output back to the CPU
    outer = name if name in ctx.prepared_after else ctx.facts.flow.outer_name(name, value)
    if outer not in ctx.prepared_after or outer in ctx.frozen:
        return False
    return ctx.after_prepare(value, outer)


#: torch functions that join a list of tensors into one on their device.
_JOINS = frozenset(
    {"torch.cat", "torch.concat", "torch.concatenate", "torch.stack", "torch.vstack",
     "torch.hstack"}
)  # fmt: skip
#: Accelerator methods that hand back tensors on ``accelerator.device``.
_GATHERS = frozenset({"gather", "gather_for_metrics", "reduce", "pad_across_processes"})
#: List methods that put a value in the list.
_FILLS = frozenset({"append", "extend", "insert"})


def _on_the_device(
    ctx: Context,
    value: cst.BaseExpression,
    at: cst.CSTNode,
    depth: int,
    tensor: bool,
    slot: int | None = None,
) -> bool:
    """``value`` (its ``slot``: the place of an unpacked tuple) is a tensor the conversion puts
    on the device, followed through tensor methods, indexing, names, the lists they fill
    (``preds.append(model(x))``), ``torch.cat``/``stack`` of those, a gather, and the returns
    of the file's own helpers (``preds, labels = predict(model, test_loader)``): a prepared
    model's output, a prepared loader's batch, or a gathered value. ``tensor``: a tensor method
    or a join was met on the way (a bare model call may return a tuple or a dict)."""
    if depth > 12:
        return False
    if isinstance(value, cst.Subscript):
        return _on_the_device(ctx, value.value, at, depth + 1, tensor)
    if isinstance(value, (cst.Tuple, cst.List)) and slot is not None:
        if slot >= len(value.elements) or isinstance(value.elements[slot], cst.StarredElement):
            return False
        return _on_the_device(ctx, value.elements[slot].value, at, depth + 1, tensor)
    if isinstance(value, cst.Name):
        return _name_on_the_device(ctx, value.value, at, depth, tensor, slot)
    if slot is None and isinstance(value, (cst.BinaryOperation, cst.Comparison)):
        # ``(logits.sigmoid() > 0.5)``, ``out * 2``: a tensor operand's device
        operands = [value.left] + (
            [value.right]
            if isinstance(value, cst.BinaryOperation)
            else [target.comparator for target in value.comparisons]
        )
        return tensor and any(
            _on_the_device(ctx, operand, at, depth + 1, tensor) for operand in operands
        )
    if not isinstance(value, cst.Call):
        return False
    func = value.func
    method = func.attr.value if isinstance(func, cst.Attribute) else None
    if method in _PLACING_METHODS:
        return False  # ``pred.cpu()``: the original says where it goes
    if method in _TENSOR_METHODS and slot is None:
        return _on_the_device(ctx, func.value, at, depth + 1, tensor=True)  # type: ignore[union-attr]
    if ctx.model.qualified(func) & _JOINS and value.args and slot is None:
        joined = value.args[0].value
        if isinstance(joined, (cst.List, cst.Tuple)):
            return any(
                _on_the_device(ctx, element.value, at, depth + 1, tensor=True)
                for element in joined.elements
            )
        return _on_the_device(ctx, joined, at, depth + 1, tensor=True)
    if method in _GATHERS and slot is None:
        owner = dotted(func.value) if isinstance(func, cst.Attribute) else None
        return owner is not None and ctx.facts.flow.kind_of(owner, value) is Kind.ACCELERATOR
    if tensor and slot is None and _model_output(ctx, value, at, depth, tensor=True):
        return True
    helper = callee(ctx.model, value)
    if helper is None:
        return False
    return any(
        _on_the_device(ctx, returned.value, returned, depth + 1, tensor, slot)  # type: ignore[arg-type]
        for returned in ctx.model.index.own_returns(helper[0])
    )


def _name_on_the_device(
    ctx: Context, name: str, at: cst.CSTNode, depth: int, tensor: bool, slot: int | None
) -> bool:
    """`_on_the_device` of a name: a batch of a loop over a prepared loader around ``at``, the
    value last assigned to it (its place in an unpacking), or, for a list made empty, what the
    function puts in it before ``at``."""
    for loop in ctx.model.loops:
        if not ctx.model.inside(at, loop.node) or not ctx.facts.flow.reads_loader(loop):
            continue
        if ctx.unprepared_loaders(loop):
            continue
        if name in set(loop.batch_names) | ctx.facts.flow.derived_batch_names(loop):
            return slot is None
    assign = reaching_assignment(ctx, name, at)
    if assign is None:
        return False
    place = _unpacked_place(assign, name)
    if place is None:
        return False
    value = assign.value
    if place >= 0 and isinstance(value, (cst.Tuple, cst.List)):  # ``preds, labels = [], []``
        if place >= len(value.elements) or isinstance(value.elements[place], cst.StarredElement):
            return False
        value, place = value.elements[place].value, -1
    if isinstance(value, cst.List) and not value.elements:
        return slot is None and _filled_on_the_device(ctx, name, assign, at, depth)
    if place >= 0:
        if slot is not None:
            return False
        return _on_the_device(ctx, value, assign, depth + 1, tensor, place)
    return _on_the_device(ctx, value, assign, depth + 1, tensor, slot)


def _unpacked_place(assign: cst.Assign, name: str) -> int | None:
    """Where ``name`` sits in ``assign``'s target: -1 for the whole value (``x = ...``), its
    place in a flat unpacking (``preds, labels = ...``), None otherwise."""
    for target in assign.targets:
        bound = target.target
        if isinstance(bound, cst.Name) and bound.value == name:
            return -1
        if isinstance(bound, (cst.Tuple, cst.List)):
            for place, element in enumerate(bound.elements):
                if isinstance(element.value, cst.Name) and element.value.value == name:
                    return None if isinstance(element, cst.StarredElement) else place
    return None


def _filled_on_the_device(
    ctx: Context, name: str, made: cst.Assign, at: cst.CSTNode, depth: int
) -> bool:
    """A list made empty (``out = []``) that its function fills, between ``made`` and ``at``,
    with a value on the device (``out.append(model(x))``)."""
    function = ctx.model.index.enclosing_function(made)
    scope = function if function is not None else ctx.model.module
    start, end = ctx.model.order(made), ctx.model.order(at)
    for node in ctx.model.index.own_nodes(scope):
        if not (isinstance(node, cst.Call) and start < ctx.model.order(node) < end):
            continue
        func = node.func
        if not (
            isinstance(func, cst.Attribute)
            and func.attr.value in _FILLS
            and isinstance(func.value, cst.Name)
            and func.value.value == name
            and node.args
        ):
            continue
        filled = node.args[-1].value
        if func.attr.value == "extend":
            if not isinstance(filled, (cst.List, cst.Tuple)):
                continue
            values = [element.value for element in filled.elements]
        else:
            values = [filled]
        if any(_on_the_device(ctx, v, node, depth + 1, tensor=True) for v in values):
            return True
    return False


def _brought_back(ctx: Context, call: cst.Call) -> bool:
    """``model(x)....numpy()`` where `host_inputs` already sends the model's output back to
    the CPU."""
    return any(isinstance(n, cst.Call) and id(n) in ctx.host_calls for n in walk(call.func))


def _on_host_first(ctx: Context, call: cst.Call, done: set[int], why: str) -> None:
    if id(call) in done:
        return
    done.add(id(call))
    ctx.plan.add(
        rewrites.numpy_from_host(call),
        line=ctx.line(call),
        text=f"{ctx.code(call)}: .cpu() first ({why})",
    )


def _of_a_prepared_model(ctx: Context, call: cst.Call) -> bool:
    """``model(x)....numpy()`` or ``model.layer.weight....numpy()`` of a model the conversion
    prepares, after its ``prepare``."""
    name = _root_of_numpy(call)
    if name is None or ctx.facts.flow.kind_of(name, call) is not Kind.MODEL:
        return False
    outer = name if name in ctx.prepared_after else ctx.facts.flow.outer_name(name, call)
    if outer not in ctx.prepared_after or outer in ctx.frozen:
        return False
    return ctx.after_prepare(call, outer)


def _numpy_receiver(node: cst.CSTNode) -> cst.BaseExpression | None:
    """What ``x.numpy()`` (no arguments) is called on; None when the chain already says where
    the tensor goes (``x.cpu().numpy()``, ``x.to("cpu").numpy()``), or is not a ``.numpy()``."""
    if not (
        isinstance(node, cst.Call)
        and not node.args
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "numpy"
    ):
        return None
    placing = (
        n
        for n in walk(node.func.value)
        if isinstance(n, cst.Call)
        and isinstance(n.func, cst.Attribute)
        and n.func.attr.value in _PLACING_METHODS
    )
    return None if next(placing, None) is not None else node.func.value


def _root_of_numpy(node: cst.Call) -> str | None:
    """The name ``x.numpy()`` starts from, through attributes, indexing, method calls and a call
    of the name itself (``model(x).argmax(1).numpy()``)."""
    receiver = _numpy_receiver(node)
    while receiver is not None and not isinstance(receiver, cst.Name):
        if isinstance(receiver, cst.Call):
            func = receiver.func
            receiver = func.value if isinstance(func, cst.Attribute) else func
        elif isinstance(receiver, (cst.Attribute, cst.Subscript)):
            receiver = receiver.value
        else:
            return None
    return receiver.value if receiver is not None else None
