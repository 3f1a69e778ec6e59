"""8. ``torch.nn.utils.clip_grad_norm_/clip_grad_value_`` -> the Accelerator's, which unscale fp16
gradients first and clip what each backend holds."""

from __future__ import annotations

from accelify.analysis import names
from accelify.convert.steps.context import Context
from accelify.edits.plan import expression


def run(ctx: Context) -> None:
    for call in ctx.model.calls:
        for qualified in ctx.model.call_names(call):
            method = names.CLIP_FUNCTIONS.get(qualified)
            if method:
                ctx.plan.replace(
                    call,
                    lambda updated, method=method: updated.with_changes(
                        func=expression(f"{ctx.acc}.{method}")
                    ),
                    ctx.line(call),
                    f"torch.nn.utils.{method} -> {ctx.a(method)}",
                )
                ctx.need(call)
                break
