"""5c. Tensors a CPU-only script makes inside its training loop and feeds to the model or
mixes with its outputs: a GAN's ``noise = torch.randn(b, z)`` and ``ones = torch.ones(b, 1)``,
a mask or a target built per step. Converted, the batches and the model are on
``accelerator.device`` and these stay on the CPU (on a GPU: a device mismatch at the first
step). Each such factory call is made on the device: ``torch.randn(b, z,
device=accelerator.device)``.

Only a factory whose tensor meets the device in the same call is changed: it is an input of a
prepared model, or an argument beside a batch, a model output or something computed from them
(``bce(D(real), ones)``), directly or through the name it is assigned to. A tensor made for
bookkeeping on the host (an index into a CPU array, a running total) is left where it is."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.dataflow import variables_in
from accelify.analysis.script_model import Loop
from accelify.analysis.syntax import dotted, target_names, walk
from accelify.convert.steps.context import Context
from accelify.convert.steps.host_inputs import (
    cpu_only,
    device_given,
    prepared_model_called,
    torch_factory,
)
from accelify.edits import rewrites


def run(ctx: Context) -> None:
    if not cpu_only(ctx):
        return
    done: set[int] = set()
    for loop in ctx.model.loops:
        if not ctx.facts.flow.reads_loader(loop) or ctx.unprepared_loaders(loop):
            continue
        on_device = _on_device_names(ctx, loop)
        for node in walk(loop.node.body):
            if not _is_factory(node) or id(node) in done:
                continue
            if _meets_the_device(ctx, node, loop, on_device):
                done.add(id(node))
                ctx.plan.add(
                    rewrites.made_on_device(node, ctx.a("device")),
                    line=ctx.line(node),
                    text=(
                        f"{ctx.code(node)}: made on {ctx.a('device')} (the batches and the "
                        "model it meets are there)"
                    ),
                )
                ctx.need(node)


def _on_device_names(ctx: Context, loop: Loop) -> set[str]:
    """The loop's batch, what is unpacked from it, and every name assigned from those or from
    a prepared model's output, in source order."""
    on_device = set(loop.batch_names) | ctx.facts.flow.derived_batch_names(loop)
    for node in walk(loop.node.body):
        if isinstance(node, cst.Assign) and _reads_the_device(ctx, node.value, on_device):
            for target in node.targets:
                on_device |= target_names(target.target)
    return on_device


def _reads_the_device(ctx: Context, node: cst.CSTNode, on_device: set[str]) -> bool:
    if variables_in(ctx.model, node) & on_device:
        return True
    return any(
        isinstance(n, cst.Call) and prepared_model_called(ctx, n) is not None for n in walk(node)
    )


def _is_factory(node: cst.CSTNode) -> bool:
    if not isinstance(node, cst.Call):
        return False
    made = torch_factory(node)
    return made is not None and made not in _FROM_DATA and not device_given(node)


#: Factories that copy data the script already has (a NumPy array, a list): where that data
#: goes is the script's business.
_FROM_DATA = frozenset({"from_numpy", "as_tensor"})


def _meets_the_device(ctx: Context, factory: cst.Call, loop: Loop, on_device: set[str]) -> bool:
    """``factory``'s tensor is an argument of a call that also takes something on the device,
    or of a prepared model, either directly or through the one name it is assigned to."""
    user, carried = _first_call_taking(ctx, factory)
    if user is not None and _call_meets_the_device(ctx, user, carried, on_device):
        return True
    name = _assigned_to(ctx, factory)
    if name is None:
        return False
    for node in walk(loop.node.body):
        if not isinstance(node, cst.Call):
            continue
        for argument in node.args:
            if name in variables_in(ctx.model, argument.value) and _call_meets_the_device(
                ctx, node, argument, on_device
            ):
                return True
    return False


def _first_call_taking(ctx: Context, node: cst.CSTNode) -> tuple[cst.Call | None, cst.Arg | None]:
    """The call ``node`` is an argument of, through arithmetic and same-device methods
    (``bce(out, torch.ones(b, 1).float())``), with the argument that carries it."""
    child = node
    for parent in ctx.model.ancestors(node):
        if isinstance(parent, cst.Arg):
            call = ctx.model.parent(parent)
            return (call, parent) if isinstance(call, cst.Call) else (None, None)
        if isinstance(parent, (cst.BinaryOperation, cst.UnaryOperation)):
            child = parent
            continue
        if isinstance(parent, cst.Attribute) and parent.value is child:
            child = parent
            continue
        if isinstance(parent, cst.Call) and parent.func is child:
            child = parent
            continue
        return None, None
    return None, None


def _call_meets_the_device(
    ctx: Context, call: cst.Call, carried: cst.Arg | None, on_device: set[str]
) -> bool:
    if prepared_model_called(ctx, call) is not None:
        return True
    return any(
        argument is not carried and _reads_the_device(ctx, argument.value, on_device)
        for argument in call.args
    )


def _assigned_to(ctx: Context, factory: cst.Call) -> str | None:
    """``noise`` of ``noise = torch.randn(b, z)`` (also ``... .float()``, ``* 0.1``)."""
    child: cst.CSTNode = factory
    for parent in ctx.model.ancestors(factory):
        if isinstance(parent, cst.Assign) and parent.value is child and len(parent.targets) == 1:
            return dotted(parent.targets[0].target)
        if isinstance(parent, (cst.BinaryOperation, cst.Attribute)) or (
            isinstance(parent, cst.Call) and parent.func is child
        ):
            child = parent
            continue
        return None
    return None
