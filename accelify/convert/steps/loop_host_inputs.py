"""5b'. In a CPU-only script, a prepared model called inside a loop over a prepared loader on a
tensor the loop computes on the host from torch's own functions, not from a batch: a NeRF
trainer's render every N steps, ``coords = torch.stack(torch.meshgrid(torch.linspace(...)))``
then ``model(coords)``. The batches and the model are on ``accelerator.device``; that tensor
is on the CPU (on a GPU: a device mismatch). `host_inputs` leaves calls in such loops alone
(their outputs meet the batches there) and `loop_tensors` moves a factory whose own call, or
the one name it is assigned to, meets the device: a tensor built from factories through other
torch calls is neither. The input is moved where the model takes it
(``model(coords.to(accelerator.device))``), made as written, so its values are the original's.

Only an input known to be made on the host is moved: the value that reaches the call (the
last assignment of the name before it, on the call's own path, not rebound later in a loop
around the call) is a number, a torch factory, or a torch function, a same-device method,
arithmetic, an index or an unpacking of such values. A batch, a model's output, anything a
function returned may be on the device already, and stays as written."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.syntax import dotted
from accelify.convert.steps.context import Context
from accelify.convert.steps.host_inputs import (
    SAME_DEVICE_METHODS,
    cpu_only,
    device_given,
    in_a_prepared_loop,
    prepared_model_called,
    reaching_value,
    torch_factory,
)
from accelify.edits import rewrites

#: How many assignments one input is followed back through.
_DEPTH = 8

#: torch namespaces whose functions do not compute a tensor from their arguments on their device.
_NOT_TENSOR_FUNCTIONS = ("torch.nn.", "torch.cuda.", "torch.distributed.", "torch.utils.")


def run(ctx: Context) -> None:
    if not cpu_only(ctx):
        return
    for call in ctx.model.calls:
        model = prepared_model_called(ctx, call)
        if model is not None and in_a_prepared_loop(ctx, call):
            move_host_inputs(ctx, call, model)


def move_host_inputs(ctx: Context, call: cst.Call, model: str) -> None:
    """``call`` runs the prepared ``model`` inside a loop over a prepared loader: each input
    the loop built on the host from torch functions (not a bare factory: `loop_tensors` makes
    that one on the device) is moved to the device where the model takes it."""
    device = ctx.a("device")
    for argument in call.args:
        value = argument.value
        if argument.star or not _built(ctx, value, call, 0):
            continue
        if not _host_made(ctx, value, call, 0):
            continue
        ctx.plan.add(
            rewrites.made_then_moved(value, device),
            line=ctx.line(call),
            text=(
                f"{ctx.code(value)} moved to {device} where {model} takes it in the training "
                "loop (made on the CPU; the model and the batches are on the device)"
            ),
        )
        ctx.need(call)


def _built(ctx: Context, value: cst.BaseExpression, at: cst.CSTNode, depth: int) -> bool:
    """``value`` is, through the names that reach it, same-device methods and arithmetic, the
    result of a torch function that is not a factory (``torch.stack(...)``). A factory alone
    (``noise = torch.randn(b, z)``, a ``probe`` also read on the CPU) is `loop_tensors`'s: made
    on the device there, or left with a review line."""
    if depth > _DEPTH:
        return False
    if isinstance(value, cst.Call):
        func = value.func
        if isinstance(func, cst.Attribute) and func.attr.value in SAME_DEVICE_METHODS:
            return _built(ctx, func.value, at, depth + 1)
        return torch_factory(value) is None and (dotted(func) or "").startswith("torch.")
    if isinstance(value, cst.BinaryOperation):
        return any(_built(ctx, side, at, depth + 1) for side in (value.left, value.right))
    if isinstance(value, (cst.UnaryOperation, cst.Subscript)):
        inner = value.expression if isinstance(value, cst.UnaryOperation) else value.value
        return _built(ctx, inner, at, depth + 1)
    if isinstance(value, cst.Name):
        reaching = reaching_value(ctx, value.value, at)
        return reaching is not None and _built(ctx, reaching, reaching, depth + 1)
    return False


def _host_made(ctx: Context, value: cst.BaseExpression, at: cst.CSTNode, depth: int) -> bool:
    """``value`` is a tensor (or number) the original makes on the CPU, judged at ``at``."""
    if depth > _DEPTH:
        return False
    if isinstance(value, (cst.BaseNumber, cst.BaseString)):
        return True
    if isinstance(value, (cst.List, cst.Tuple)):
        return all(
            isinstance(e, cst.Element) and _host_made(ctx, e.value, at, depth + 1)
            for e in value.elements
        )
    if isinstance(value, cst.Call):
        return _host_call(ctx, value, at, depth)
    if isinstance(value, cst.BinaryOperation):
        return all(_host_made(ctx, side, at, depth + 1) for side in (value.left, value.right))
    if isinstance(value, cst.UnaryOperation):
        return _host_made(ctx, value.expression, at, depth + 1)
    if isinstance(value, cst.Subscript):
        return _host_made(ctx, value.value, at, depth + 1)
    if isinstance(value, cst.Name):
        reaching = reaching_value(ctx, value.value, at)
        return reaching is not None and _host_made(ctx, reaching, reaching, depth + 1)
    return False


def _host_call(ctx: Context, call: cst.Call, at: cst.CSTNode, depth: int) -> bool:
    """A torch factory with no device, a same-device method of a host tensor, or a torch
    function (``torch.stack``, ``torch.meshgrid``) whose every argument is made on the host."""
    if torch_factory(call) is not None:
        return not device_given(call)
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value in SAME_DEVICE_METHODS:
        return _host_made(ctx, func.value, at, depth + 1)
    name = dotted(func) or ""
    if not name.startswith("torch.") or name.startswith(_NOT_TENSOR_FUNCTIONS):
        return False
    if device_given(call) or not call.args:
        return False
    return all(not a.star and _host_made(ctx, a.value, at, depth + 1) for a in call.args)
