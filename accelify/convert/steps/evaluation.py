"""10. Evaluation: predictions and labels are gathered together with ``gather_for_metrics``, so
totals and accuracies cover the whole evaluation set, not one rank's shard. What is gathered,
and whether that is safe, is the analysis's (`accelify.analysis.evaluation`); a loop it is unsure
of stays as it is, with a review line that says why."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.evaluation import Evaluation
from accelify.convert.steps.context import Context
from accelify.edits.plan import statement


def run(ctx: Context) -> None:
    for evaluation in ctx.facts.evaluations:
        if evaluation.already_gathered or not evaluation.sinks:
            continue
        if evaluation.unsure is not None:
            ctx.plan.review(
                ctx.line(evaluation.line_node),
                f"evaluation left as is: {evaluation.unsure}; gather predictions and labels "
                f"together with {ctx.a('gather_for_metrics')} before the metrics",
            )
            continue
        _gather(ctx, evaluation)


def _gather(ctx: Context, evaluation: Evaluation) -> None:
    assert evaluation.statement is not None and evaluation.forward is not None
    targets = [*evaluation.gathered, *(f.name for f in evaluation.fields)]
    values = [*evaluation.gathered, *(f.code for f in evaluation.fields)]
    gather = statement(_gather_code(ctx, targets, values))
    for gathered_field in evaluation.fields:
        for use in gathered_field.uses:
            ctx.plan.replacements[use] = lambda _, name=gathered_field.name: cst.Name(name)
    if evaluation.extracted is None:
        ctx.plan.insert_after(evaluation.statement, gather)
    else:
        _extract_forward(ctx, evaluation, gather)
    ctx.plan.change(
        ctx.line(evaluation.statement),
        f"evaluation: {', '.join(targets)} gathered from every rank (gather_for_metrics)",
    )
    ctx.need(evaluation.statement)


def _extract_forward(ctx: Context, evaluation: Evaluation, gather: cst.BaseStatement) -> None:
    """``se += ((model(x) - y) ** 2).sum()`` -> ``outputs = model(x)``, the gather, then
    ``se += ((outputs - y) ** 2).sum()``: the forward as this pass rewrote it moves up."""
    name = evaluation.extracted
    assert name is not None and evaluation.forward is not None
    rewritten: list[cst.BaseExpression] = []
    previous = ctx.plan.replacements.get(evaluation.forward)

    def take(updated: cst.CSTNode) -> cst.CSTNode:
        if previous is not None:
            updated = previous(updated)
        rewritten.append(updated)  # type: ignore[arg-type]
        return cst.Name(name)

    def bind() -> cst.BaseStatement:
        return cst.SimpleStatementLine(
            [cst.Assign([cst.AssignTarget(cst.Name(name))], rewritten[-1])]
        )

    ctx.plan.replacements[evaluation.forward] = take
    ctx.plan.insert_before(evaluation.statement, bind, gather)


def _gather_code(ctx: Context, targets: list[str], values: list[str]) -> str:
    call = ctx.a("gather_for_metrics")
    if len(targets) == 1:
        code = f"{targets[0]} = {call}({values[0]})"
    else:
        code = f"{', '.join(targets)} = {call}(({', '.join(values)}))"
    if len(code) <= 80:
        return code
    if len(targets) == 1:
        return f"{targets[0]} = {call}(\n    {values[0]}\n)"
    return f"{', '.join(targets)} = {call}(\n    ({', '.join(values)})\n)"
