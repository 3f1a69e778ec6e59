"""A ``break`` on a value only this rank computed leaves the other ranks waiting in their next
collective: the decision is made collective with ``set_trigger``/``check_trigger``."""

from __future__ import annotations

from accelify.convert.steps.context import Context
from accelify.edits.plan import statement


def run(ctx: Context) -> None:
    acc = ctx.acc
    for if_node, break_statement in ctx.facts.ranks.per_process_breaks():
        ctx.plan.replace(
            break_statement,
            lambda _: statement(f"{acc}.set_trigger()"),
            ctx.line(if_node),
            "per-process stop made collective: set_trigger() / check_trigger()",
        )
        ctx.plan.insert_after(if_node, statement(f"if {acc}.check_trigger():\n    break\n"))
        ctx.need(if_node)
