"""LR schedulers sized by the length of a loader a trainer prepares as it receives it.

``__init__(self, loader)`` prepares ``loader`` at its first line and keeps it as
``self.loader``; ``fit()`` then makes ``OneCycleLR(optimizer, total_steps=len(self.loader) *
epochs)`` and prepares it. ``len(self.loader)`` is now one rank's shard, N times smaller, and the
prepared scheduler steps N times per ``step()``: the schedule ends after 1/N of the training
and the rest runs at its last rate (realconv34's vae_class shape with a OneCycleLR: on 2 ranks
the rate reached its floor in the first of 3 epochs, silently). In a flat script the prepare
goes below the scheduler, so its ``len()`` reads the whole loader; here the prepare is where the
loader arrives, so the scheduler is left out of prepare: it steps once per optimizer step, and
the shard's length counts exactly the steps each rank takes. One already prepared gets a review
line."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.loss_sources import last_binding
from accelify.analysis.scheduler_preparation import PROCESS_COUNT
from accelify.analysis.script_model import Binding, Kind
from accelify.analysis.syntax import dotted, walk
from accelify.convert.steps.context import Context

#: how many local bindings (``steps = len(self.loader) * epochs``) a sizing is followed through
_DEPTH = 3


def left_out(ctx: Context, chosen: dict[str, Kind]) -> dict[str, cst.Call]:
    """The schedulers of ``chosen`` sized by such a length, with the ``len()`` each reads:
    left out of prepare, each steps once per optimizer step, and its length counts the steps
    each rank takes (a shard's batches per epoch): the schedule keeps its pace, as on one
    process."""
    found: dict[str, cst.Call] = {}
    for binding in ctx.model.of_kind(Kind.SCHEDULER):
        if chosen.get(binding.name) is Kind.SCHEDULER and not binding.received:
            length = sized_by_a_received_loader(ctx, binding)
            if length is not None:
                found[binding.name] = length
    return found


def run(ctx: Context) -> None:
    """Once every ``prepare`` is placed: a review line at each prepared scheduler still sized
    by such a length (one a ``prepare`` took before the loader's method was seen)."""
    for binding in ctx.model.of_kind(Kind.SCHEDULER):
        if binding.received or binding.name not in ctx.plan.prepared:
            continue
        length = sized_by_a_received_loader(ctx, binding)
        if length is None:
            continue
        shown = ctx.model.module.code_for_node(length)
        ctx.plan.review(
            binding.line,
            f"{binding.name} is sized by {shown}, a loader the class prepares as it receives "
            f"it: on N processes {shown} is one rank's shard, N times smaller, and the "
            f"prepared {binding.name} steps N times per step(), so its schedule ends after 1/N "
            f"of the training; leave {binding.name} out of prepare (it then steps once per "
            "step, over the shard's batches) or size it with the whole loader's length",
        )


def sized_by_a_received_loader(ctx: Context, binding: Binding) -> cst.Call | None:
    """The ``len()`` the scheduler of ``binding`` is sized with, of a loader a method of its
    class prepares as it receives it (`Context.received_preparations`): the attribute it is
    kept under anywhere in the class, or the parameter in that method itself, below the
    prepare. None when no such length is read, or the sizing names the process count (meant
    for N steps per call)."""
    placement = ctx.facts.placement
    for owner, method, prepared, kept in ctx.received_preparations:
        if not placement.inside(binding.statement, owner):
            continue
        measured = {kept[name] for name in prepared if name in kept}
        if placement.inside(binding.statement, method):
            measured |= set(prepared)
        length = _length_read(ctx, binding.value, binding.statement, measured, _DEPTH, set())
        if length is not None:
            return length
    return None


def _length_read(
    ctx: Context,
    expression: cst.CSTNode,
    at: cst.CSTNode,
    measured: set[str],
    depth: int,
    seen: set[int],
) -> cst.Call | None:
    """The first ``len(<one of measured>)`` ``expression`` reads, directly or through the
    last binding above ``at`` of a name it reads; None when a value on the way names the
    process count."""
    if id(expression) in seen:
        return None
    seen.add(id(expression))
    if PROCESS_COUNT.search(ctx.model.module.code_for_node(expression)):
        return None
    for node in walk(expression):
        if isinstance(node, cst.Call) and dotted(node.func) == "len" and len(node.args) == 1:
            if dotted(node.args[0].value) in measured:
                return node
            continue
        if depth > 0 and isinstance(node, cst.Name):
            binding = last_binding(ctx.model, node.value, at)
            if isinstance(binding, cst.Assign):
                found = _length_read(ctx, binding.value, binding, measured, depth - 1, seen)
                if found is not None:
                    return found
    return None
