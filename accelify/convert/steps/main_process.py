"""Code run on the main process only (``if accelerator.is_main_process:`` around a write) may
hold work every rank must do once converted: an ``evaluate(model, val_loader)`` that gathers, a
forward of the prepared model (DDP broadcasts buffers in it). On one rank alone that hangs. A
call of the file's that does such work runs before the guarded code, on every rank; a forward
of a prepared model inside runs unwrapped; what cannot be taken out leaves the code unguarded,
for review."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.buffered_models import builds_no_buffers
from accelify.analysis.dataflow import fresh, names_in_scope
from accelify.analysis.objects import callee
from accelify.analysis.syntax import dotted, target_names, walk
from accelify.convert.steps.context import Context, unwrap
from accelify.edits.collective_rewrites import computed_before


def guard(ctx: Context, node: cst.CSTNode, text: str, what: str) -> bool:
    """``node`` under the main-process test, with what every rank must run taken out first;
    False (and a review line that starts with ``what``) when that cannot be done."""
    every_rank = _every_rank_calls(ctx, node)
    stuck = next((c for c in every_rank if not _hoistable(ctx, c, node)), None)
    if stuck is not None:
        test, note = ctx.main_process_test_at(node)
        ctx.plan.review(
            ctx.line(node),
            f"{what}, and this code calls {ctx.code(stuck.func)}() (line {ctx.line(stuck)}), "
            "which every rank must run (it evaluates over a sharded loader, runs the model or "
            "trains): compute its result on every rank first, then run the rest under "
            f"`if {test}:`{note}",
        )
        return False
    taken = names_in_scope(ctx.model, ctx.model.scope_of(node))
    for call in every_rank:
        name = fresh("result", taken)
        ctx.plan.add(
            *computed_before(call, node, name),
            line=ctx.line(call),
            text=f"{ctx.code(call.func)}() runs on every rank, before the main process alone "
            f"uses its result ({name})",
        )
        ctx.need(node)
    ctx.guard_main_process(node, text)
    for call in _prepared_forwards(ctx, node):
        unwrap(
            ctx,
            call.func,
            call,
            f"runs {ctx.a('unwrap_model')}({dotted(call.func)}) on the main process: the "
            "prepared model's forward is a collective",
        )
    return True


def _every_rank_calls(ctx: Context, block: cst.CSTNode) -> list[cst.Call]:
    """Calls in ``block`` of the file's functions that evaluate over a loader, run a model, or
    train (`_runs_the_ranks`): after the conversion they gather or run a DDP forward, which
    every rank must reach. The outermost such calls only."""
    found: list[cst.Call] = []
    for call in ctx.model.calls:
        if not ctx.facts.placement.inside(call, block) or any(
            ctx.facts.placement.inside(call, outer) for outer in found
        ):
            continue
        target = callee(ctx.model, call)
        if target is not None and _runs_the_ranks(ctx, target[0], set()):
            found.append(call)
    return found


def _runs_the_ranks(ctx: Context, function: cst.FunctionDef, seen: set[int]) -> bool:
    if id(function) in seen:
        return False
    seen.add(id(function))
    if ctx.facts.collective_reach.synchronising_call(function) is not None:
        return True
    flow = ctx.facts.flow
    if any(loop.scope is function and flow.reads_loader(loop) for loop in ctx.model.loops):
        return True
    for call in ctx.model.index.calls_directly_in(function):
        if flow.is_forward(call) and not _forward_syncs_nothing(ctx, call):
            return True
        target = callee(ctx.model, call)
        if target is not None and _runs_the_ranks(ctx, target[0], seen):
            return True
    return False


def _forward_syncs_nothing(ctx: Context, call: cst.Call) -> bool:
    """``self.G(z)`` in a ``@torch.no_grad()`` sampler, ``self.G`` built of ``torch.nn``
    layers without buffers wherever the file sets it (`buffered_models.builds_no_buffers`):
    DDP's forward then broadcasts no buffers and prepares no reduction, so the main process
    may run it alone (a GAN's ``samples = self.sample(64)`` before its ``np.save``). A model
    with buffers, or one whose making the file does not show, syncs in its forward."""
    if not any(ctx.model.disables_grad(a) for a in ctx.model.ancestors(call)):
        return False
    name = dotted(call.func)
    if name is None:
        return False
    index = ctx.model.index
    made = index.assignments_in_class(name, call) if name.startswith("self.") else []
    if not name.startswith("self."):
        made = index.assignments_to(name)
    return bool(made) and all(builds_no_buffers(ctx.model, a.value) for a in made)


def _hoistable(ctx: Context, call: cst.Call, block: cst.CSTNode) -> bool:
    """``call`` runs once when ``block`` runs (no loop, test or function around it inside the
    block, and the block itself is a statement or a ``with``) and reads nothing the block binds
    (its file handle): it can run before the block."""
    if isinstance(block, _CONDITIONAL) and not isinstance(block, cst.With):
        return False
    for ancestor in ctx.model.ancestors(call):
        if ancestor is block:
            break
        if isinstance(ancestor, _CONDITIONAL):
            return False
    bound: set[str] = set()
    for node in walk(block):
        if isinstance(node, cst.AssignTarget):
            bound |= target_names(node.target)
        elif isinstance(node, cst.AsName):
            bound |= target_names(node.name)
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.NamedExpr)):
            bound |= target_names(node.target)
    read = {n.value for n in walk(call) if isinstance(n, cst.Name)}
    return not read & bound


#: What may run a call inside it other than once: loops, tests, functions, comprehensions.
_CONDITIONAL = (
    *(cst.For, cst.While, cst.If, cst.Try, cst.With, cst.FunctionDef, cst.Lambda),
    *(cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp),
    *(cst.IfExp, cst.BooleanOperation),
)


def _prepared_forwards(ctx: Context, block: cst.CSTNode) -> list[cst.Call]:
    prepared = set(ctx.plan.prepared)
    return [
        call
        for call in ctx.model.calls
        if ctx.facts.placement.inside(call, block)
        and dotted(call.func) in prepared
        and ctx.facts.flow.is_forward(call)
    ]
