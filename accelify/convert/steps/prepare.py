"""3. One ``prepare`` call for every model, optimizer, DataLoader and LR scheduler of the scope
that owns training, after the last of them is created, unpacked back into the same names."""

from __future__ import annotations

from accelify.analysis.script_model import Kind, Scope
from accelify.convert.steps.context import Context
from accelify.edits.plan import statement


def run(ctx: Context, scope: Scope) -> None:
    kinds = (Kind.MODEL, Kind.OPTIMIZER, Kind.DATALOADER, Kind.SCHEDULER)
    chosen: dict[str, object] = {}
    last_statement = None
    for binding in ctx.model.of_kind(*kinds):
        if binding.scope is not scope:
            continue
        top = ctx.facts.placement.top_statement(binding.statement, scope)
        if top is None:
            continue
        chosen.setdefault(binding.name, binding.kind)
        if last_statement is None or ctx.facts.placement.index(
            top, scope
        ) > ctx.facts.placement.index(last_statement, scope):
            last_statement = top
    per_epoch = ctx.facts.flow.per_epoch_schedulers(set(chosen))
    per_step = {n for n, kind in chosen.items() if kind is Kind.SCHEDULER} - per_epoch
    if per_epoch and not per_step:
        ctx.constructor["step_scheduler_with_optimizer"] = "False"
    elif per_epoch:
        for name in per_epoch:
            chosen.pop(name)
            ctx.plan.review(
                ctx.line(last_statement),
                f"{name} is stepped once per epoch and another scheduler once per step: "
                f"{name} is left unprepared so its schedule keeps its pace",
            )
    if not chosen or last_statement is None:
        return
    order = sorted(chosen, key=lambda n: list(Kind).index(chosen[n]))  # type: ignore[arg-type]
    targets = ", ".join(order)
    code = f"{targets} = {ctx.a('prepare')}({targets})"
    if len(code) > 88:
        code = f"{targets} = {ctx.a('prepare')}(\n    {targets}\n)"
    prepare = statement(code)
    ctx.plan.insert_after(last_statement, prepare)
    ctx.need(last_statement)
    ctx.plan.prepared = order
    ctx.prepare_anchor = last_statement
    ctx.plan.change(
        ctx.line(last_statement), f"prepare {targets} after line {ctx.line(last_statement)}"
    )
