"""5c. Tensors a CPU-only script makes inside its training loop and feeds to the model or
mixes with its outputs: a GAN's ``noise = torch.randn(b, z)`` and ``ones = torch.ones(b, 1)``,
a mask or a target built per step. Converted, the batches and the model are on
``accelerator.device`` and these stay on the CPU (on a GPU: a device mismatch at the first
step). Each such factory call is made on the device: ``torch.randn(b, z,
device=accelerator.device)``. A tensor made once before the loop and fed to a prepared model
inside it (DCGAN's ``fixed_noise = torch.randn(64, nz)`` for ``netG(fixed_noise)``) goes there
too, when every use of its name is an input of a prepared model or meets the device in the
loop: made as written and moved (``torch.randn(64, nz).to(accelerator.device)``), so its
values and the RNG stream after it are the original's, and a ``generator=`` made for the CPU
still draws it (given ``device="cuda"`` it raises). So is any factory drawn from a
``generator=``. One also used where the CPU is expected stays, with a review line.

Only a factory whose tensor meets the device in the same call is changed: it is an input of a
prepared model, or an argument beside a batch, a model output or something computed from them
(``bce(D(real), ones)``), directly or through the name it is assigned to. A tensor made for
bookkeeping on the host (an index into a CPU array, a running total) is left where it is."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.dataflow import is_attribute_name, is_binding, variables_in
from accelify.analysis.script_model import Loop
from accelify.analysis.syntax import dotted, target_names, walk
from accelify.convert.steps.context import Context
from accelify.convert.steps.host_inputs import (
    SAME_DEVICE_METHODS,
    assigned_values,
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
                _place(ctx, node, "the batches and the model it meets are there", drawn=False)
        _bound_before_the_loop(ctx, loop, on_device, done)


def _bound_before_the_loop(ctx: Context, loop: Loop, on_device: set[str], done: set[int]) -> None:
    """``netG(fixed_noise)`` in the loop, ``fixed_noise = torch.randn(64, nz)`` its one binding,
    made before the loop: made on the device, when every read of the name takes it there."""
    for node in walk(loop.node.body):
        if not isinstance(node, cst.Call) or prepared_model_called(ctx, node) is None:
            continue
        for argument in node.args:
            name = dotted(argument.value)
            factory = _one_factory_outside(ctx, name, node, loop) if name else None
            if name is None or factory is None or id(factory) in done:
                continue
            done.add(id(factory))
            elsewhere = _read_off_the_device(ctx, name, factory)
            if elsewhere is not None:
                ctx.plan.review(
                    ctx.line(factory),
                    f"{ctx.code(factory)}: {name} is an input of the prepared model at line "
                    f"{ctx.line(node)}, on {ctx.a('device')}, and is also read at line "
                    f"{ctx.line(elsewhere)}, where the original had it on the CPU; left as "
                    f"it is: send it to the device where the model takes it "
                    f"(send_to_device({name}, {ctx.a('device')}))",
                )
                continue
            reason = f"{name} is an input of the prepared model at line {ctx.line(node)}"
            _place(ctx, factory, reason, drawn=True)


def _place(ctx: Context, factory: cst.Call, reason: str, *, drawn: bool) -> None:
    """The factory's tensor goes to the device. One made before the loop (``drawn``) or from a
    ``generator=`` is made as written and moved (``.to(device)``): the same values from the
    same RNG stream as the original, and no CPU generator handed a CUDA device (which raises).
    One made per step in the loop, with the global RNG, is made there
    (``device=``), with no copy per step."""
    device = ctx.a("device")
    if drawn or _takes_a_generator(factory):
        edit = rewrites.made_then_moved(factory, device)
        text = f"{ctx.code(factory)}: made as before and moved to {device} ({reason})"
    else:
        edit = rewrites.made_on_device(factory, device)
        text = f"{ctx.code(factory)}: made on {device} ({reason})"
    ctx.plan.add(edit, line=ctx.line(factory), text=text)
    ctx.need(factory)


def _takes_a_generator(factory: cst.Call) -> bool:
    """``torch.randn(n, d, generator=g)``: ``g`` draws on the device it was made for."""
    return any(a.keyword is not None and a.keyword.value == "generator" for a in factory.args)


def _one_factory_outside(ctx: Context, name: str, at: cst.Call, loop: Loop) -> cst.Call | None:
    """The factory call of ``name``'s only binding (``torch.randn(64, nz)``, also under
    same-device methods: ``torch.randn(8, 4).float()``), when that binding is outside ``loop``."""
    values = assigned_values(ctx, name, at)
    if len(values) != 1 or not isinstance(values[0], cst.Call):
        return None
    value: cst.BaseExpression = values[0]
    while (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in SAME_DEVICE_METHODS
    ):
        value = value.func.value
    if not _is_factory(value) or ctx.facts.placement.inside(value, loop.node):
        return None
    return value  # type: ignore[return-value]


def _read_off_the_device(ctx: Context, name: str, factory: cst.Call) -> cst.CSTNode | None:
    """A read of ``name`` (in the function that binds it, or the class for ``self.x``) that is
    not an input of a prepared model nor an argument beside something on the device in a
    training loop: there the original's CPU tensor is expected. None when there is none."""
    owner = ctx.facts.placement.class_of(factory) if name.startswith("self.") else None
    scope = owner or ctx.model.scope_of(factory)
    loops = [
        loop
        for loop in ctx.model.loops
        if ctx.facts.flow.reads_loader(loop) and not ctx.unprepared_loaders(loop)
    ]
    for node in walk(scope):
        if not isinstance(node, (cst.Name, cst.Attribute)) or dotted(node) != name:
            continue
        if (isinstance(node, cst.Name) and is_attribute_name(ctx.model, node)) or is_binding(
            ctx.model, node
        ):
            continue
        argument = ctx.model.parent(node)
        call = ctx.model.parent(argument) if isinstance(argument, cst.Arg) else None
        if not isinstance(call, cst.Call) or not isinstance(argument, cst.Arg):
            return node
        if prepared_model_called(ctx, call) is not None:
            continue
        around = next((lp for lp in loops if ctx.facts.placement.inside(call, lp.node)), None)
        if around is None or not _call_meets_the_device(
            ctx, call, argument, _on_device_names(ctx, around)
        ):
            return node
    return None


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
