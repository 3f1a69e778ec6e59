"""A ``break`` on a value only this rank computed leaves the other ranks waiting in their next
collective: the decision is made collective with ``set_trigger``/``check_trigger``. What the
``if`` did before breaking (``converged = True``, a print) moves under the collective check,
so every rank does it when any rank stops, as the one process did."""

from __future__ import annotations

import libcst as cst

from accelify.convert.steps.context import Context
from accelify.edits.plan import expression, statement


def run(ctx: Context) -> None:
    for if_node, _ in ctx.facts.ranks.per_process_breaks():
        _make_collective(ctx, if_node)


def _make_collective(ctx: Context, if_node: cst.If) -> None:
    acc = ctx.acc
    bodies: list[cst.BaseSuite] = []
    previous = ctx.plan.replacements.get(if_node)

    def trigger(updated: cst.CSTNode) -> cst.CSTNode:
        if previous is not None:
            updated = previous(updated)
        assert isinstance(updated, cst.If)
        bodies.append(updated.body)
        return updated.with_changes(body=cst.IndentedBlock([statement(f"{acc}.set_trigger()")]))

    def check() -> cst.BaseStatement:
        return cst.If(test=expression(f"{acc}.check_trigger()"), body=bodies[-1])

    ctx.plan.replacements[if_node] = trigger
    ctx.plan.insert_after(if_node, check)
    ctx.plan.change(
        ctx.line(if_node), "per-process stop made collective: set_trigger() / check_trigger()"
    )
    ctx.need(if_node)
