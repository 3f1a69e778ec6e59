"""Gradient accumulation written by hand becomes ``Accelerator(gradient_accumulation_steps=...)``
and ``with accelerator.accumulate(model):`` when the analysis found it rewritable; otherwise it
stays (it is correct as written) and a review line says why."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.accumulation import (
    ManualAccumulation,
    accumulated_models,
    stepped_every,
    stepped_every_in_step,
)
from accelify.analysis.dataflow import variables_in
from accelify.analysis.objects import bound_arguments
from accelify.analysis.script_model import Kind, Loop
from accelify.analysis.syntax import dotted, walk
from accelify.convert.steps.accelerator import PassedNames, locals_of
from accelify.convert.steps.context import Context
from accelify.edits.node_rewrites import Swap
from accelify.edits.plan import NoteKind, Plan, expression


def run(ctx: Context) -> None:
    for loop in ctx.model.loops:
        found = ctx.facts.accumulation_in(loop)
        if found is None:
            # the backward may run in a helper the loop calls per batch (``train_step(batch)``)
            trains = loop.trains or ctx.facts.calls.trains_through_calls(loop.node)
            kept = stepped_every(loop, ctx.facts) if trains else None
            if kept is not None and _innermost_around(ctx, loop, kept):
                models = accumulated_models(loop, ctx.facts)
                ctx.review_at(
                    kept,
                    "manual gradient accumulation kept as written (not a shape the conversion "
                    "rewrites): correct, but every backward all-reduces; use "
                    f"accelerator.accumulate({models[0] if models else 'model'}) to skip the "
                    "syncs between steps",
                )
                _review_schedulers_stepped_per_optimizer_step(ctx, kept, loop, rewritten=False)
            continue
        if found.unaccounted is not None:
            ctx.review_at(found.division, f"manual gradient accumulation kept: {found.unaccounted}")
            _review_schedulers_stepped_per_optimizer_step(ctx, found.condition, loop, False)
            continue
        steps, unreadable = _steps_where_prepared(ctx, found, loop)
        withheld = ctx.withheld.get("gradient_accumulation_steps")
        if steps is not None and withheld is not None:
            steps, unreadable = None, withheld
            _review_schedulers_stepped_per_optimizer_step(ctx, found.condition, loop, False)
        if steps is None:
            ctx.plan.review(found.line, f"manual gradient accumulation kept: {unreadable}")
            continue
        ctx.constructor["gradient_accumulation_steps"] = steps
        _apply(found, ctx.plan, ctx.acc, accumulated_models(loop, ctx.facts), steps)
        ctx.need(loop.node)
        _review_schedulers_stepped_per_batch(ctx, found)
        _review_schedulers_stepped_per_optimizer_step(ctx, found.condition, loop, rewritten=True)
    reviewed: set[int] = set()
    for _, step in ctx.facts.step_driven_loops:
        kept = stepped_every_in_step(step, ctx.facts)
        if kept is not None and id(kept) not in reviewed:
            reviewed.add(id(kept))
            ctx.review_at(
                kept,
                f"manual gradient accumulation kept as written ({step.name.value}(), which a "
                "training loop calls per batch, steps the optimizer every few calls): correct, "
                "but every backward all-reduces; use "
                f"accelerator.accumulate({_model_of(ctx, step)}) to skip the syncs between steps",
            )


def _innermost_around(ctx: Context, loop: Loop, kept: cst.If) -> bool:
    """No loop inside ``loop`` holds ``kept`` too: the epoch loop around the batch loop whose
    step test it is reviews nothing (the batch loop's line says what its loader gives)."""
    placement = ctx.facts.placement
    return not any(
        other is not loop
        and placement.inside(other.node, loop.node)
        and placement.inside(kept, other.node)
        for other in ctx.model.loops
    )


def _model_of(ctx: Context, function: cst.FunctionDef) -> str:
    """The one prepared model ``function`` reads (``self.model``), as advice names it; else
    ``model``."""
    read = {
        shown
        for node in walk(function.body)
        if isinstance(node, (cst.Name, cst.Attribute))
        and (shown := dotted(node)) in ctx.plan.prepared
        and ctx.facts.flow.is_model_name(shown, node)
    }
    return read.pop() if len(read) == 1 else "model"


def _steps_where_prepared(
    ctx: Context, found: ManualAccumulation, loop: Loop
) -> tuple[str | None, str | None]:
    """The step count as the Accelerator's constructor can read it: it is made where the objects
    are prepared (`ctx.scope`), or in a caller that reads that scope's names through its call.
    A count the training loop's own function defines (``accum_steps`` of ``def
    train_one_epoch(..., accum_steps)``, ``tcfg["accum"]`` after ``tcfg = self.cfg["train"]`` in
    a trainer's method) does not exist there: ``Accelerator(gradient_accumulation_steps=
    accum_steps)`` would raise NameError. A parameter reads as what the function's one call,
    made in the preparing scope, passes for it (``cfg["accum_steps"]``); else (None, why)."""
    placement = ctx.facts.placement
    function = placement.enclosing_function(loop.node)
    if found.steps is None or function is None or function is ctx.scope:
        return found.steps_code, None
    read = variables_in(ctx.model, found.steps)
    own = read & locals_of(ctx, function)
    same_class = (
        isinstance(ctx.scope, cst.FunctionDef)
        and ctx.facts.calls.owner(function) is not None
        and ctx.facts.calls.owner(function) is ctx.facts.calls.owner(ctx.scope)
    )
    if same_class:  # ``self.args.accum`` reads the instance the accelerator is made for
        own.discard("self")
    if not own:
        return found.steps_code, None
    name = function.name.value
    why = (
        f"its step count {found.steps_code} reads {', '.join(sorted(own))}, which {name}() "
        "defines, and the Accelerator, made where the objects are prepared, cannot read it; "
        "pass Accelerator(gradient_accumulation_steps=...) a value that exists there"
    )
    parameters = {p.name.value for p in function.params.params}
    calls = ctx.facts.flow.calls_of(function)
    if not own <= parameters or len(calls) != 1:
        return None, why
    call, implicit = calls[0]
    if ctx.model.scope_of(call) is not ctx.scope:
        return None, why
    passed = {
        parameter: argument.value
        for parameter, argument in bound_arguments(function, call, implicit)
        if parameter in own
    }
    if set(passed) != own:
        return None, why
    renamed = found.steps.visit(PassedNames(passed))
    return cst.Module([]).code_for_node(renamed), None


def _review_schedulers_stepped_per_batch(ctx: Context, found: ManualAccumulation) -> None:
    """A ``scheduler.step()`` in the loop outside the accumulation test steps on every batch in
    the original. Inside ``accumulate()`` an unprepared one still does (and ACC401 reports it),
    a prepared one steps only when the optimizer does: either way the reader decides which
    pace the schedule is sized for."""
    flow, placement = ctx.facts.flow, ctx.facts.placement
    for step in flow.scheduler_steps(flow.names_of(Kind.SCHEDULER)):
        call = step.call
        if not placement.inside(call, found.loop) or placement.inside(call, found.condition):
            continue
        ctx.plan.review(
            ctx.line(call),
            f"{ctx.code(call)} runs on every batch, outside the accumulation step test, as in "
            f"the original: inside {ctx.a('accumulate')}() a prepared scheduler steps only "
            "when the optimizer does, an unprepared one on every batch; if the schedule "
            f"counts optimizer steps, step it under `if {ctx.a('sync_gradients')}:`",
        )


def _review_schedulers_stepped_per_optimizer_step(
    ctx: Context, condition: cst.If, loop: Loop, rewritten: bool
) -> None:
    """A prepared ``scheduler.step()`` under the accumulation step test steps once per rank at
    each optimizer step, and each rank steps its optimizer every few of its own batches (and,
    inside ``accumulate()`` - ``rewritten``, the test now ``sync_gradients`` - at its last one
    too: rounded up): N x ceil(len(loader) / N / k) steps an epoch where the original makes
    ceil(len(loader) / k) (6 for 5 with 19 batches, k = 4, on 2 ranks). A schedule sized to the
    original's count (``T_max=ceil(len(loader) / k) * epochs`` read before prepare) ends early
    or runs past its end, a cosine climbing again: the count to size it by is the one the
    prepared loader gives. Each rank's count is the prepared loader's only when the loop's
    loader is prepared; else the line says only that each call steps N times."""
    flow, placement = ctx.facts.flow, ctx.facts.placement
    prepared = set(ctx.plan.prepared) | ctx.model.prepared_names
    sharded = flow.reads_loader(loop) and not ctx.unprepared_loaders(loop)
    if rewritten:
        rounded = f"rounded up, as {ctx.a('accumulate')}() also steps at the last batch"
        original = "len(loader) / k, rounded as its step test rounds"
    else:
        rounded = "rounded as the step test rounds"
        original = f"len(loader) / k, {rounded}"
    for step in flow.scheduler_steps(flow.names_of(Kind.SCHEDULER)):
        call = step.call
        if step.scheduler not in prepared or not placement.inside(call, condition):
            continue
        if not sharded:
            ctx.plan.review(
                ctx.line(call),
                f"{ctx.code(call)} steps with each accumulated optimizer step: prepared, it "
                f"steps once per rank ({ctx.a('num_processes')} times a call), so a schedule "
                "sized to the original's count of optimizer steps ends early (a cosine climbs "
                "again): size it from the optimizer steps each rank makes times "
                f"{ctx.a('num_processes')}",
            )
            continue
        ctx.plan.review(
            ctx.line(call),
            f"{ctx.code(call)} steps with each accumulated optimizer step: prepared, it steps "
            "once per rank, and each rank steps its optimizer every k of its own batches "
            f"(len(loader) / N of them): len(loader) / N / k times, {rounded}; so on N ranks "
            f"an epoch makes N times that count where the original makes {original}: they "
            "differ unless each "
            "rank's batches divide by k, and a schedule sized to the original's count ends "
            "early or runs past its end (a cosine climbs again); size it after prepare, from "
            "the prepared loader's length (each rank's batches) / k, "
            f"{rounded}, times {ctx.a('num_processes')}",
            kind=NoteKind.DIFFERS_ON_N_RANKS,
        )


def _apply(found: ManualAccumulation, plan: Plan, acc: str, models: list[str], steps: str) -> None:
    if isinstance(found.division, cst.AugAssign) or (
        isinstance(found.division, cst.Assign)
        and isinstance(found.division.value, cst.BinaryOperation)
        and dotted(found.division.value.left) == found.loss
    ):
        plan.remove(
            found.division_statement,
            found.line,
            f"removed `{found.loss} / {found.steps_code}` (accelerator.backward divides)",
        )
    else:
        plan.replace(
            found.division.value,
            lambda updated: updated.left,
            found.line,  # type: ignore[union-attr]
            f"removed `/ {found.steps_code}` (accelerator.backward divides)",
        )
    for product in found.multiplied:
        plan.replace(
            product,
            lambda updated: updated.left,
            found.line,
            f"`{found.loss}.item() * {found.steps_code}` -> `{found.loss}.item()`",
        )
    plan.replace(
        found.condition.test,
        Swap(f"{acc}.sync_gradients"),
        found.line,
        f"accumulation step test -> {acc}.sync_gradients",
    )
    context = f"{acc}.accumulate({', '.join(models)})"

    def wrap(updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, cst.For)
        inner = cst.With(items=[cst.WithItem(expression(context))], body=updated.body)
        return updated.with_changes(body=cst.IndentedBlock(body=[inner]))

    plan.wrap(found.loop, wrap)
    plan.change(
        found.line,
        f"manual accumulation -> Accelerator(gradient_accumulation_steps={steps}) "
        f"and `with {context}:` (also steps at the end of each epoch)",
    )
