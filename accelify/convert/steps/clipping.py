"""8. ``torch.nn.utils.clip_grad_norm_/clip_grad_value_`` -> the Accelerator's, which unscale fp16
gradients first and clip what each backend holds. Every argument keeps its meaning: the
Accelerator's take the parameters, the bound and ``norm_type``; ``foreach=`` (a speed choice)
goes; a call with more (``error_if_nonfinite=``) stays as written, with a review line."""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from accelify.analysis import names
from accelify.convert.steps.context import Context
from accelify.edits.plan import expression

#: The parameters of the Accelerator's clipping methods, in order.
ACCEPTED = {
    "clip_grad_norm_": ("parameters", "max_norm", "norm_type"),
    "clip_grad_value_": ("parameters", "clip_value"),
}


def run(ctx: Context) -> None:
    for call in ctx.model.calls:
        for qualified in ctx.model.call_names(call):
            method = names.CLIP_FUNCTIONS.get(qualified)
            if not method:
                continue
            extra = _unaccepted(call, ACCEPTED[method])
            if extra is not None:
                ctx.plan.review(
                    ctx.line(call),
                    f"{ctx.code(call.func)} left as is: {ctx.a(method)} takes no {extra} "
                    "(with fp16 mixed precision its gradients are still scaled here)",
                )
                break
            ctx.plan.replace(
                call,
                lambda updated, method=method: updated.with_changes(
                    func=expression(f"{ctx.acc}.{method}"), args=_without_foreach(updated.args)
                ),
                ctx.line(call),
                f"torch.nn.utils.{method} -> {ctx.a(method)}",
            )
            ctx.need(call)
            break


def _unaccepted(call: cst.Call, accepted: tuple[str, ...]) -> str | None:
    """The first argument the Accelerator's method would not take, as written."""
    for index, argument in enumerate(call.args):
        if argument.star:
            return f"{argument.star}{_code(argument.value)}"
        if argument.keyword is not None and argument.keyword.value == "foreach":
            continue
        if argument.keyword is not None and argument.keyword.value not in accepted:
            return f"{argument.keyword.value}="
        if argument.keyword is None and index >= len(accepted):
            return f"argument {index + 1}"
    return None


def _without_foreach(args: Sequence[cst.Arg]) -> list[cst.Arg]:
    kept = [a for a in args if not (a.keyword is not None and a.keyword.value == "foreach")]
    if kept and len(kept) < len(args):
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return kept


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)
