"""10. Evaluation: predictions and labels are gathered together with ``gather_for_metrics``, so
totals and accuracies cover the whole evaluation set, not one rank's shard."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.script_model import Loop
from accelify.analysis.syntax import dotted, names_in
from accelify.convert.steps.context import Context
from accelify.edits.plan import statement


def run(ctx: Context) -> None:
    for loop in ctx.model.loops:
        if not loop.evaluates or not ctx.facts.flow.reads_loader(loop):
            continue
        _gather_after_forward(ctx, loop)


def _gather_after_forward(ctx: Context, loop: Loop) -> None:
    body = loop.node.body.body
    for index, line_statement in enumerate(body):
        if not isinstance(line_statement, cst.SimpleStatementLine) or len(line_statement.body) != 1:
            continue
        assign = line_statement.body[0]
        if not isinstance(assign, cst.Assign) or not isinstance(assign.value, cst.Call):
            continue
        if not ctx.facts.flow.is_model_name(dotted(assign.value.func), assign):
            continue
        if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
            ctx.plan.review(
                ctx.line(assign),
                "evaluation output is not a plain name: "
                "gather predictions and labels with accelerator.gather_for_metrics",
            )
            return
        output = assign.targets[0].target.value
        fed = {n.value for n in names_in(assign.value)}
        later = set()
        for following in body[index + 1 :]:
            later |= {n.value for n in names_in(following)}
        labels = sorted(
            name
            for name in loop.batch_names | ctx.facts.flow.derived_batch_names(loop)
            if name not in fed and name in later
        )
        gathered = [output, *labels]
        if len(gathered) == 1:
            code = f"{output} = {ctx.a('gather_for_metrics')}({output})"
        else:
            joined = ", ".join(gathered)
            code = f"{joined} = {ctx.a('gather_for_metrics')}(({joined}))"
        ctx.plan.insert_after(line_statement, statement(code))
        ctx.plan.change(
            ctx.line(assign),
            f"evaluation: {', '.join(gathered)} gathered from every rank (gather_for_metrics)",
        )
        ctx.need(line_statement)
        return
    ctx.plan.review(
        ctx.line(loop.node),
        "evaluation loop without a recognised forward pass: "
        "gather predictions and labels with accelerator.gather_for_metrics",
    )
