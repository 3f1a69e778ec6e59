"""Calls of a function of another module of the project that only shows text on the terminal
(`writing_helpers.prints_only`: a ``log(msg)`` that prints, kuangliu's ``progress_bar`` that
draws with ``sys.stdout.write``). The module is not converted (it trains nothing), so its
prints cannot become ``accelerator.print``: each call, a statement of its own, runs under ``if
accelerator.is_local_main_process:`` instead, which is where ``accelerator.print`` prints
(realconv37's resnet20 script: every rank drew the bar, each line shown N times)."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.script_model import Kind
from accelify.analysis.syntax import dotted, walk
from accelify.analysis.writing_helpers import arguments_change_state
from accelify.convert.steps.context import Context
from accelify.edits import rewrites


def run(ctx: Context) -> None:
    if not ctx.imported_printers:
        return
    for _, call in ctx.facts.placement.expression_statements():
        where = ctx.imported_printers.get(dotted(call.func) or "")
        if where is None or ctx.facts.ranks.under_rank_guard(call):
            continue
        if _hands_trained(ctx, call) or arguments_change_state(
            ctx.model, ctx.facts.calls, call, ctx.facts.writing_helpers
        ):
            continue  # what it is handed changes what the ranks run on: left on every rank
        statement = ctx.statement_of(call)
        acc = ctx.accelerator_at(statement)
        ctx.plan.add(
            rewrites.local_main_process_only(statement, acc),
            line=ctx.line(statement),
            text=f"{ctx.code(call.func)}(...) runs on the local main process only (it only "
            f"prints: {where}), as {acc}.print prints",
            anywhere=acc != ctx.acc,
        )
        if acc == ctx.acc:
            ctx.need(statement)


def _hands_trained(ctx: Context, call: cst.Call) -> bool:
    """Handed a model, optimizer, loader or scheduler: a prepared one may synchronise the
    ranks when used, which on one rank alone can hang. Its ``len(...)`` is a number
    (``progress_bar(i, len(loader), ...)``)."""
    flow = ctx.facts.flow
    counted = {
        id(inner)
        for argument in call.args
        for node in walk(argument.value)
        if isinstance(node, cst.Call) and dotted(node.func) == "len"
        for inner in walk(node)
    }
    return any(
        flow.kind_of(name, call) in (Kind.MODEL, Kind.OPTIMIZER, Kind.DATALOADER, Kind.SCHEDULER)
        for argument in call.args
        for node in walk(argument.value)
        if id(node) not in counted
        and isinstance(node, (cst.Name, cst.Attribute))
        and (name := dotted(node)) is not None
    )
