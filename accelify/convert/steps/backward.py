"""4. ``loss.backward(...)`` -> ``accelerator.backward(loss, ...)``; a ``scaler.scale(loss)``
receiver loses its scaling when the precision moved to the Accelerator (which scales fp16
losses), and keeps it when the script's AMP stays as written."""

from __future__ import annotations

from accelify.analysis.script_model import Kind
from accelify.convert.steps.context import Context
from accelify.edits import rewrites
from accelify.edits.node_rewrites import bare_argument


def run(ctx: Context) -> None:
    # A scaler kept as written (its meaning could not move to the Accelerator) keeps scaling.
    how = {
        "keep_scaling": not ctx.precision_carried,
        "scalers": ctx.model.names_of(Kind.SCALER),
    }
    for call in ctx.model.backward_calls:
        if ctx.facts.trains_itself(call):
            continue  # its optimizer is its own, not prepared: see `self_training`
        loss = rewrites.backward_loss(call, **how)
        code, given = ctx.code(loss), ctx.code(bare_argument(loss))
        # ``main()`` training ``obj.model`` of a class that prepares it: ``obj.accelerator``
        outside = None if ctx.plan.reaches(call) else ctx.instance_outside_class(call)
        acc = f"{outside}.accelerator" if outside is not None else ctx.acc
        ctx.plan.add(
            rewrites.backward(call, acc, **how),
            line=ctx.line(call),
            text=f"{code}.backward() -> {acc}.backward({given})",
            anywhere=outside is not None,
        )
        if outside is None:
            ctx.need(call)
