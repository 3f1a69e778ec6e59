"""5c. ``pack_padded_sequence(emb, lengths)`` takes its ``lengths`` on the CPU only: torch
raises "'lengths' argument should be a 1D CPU int64 tensor" for lengths on a GPU. In a CPU-only
script, or one that moves only the inputs and labels of its batch, they are on the host;
converted, a prepared loader hands the whole batch over on ``accelerator.device`` (as do the
moves the conversion writes at a loop's head or around a model call), lengths included, and the
first step on a GPU fails in the model's ``forward``. Each such call of the file gets its
lengths back on the host where it takes them: ``send_to_device(lengths, "cpu")``, the tensor
itself where it already is there, and a list of ints left as it is (which ``.cpu()`` would not
take). Lengths the original already places (``lengths.cpu()``, ``.to("cpu")``, ``.tolist()``)
or writes out as a list stay as written."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.device_moves import moved_to
from accelify.analysis.syntax import dotted
from accelify.convert.steps.context import Context
from accelify.convert.steps.host_inputs import reaching_value
from accelify.edits import rewrites

#: The functions whose ``lengths`` (second argument) must be a CPU tensor or a list.
_PACKS = frozenset({"torch.nn.utils.rnn.pack_padded_sequence"})

#: Methods whose result is on the host (or no tensor) whatever their receiver's device.
_ON_HOST = frozenset({"cpu", "tolist", "numpy", "item"})


def run(ctx: Context) -> None:
    if not _batches_reach_the_device(ctx):
        return
    for call in ctx.model.calls:
        if not ctx.model.call_names(call) & _PACKS:
            continue
        lengths = _lengths_argument(call)
        if lengths is None or _on_the_host(ctx, lengths.value, call):
            continue
        ctx.plan.add(
            rewrites.back_on_host(lengths.value),
            line=ctx.line(call),
            text=(
                f"{ctx.code(lengths.value)} sent back to the CPU for pack_padded_sequence, which "
                "takes lengths there only (the batches arrive on the accelerator's device)"
            ),
        )
        if "send_to_device" not in ctx.uses:
            ctx.uses.append("send_to_device")


def _batches_reach_the_device(ctx: Context) -> bool:
    """The converted script puts batches on the device: a loop reads prepared loaders only,
    or the conversion sends tensors there itself (a loop's head, a model call's inputs)."""
    if "send_to_device" in ctx.uses:
        return True
    return any(
        ctx.facts.flow.reads_loader(loop) and not ctx.unprepared_loaders(loop)
        for loop in ctx.model.loops
    )


def _lengths_argument(call: cst.Call) -> cst.Arg | None:
    """``lengths`` of ``pack_padded_sequence(input, lengths, ...)``: the second positional
    argument, else ``lengths=``; None when arguments are unpacked into the call."""
    if any(argument.star for argument in call.args):
        return None
    positional = [a for a in call.args if a.keyword is None]
    if len(positional) > 1:
        return positional[1]
    return next((a for a in call.args if a.keyword and a.keyword.value == "lengths"), None)


def _on_the_host(ctx: Context, value: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> bool:
    """``value`` is placed on the host by the original, or made there as a Python sequence:
    ``lengths.cpu()``, ``lengths.to("cpu")``, ``lengths.tolist()``, ``[len(s) for s in seqs]``,
    or a name bound to one of those where the call reads it."""
    if isinstance(value, (cst.List, cst.Tuple, cst.ListComp)):
        return True
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        if value.func.attr.value in _ON_HOST:
            return True
        target = moved_to(value)
        return isinstance(target, cst.SimpleString) and target.evaluated_value == "cpu"
    name = dotted(value)
    if name is None or "." in name or depth > 3:
        return False
    bound = reaching_value(ctx, name, at)
    return bound is not None and _on_the_host(ctx, bound, at, depth + 1)
