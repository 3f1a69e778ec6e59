"""A ``break`` on a value only this rank computed leaves the other ranks waiting in their next
collective: the decision is made collective with ``set_trigger``/``check_trigger``. What the
``if`` did before breaking (``converged = True``, a print) moves under the collective check,
so every rank does it when any rank stops, as the one process did."""

from __future__ import annotations

import libcst as cst

from accelify.convert.steps.context import Context
from accelify.edits.collective_rewrites import collective_stop


def run(ctx: Context) -> None:
    for if_node, _ in ctx.facts.ranks.per_process_breaks():
        _make_collective(ctx, if_node)


def _make_collective(ctx: Context, if_node: cst.If) -> None:
    ctx.plan.add(
        *collective_stop(if_node, ctx.acc),
        line=ctx.line(if_node),
        text="per-process stop made collective: set_trigger() / check_trigger()",
    )
    ctx.need(if_node)
