"""9. Prints and progress bars show once: ``print`` -> ``accelerator.print`` (the local main
process), ``tqdm(...)`` disabled on the other processes."""

from __future__ import annotations

import libcst as cst

from accelify.analysis import names
from accelify.analysis.syntax import dotted
from accelify.convert.steps.context import Context
from accelify.edits import rewrites
from accelify.edits.node_rewrites import WithKeyword


def run(ctx: Context) -> None:
    for call in ctx.model.calls:
        qualified = ctx.model.call_names(call)
        if qualified & names.PRINT and not ctx.facts.ranks.under_rank_guard(call):
            outside = _instance_outside_class(ctx, call)
            acc = ctx.acc if outside is None else f"{outside}.accelerator"
            ctx.plan.add(
                rewrites.print_once(call, acc),
                line=ctx.line(call),
                text=f"print -> {acc}.print (local main process only)",
                anywhere=outside is not None,  # reached through the instance
            )
            if outside is None:
                ctx.need(call)
        elif qualified & names.TQDM and not any(
            a.keyword and a.keyword.value == "disable" for a in call.args
        ):
            acc = ctx.acc
            ctx.plan.replace(
                call,
                WithKeyword("disable", f"not {acc}.is_local_main_process"),
                ctx.line(call),
                "progress bar shown on the local main process only",
            )
            ctx.need(call)


def _instance_outside_class(ctx: Context, call: cst.Call) -> str | None:
    """``trainer`` for a print outside the class that owns ``self.accelerator``, in a scope
    where ``trainer = Trainer(...)`` was created before it: ``trainer.accelerator.print``."""
    if not ctx.acc.startswith("self.") or ctx.prepare_anchor is None:
        return None
    owner = ctx.facts.placement.class_of(ctx.prepare_anchor)
    if owner is None or ctx.facts.placement.inside(call, owner):
        return None
    scope = ctx.model.scope_of(call)
    for assign in ctx.model.assignments:
        value = assign.value
        if (
            ctx.model.scope_of(assign) is scope
            and ctx.line(assign) < ctx.line(call)
            and isinstance(value, cst.Call)
            and dotted(value.func) == owner.name.value
            and len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Name)
        ):
            return assign.targets[0].target.value
    return None
