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
from accelify.analysis.script_model import Kind
from accelify.analysis.syntax import dotted, target_names, walk
from accelify.convert.steps.context import Context
from accelify.convert.steps.host_inputs import SAME_DEVICE_METHODS, reaching_value
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
