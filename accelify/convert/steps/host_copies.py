"""5b. ``.numpy()`` of a tensor the original left on the CPU and the conversion puts on the
device: the prepared loader hands every batch over on ``accelerator.device`` and ``prepare``
places the model there, so ``labels.numpy()`` (only the inputs were moved), ``model(x).numpy()``
or ``model[0].weight.detach().numpy()`` of a CPU-only script, harmless in the original, raise on
a GPU once converted (a CUDA tensor has no NumPy view). Each becomes ``... .cpu().numpy()``,
which is the same tensor where it already was on the host. A chain that already says where the
tensor goes (``.cpu()``, ``.to(...)``, ``numpy(force=True)``) is left as written."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.script_model import Kind
from accelify.analysis.syntax import walk
from accelify.convert.steps.context import Context
from accelify.edits import rewrites

#: Methods in a receiver chain that already say where the tensor goes.
_PLACING_METHODS = frozenset({"cpu", "to", "cuda"})


def run(ctx: Context) -> None:
    done: set[int] = set()
    for loop in ctx.model.loops:
        if not ctx.facts.flow.reads_loader(loop) or ctx.unprepared_loaders(loop):
            continue  # a loader left unprepared hands its batches over where they were
        batch = set(loop.batch_names) | ctx.facts.flow.derived_batch_names(loop)
        for node in walk(loop.node.body):
            if isinstance(node, cst.Call) and _root_of_numpy(node) in batch:
                _on_host_first(ctx, node, done, "batches arrive on accelerator.device")
    for call in ctx.model.calls:
        if _of_a_prepared_model(ctx, call):
            _on_host_first(ctx, call, done, "prepare places the model on accelerator.device")


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


def _root_of_numpy(node: cst.Call) -> str | None:
    """The name ``x.numpy()`` (no arguments) starts from, through attributes, indexing, method
    calls and a call of the name itself (``model(x).argmax(1).numpy()``); None when the chain
    already says where the tensor goes, or is not a ``.numpy()``."""
    if node.args or not (isinstance(node.func, cst.Attribute) and node.func.attr.value == "numpy"):
        return None
    receiver: cst.BaseExpression = node.func.value
    while not isinstance(receiver, cst.Name):
        if isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute):
            if receiver.func.attr.value in _PLACING_METHODS:
                return None
            receiver = receiver.func.value
        elif isinstance(receiver, cst.Call):
            receiver = receiver.func
        elif isinstance(receiver, (cst.Attribute, cst.Subscript)):
            receiver = receiver.value
        else:
            return None
    return receiver.value
