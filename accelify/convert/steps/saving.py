"""9. Saving and other writes meant to happen once: ``torch.save`` -> ``accelerator.save`` after a
barrier every rank reaches, files opened for writing on the main process only."""

from __future__ import annotations

import libcst as cst

from accelify.analysis import names, side_effects
from accelify.analysis.dataflow import fresh, names_in_scope
from accelify.analysis.objects import callee
from accelify.analysis.syntax import dotted, target_names, walk
from accelify.convert.steps.context import Context, unwrap
from accelify.edits import rewrites
from accelify.edits.collective_rewrites import computed_before


def run(ctx: Context) -> None:
    guarded_writes = _plan_file_writes(ctx)
    for line_statement, call in ctx.facts.placement.expression_statements():
        if not ctx.model.call_names(call) & names.TORCH_SAVE:
            continue
        _unwrap_saved_model(ctx, call)
        if any(ctx.facts.placement.inside(call, block) for block in guarded_writes):
            continue  # writes into a file only the main process opens
        if ctx.facts.shared_files.kept_on_every_rank(call):
            continue  # a per-process path read back: each rank saves its own file
        barriers = []
        if not ctx.facts.ranks.under_rank_guard(call):
            barriers = ctx.facts.ranks.barrier_places(line_statement)
        outside = ctx.instance_outside_class(call)
        if outside is not None:
            _save_through_instance(ctx, call, outside, barriers)
            continue
        if not ctx.plan.reaches(call):
            _save_on_the_main_process(ctx, line_statement, call, barriers)
            continue
        ctx.plan.add(
            *rewrites.save(call, ctx.acc, barriers),
            line=ctx.line(call),
            text=f"torch.save -> {ctx.a('save')} (main process only)",
        )
        ctx.need(call)
        for anchor in barriers:
            ctx.need(anchor)


def _save_on_the_main_process(
    ctx: Context, line_statement: cst.CSTNode, call: cst.Call, barriers: list[cst.CSTNode]
) -> None:
    """``torch.save(...)`` where ``self.accelerator`` cannot be reached and no instance is
    named: kept as it is, under ``if PartialState().is_main_process:``, after the same
    barriers (the process state has both, not ``save``)."""
    state = ctx.process_state()
    ctx.plan.add(
        rewrites.main_process_only(line_statement, state),
        *(rewrites.barrier(anchor, state) for anchor in barriers),
        line=ctx.line(call),
        text=f"torch.save on the main process only (if {state}.is_main_process:)",
        anywhere=True,
    )


def _save_through_instance(
    ctx: Context, call: cst.Call, instance: str, barriers: list[cst.CSTNode]
) -> None:
    """``torch.save(trainer.model.state_dict(), path)`` outside the class that owns
    ``self.accelerator`` (a callback handed the trainer, ``main()`` after ``trainer.fit()``):
    saved through ``trainer.accelerator``, the model unwrapped, when every barrier before it is
    in the same function (where ``trainer`` is the same name); else left for review."""
    function = ctx.facts.placement.enclosing_function(call)
    if any(ctx.facts.placement.enclosing_function(b) is not function for b in barriers):
        ctx.plan.review(
            ctx.line(call),
            f"left as is: the barrier before this save would be outside the reach of {instance}",
        )
        return
    acc = f"{instance}.accelerator"
    saved = call.args[0].value if call.args else None
    if (
        isinstance(saved, cst.Call)
        and isinstance(saved.func, cst.Attribute)
        and saved.func.attr.value == "state_dict"
        and not saved.args
    ):
        saved = saved.func.value
    owned = dotted(saved) if isinstance(saved, cst.Attribute) else None
    if owned is not None and owned.startswith(f"{instance}.") and owned.count(".") == 1:
        attribute = "self." + owned.split(".", 1)[1]
        if attribute in ctx.plan.prepared and ctx.facts.flow.is_model_name(attribute, ctx.scope):
            ctx.plan.add(
                rewrites.unwrap(saved, acc),
                line=ctx.line(call),
                text=f"saves {acc}.unwrap_model({owned}), not the DDP wrapper",
                anywhere=True,
            )
    ctx.plan.add(
        *rewrites.save(call, acc, barriers),
        line=ctx.line(call),
        text=f"torch.save -> {acc}.save (main process only)",
        anywhere=True,
    )


def _unwrap_saved_model(ctx: Context, call: cst.Call) -> None:
    """``torch.save(model, path)`` of a prepared model pickles the DDP wrapper otherwise."""
    if not call.args:
        return
    saved = call.args[0].value
    if isinstance(saved, (cst.Name, cst.Attribute)) and ctx.facts.flow.is_model_name(
        dotted(saved), call
    ):
        unwrap(
            ctx, saved, call, f"saves {ctx.a('unwrap_model')}({dotted(saved)}), not the DDP wrapper"
        )


def file_write_blocks(ctx: Context) -> list[cst.With]:
    """``with open(path, "w") as f:`` blocks meant to run on the main process only: every rank
    truncating and writing the same file races. Not one under a rank test already, nor a
    per-process path."""
    return [
        with_node
        for with_node in ctx.facts.placement.withs()
        if not ctx.facts.ranks.under_rank_guard(with_node)
        and any(
            side_effects.opens_for_writing(item.item)
            and not ctx.facts.shared_files.kept_on_every_rank(item.item)  # type: ignore[arg-type]
            for item in with_node.items
        )
    ]


def _plan_file_writes(ctx: Context) -> list[cst.With]:
    """The blocks of `file_write_blocks` under ``if accelerator.is_main_process:``, the
    prepared models they run called unwrapped (a DDP forward is a collective: from one rank it
    hangs). A block that trains, gathers or iterates a loader every rank shards stays on every
    rank, for review. A bare ``open`` for writing is left for review."""
    guarded = []
    reviewed = []
    for with_node in file_write_blocks(ctx):
        stays = _must_run_everywhere(ctx, with_node)
        if stays is not None:
            ctx.plan.review(
                ctx.line(with_node),
                f"a file is written on every rank, and this block {stays}: guarded whole with "
                f"`if {ctx.a('is_main_process')}:` the other ranks would skip that and hang, or "
                "the file would hold one rank's shard; open and write the file under that test "
                "around the writes alone (values that differ between ranks gathered first with "
                f"{ctx.a('gather_for_metrics')})",
            )
            reviewed.append(with_node)
            continue
        every_rank = _every_rank_calls(ctx, with_node)
        if any(not _hoistable(ctx, call, with_node) for call in every_rank):
            call = next(c for c in every_rank if not _hoistable(ctx, c, with_node))
            ctx.plan.review(
                ctx.line(with_node),
                f"a file is written on every rank, and this block calls {ctx.code(call.func)}() "
                f"(line {ctx.line(call)}), which every rank must run (it evaluates over a "
                "sharded loader or runs the model): compute its result before the block, then "
                f"write the file under `if {ctx.a('is_main_process')}:`",
            )
            reviewed.append(with_node)
            continue
        taken = names_in_scope(ctx.model, ctx.model.scope_of(with_node))
        for call in every_rank:
            name = fresh("result", taken)
            ctx.plan.add(
                *computed_before(call, with_node, name),
                line=ctx.line(call),
                text=f"{ctx.code(call.func)}() runs on every rank, before the file is written "
                f"on the main process (its result as {name})",
            )
            ctx.need(with_node)
        ctx.guard_main_process(
            with_node, f"file written on the main process only (if {ctx.a('is_main_process')}:)"
        )
        for call in _prepared_forwards(ctx, with_node):
            unwrap(
                ctx,
                call.func,
                call,
                f"runs {ctx.a('unwrap_model')}({dotted(call.func)}) on the main process: the "
                "prepared model's forward is a collective",
            )
        guarded.append(with_node)
    for call in ctx.model.calls:
        inside_guarded = any(
            ctx.facts.placement.inside(call, block) for block in (*guarded, *reviewed)
        )
        if (
            side_effects.opens_for_writing(call)
            and not inside_guarded
            and not ctx.facts.shared_files.kept_on_every_rank(call)
            and not ctx.facts.ranks.under_rank_guard(call)
        ):
            ctx.plan.review(
                ctx.line(call),
                "a file is written on every rank: guard it with `if accelerator.is_main_process:`",
            )
    return guarded


def _must_run_everywhere(ctx: Context, block: cst.With) -> str | None:
    """What in ``block`` every rank must run, in words, or None."""
    synchronising = ctx.facts.collective_reach.synchronising_in(block)
    if synchronising is not None:
        return f"runs {ctx.code(synchronising.func)}(...) (line {ctx.line(synchronising)})"
    prepared = set(ctx.plan.prepared)
    for loop in ctx.model.loops:
        if not ctx.facts.placement.inside(loop.node, block) or not ctx.facts.flow.reads_loader(
            loop
        ):
            continue
        origins = ctx.facts.flow.origins(loop.iterable, loop.node)
        if origins & prepared or not origins:
            return f"iterates {loop.iterable}, which every rank shards (line {ctx.line(loop.node)})"
    return None


def _every_rank_calls(ctx: Context, block: cst.With) -> list[cst.Call]:
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
    placement = ctx.facts.placement
    if any(
        placement.inside(loop.node, function) and ctx.facts.flow.reads_loader(loop)
        for loop in ctx.model.loops
    ):
        return True
    for call in ctx.model.calls:
        if not placement.inside(call, function):
            continue
        if ctx.facts.flow.is_forward(call):
            return True
        target = callee(ctx.model, call)
        if target is not None and _runs_the_ranks(ctx, target[0], seen):
            return True
    return False


def _hoistable(ctx: Context, call: cst.Call, block: cst.With) -> bool:
    """``call`` runs once when ``block`` runs (no loop, test or function around it inside the
    block) and reads nothing the block binds (its file handle): it can run before the block."""
    for ancestor in ctx.model.ancestors(call):
        if ancestor is block:
            break
        if isinstance(ancestor, _CONDITIONAL):
            return False
    bound = {
        name
        for item in block.items
        if item.asname is not None
        for name in target_names(item.asname.name)
    }
    for node in walk(block.body):
        if isinstance(node, cst.AssignTarget):
            bound |= target_names(node.target)
    read = {n.value for n in walk(call) if isinstance(n, cst.Name)}
    return not read & bound


#: What may run a call inside it other than once: loops, tests, functions, comprehensions.
_CONDITIONAL = (
    *(cst.For, cst.While, cst.If, cst.Try, cst.With, cst.FunctionDef, cst.Lambda),
    *(cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp),
    *(cst.IfExp, cst.BooleanOperation),
)


def _prepared_forwards(ctx: Context, block: cst.With) -> list[cst.Call]:
    prepared = set(ctx.plan.prepared)
    return [
        call
        for call in ctx.model.calls
        if ctx.facts.placement.inside(call, block)
        and dotted(call.func) in prepared
        and ctx.facts.flow.is_forward(call)
    ]
