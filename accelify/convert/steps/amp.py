"""7. AMP: the GradScaler and its calls go, ``autocast`` blocks become ``accelerator.autocast()``,
and the precision moves to the Accelerator, keeping the original's CUDA-only condition."""

from __future__ import annotations

import libcst as cst

from accelify.analysis import names
from accelify.analysis.script_model import Kind
from accelify.analysis.syntax import dotted
from accelify.convert.steps.context import Context
from accelify.edits.plan import expression


def run(ctx: Context) -> None:
    scalers = {b.name for b in ctx.model.of_kind(Kind.SCALER)}
    amp_used = bool(scalers)
    dtype = "fp16"
    for binding in ctx.model.of_kind(Kind.SCALER):
        ctx.plan.remove(
            binding.statement,
            binding.line,
            f"removed GradScaler {binding.name} (the Accelerator scales fp16 losses)",
        )
    for line_statement, call in ctx.facts.placement.expression_statements():
        if isinstance(call.func, cst.Attribute) and dotted(call.func.value) in scalers:
            method = call.func.attr.value
            if method in ("update", "unscale_"):
                ctx.plan.remove(
                    line_statement,
                    ctx.line(call),
                    f"removed {dotted(call.func)}() (the Accelerator handles the scaler)",
                )
            elif method == "step" and call.args:
                optimizer = call.args[0].value
                ctx.plan.replace(
                    call,
                    lambda updated: cst.Call(
                        cst.Attribute(updated.args[0].value, cst.Name("step"))
                    ),
                    ctx.line(call),
                    f"{dotted(call.func)}({ctx.code(optimizer)}) -> {ctx.code(optimizer)}.step()",
                )
    for with_node in ctx.facts.placement.withs():
        for item in with_node.items:
            call = item.item
            if isinstance(call, cst.Call) and ctx.model.call_names(call) & names.AUTOCASTS:
                amp_used = True
                if any("bfloat16" in ctx.code(a.value) for a in call.args):
                    dtype = "bf16"
                ctx.plan.replace(
                    call,
                    lambda _: expression(f"{ctx.acc}.autocast()"),
                    ctx.line(call),
                    f"{ctx.code(call.func)}(...) -> {ctx.a('autocast')}()",
                )
                ctx.need(call)
    if amp_used and not ctx.options.mixed_precision:
        if dtype == "bf16":
            ctx.constructor["mixed_precision"] = '"bf16"'
        else:
            ctx.constructor["mixed_precision"] = '"fp16" if torch.cuda.is_available() else "no"'
        ctx.plan.change(
            0,
            "mixed precision moved to Accelerator(mixed_precision="
            f"{ctx.constructor['mixed_precision']})",
        )
