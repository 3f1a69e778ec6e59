"""8. ``torch.nn.utils.clip_grad_norm_/clip_grad_value_`` -> the Accelerator's, which unscale fp16
gradients first and clip what each backend holds. Every argument keeps its meaning: the
Accelerator's take the parameters, the bound and ``norm_type``; ``foreach=`` (a speed choice)
goes; a call with more (``error_if_nonfinite=``) stays as written, with a review line."""

from __future__ import annotations

from accelify.analysis import names
from accelify.convert.steps.context import Context
from accelify.edits import rewrites


def run(ctx: Context) -> None:
    for call in ctx.model.calls:
        for qualified in ctx.model.call_names(call):
            method = names.CLIP_FUNCTIONS.get(qualified)
            if not method:
                continue
            clip = rewrites.clip_grad(call, ctx.acc, method)
            if clip is None:
                extra = rewrites.unaccepted_clip_argument(call, method)
                ctx.plan.review(
                    ctx.line(call),
                    f"{ctx.code(call.func)} left as is: {ctx.a(method)} takes no {extra} "
                    "(with fp16 mixed precision its gradients are still scaled here)",
                )
                break
            ctx.plan.add(
                clip, line=ctx.line(call), text=f"torch.nn.utils.{method} -> {ctx.a(method)}"
            )
            ctx.need(call)
            break
