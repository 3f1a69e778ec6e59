"""4. ``loss.backward(...)`` -> ``accelerator.backward(loss, ...)``; a ``scaler.scale(loss)``
receiver loses its scaling when the precision moved to the Accelerator (which scales fp16
losses), and keeps it when the script's AMP stays as written."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted
from accelify.convert.steps.context import Context
from accelify.edits.plan import expression


def run(ctx: Context) -> None:
    acc = ctx.acc
    for call in ctx.model.backward_calls:
        receiver = call.func.value  # type: ignore[union-attr]
        # A scaler kept as written (its meaning could not move to the Accelerator) keeps scaling.
        carried = ctx.facts.precision.carried
        scaled = _unscaled(receiver, ctx.model) if carried else None
        loss = scaled if scaled is not None else receiver

        def rewrite(updated: cst.CSTNode, loss=loss, scaled=scaled) -> cst.CSTNode:
            assert isinstance(updated, cst.Call)
            receiver_now = updated.func.value  # type: ignore[union-attr]
            target = receiver_now.args[0].value if scaled is not None else receiver_now
            args = [cst.Arg(target), *updated.args]
            return updated.with_changes(func=expression(f"{acc}.backward"), args=args)

        code = ctx.code(loss)
        ctx.plan.replace(
            call, rewrite, ctx.line(call), f"{code}.backward() -> {ctx.a('backward')}({code})"
        )
        ctx.need(call)


def _unscaled(receiver: cst.BaseExpression, model: ScriptModel) -> cst.BaseExpression | None:
    """``scaler.scale(loss)`` -> ``loss``."""
    if (
        isinstance(receiver, cst.Call)
        and isinstance(receiver.func, cst.Attribute)
        and receiver.func.attr.value == "scale"
        and dotted(receiver.func.value) in model.names_of(Kind.SCALER)
        and receiver.args
    ):
        return receiver.args[0].value
    return None
