"""10. Evaluation: predictions and labels are gathered together with ``gather_for_metrics``, so
totals and accuracies cover the whole evaluation set, not one rank's shard. What is gathered,
and whether that is safe, is the analysis's (`accelify.analysis.evaluation`); a loop it is unsure
of stays as it is, with a review line that says why."""

from __future__ import annotations

import libcst as cst

from accelify.analysis import names
from accelify.analysis.evaluation import Evaluation
from accelify.analysis.helper_evaluation import HelperEvaluation
from accelify.analysis.script_model import Kind, Loop
from accelify.analysis.syntax import dotted, walk
from accelify.convert.steps import handed_accelerator
from accelify.convert.steps.context import HANDED_ACCELERATOR, Context
from accelify.edits.collective_rewrites import gather_for_metrics
from accelify.edits.plan import NoteKind


def _whole_loaders(ctx: Context, loop: Loop) -> list[str | None]:
    """The loaders an evaluation left as it is reads whole on every rank. None known for one
    over ``loaders[split]`` whose loaders the conversion cannot name (`keyed_loaders_unknown`):
    what `unprepared_loaders` names there is the container (``self.loaders`` kept from
    ``T({"val": vl, "test": sl})``), which may hold prepared loaders, so the review may not say
    its metrics are right as they are."""
    if ctx.facts.flow.keyed_loaders_unknown(loop):
        return []
    return ctx.unprepared_loaders(loop)


def run(ctx: Context) -> None:
    gathered_helpers: set[int] = set()
    for evaluation in ctx.facts.evaluations:
        if evaluation.already_gathered or not evaluation.sinks:
            continue
        if id(evaluation.loop.node) in ctx.left_whole:
            continue  # what it evaluates is whole on every rank: its own review line says so
        helper = ctx.facts.helper_evaluations.get(id(evaluation.loop.node))
        if helper is not None and _gather_in_helper(ctx, helper, gathered_helpers):
            continue
        if evaluation.unsure is not None:
            whole = _whole_loaders(ctx, evaluation.loop)
            advice = evaluation.advice or (
                "gather predictions and labels together with "
                f"{ctx.a_at(evaluation.line_node, 'gather_for_metrics')} "
                "before the metrics"
            )
            if whole and evaluation.advice is None:
                # gathered over a loader every rank reads whole, each sample counts N times
                advice = (
                    f"it reads {loader_names(whole)}, which is not prepared (every rank reads "
                    "all of it, so its metrics are right as they are); to shard it, prepare the "
                    f"loader, then {advice}"
                )
            # over a loader every rank reads whole, the number is the original's as it is
            differs = evaluation.unsure_differs_on_n_ranks and not whole
            ctx.plan.review(
                ctx.line(evaluation.line_node),
                f"evaluation left as is: {evaluation.unsure}; {advice}",
                NoteKind.DIFFERS_ON_N_RANKS if differs else NoteKind.PLAIN,
            )
            _metric_driven_steps(ctx, evaluation)
            continue
        if evaluation.combined_by and not gathers_instead_of_reducing(ctx, evaluation):
            ctx.plan.review(
                ctx.line(evaluation.combined_by[0]),
                "evaluation left as is: its totals are combined across ranks after the loop; "
                "a prepared loader repeats samples to even out the last batches and the "
                "combined totals count them: gather predictions and labels in the loop with "
                f"{ctx.a_at(evaluation.combined_by[0], 'gather_for_metrics')} instead, and "
                "combine nothing after it",
            )
            continue
        unprepared = ctx.unprepared_loaders(evaluation.loop)
        if unprepared and all(n in ctx.kept_for_writes for n in unprepared):
            _review_kept_for_writes(ctx, evaluation, unprepared)  # type: ignore[arg-type]
            continue
        if unprepared:
            ctx.plan.review(
                ctx.line(evaluation.loop.node),
                f"evaluation left as is: it reads {loader_names(unprepared)}, which is not "
                "prepared (every rank reads all of it): gathering would count each sample once "
                "per rank; prepare the loader, then gather predictions and labels together with "
                f"{ctx.a_at(evaluation.loop.node, 'gather_for_metrics')}",
            )
            continue
        made = _gather(ctx, evaluation)
        if made and evaluation.caveat is not None:
            ctx.plan.review(
                ctx.line(evaluation.caveat_at or evaluation.line_node),
                f"evaluation gathered, but {evaluation.caveat}",
                NoteKind.DIFFERS_ON_N_RANKS,
            )
        if not made and not ctx.plan.reaches(evaluation.statement):
            # a plan confined to a trainer class cannot reach a module-level helper that its
            # caller hands ``trainer.val_loader``: say so rather than leave 1/N of the metrics
            ctx.plan.review(
                ctx.line(evaluation.line_node),
                "evaluation left as is: the conversion makes no edit here (no accelerator "
                "reaches this code); where its loader is a prepared one, each rank evaluates "
                "only its shard and the metrics cover 1/N of the set: gather predictions and "
                f"labels together with {ctx.a_at(evaluation.line_node, 'gather_for_metrics')} "
                "before the metrics",
            )


def gathers_instead_of_reducing(ctx: Context, evaluation: Evaluation) -> bool:
    """A hand-written DDP evaluation that sums its totals over the ranks after the loop
    (``dist.all_reduce(correct)``): the all-reduces go and the loop gathers like any other.
    Reduced as it was, the totals would count the samples the prepared loader repeats to even
    out its last batches (65 samples in batches of 16 on 2 ranks are counted as 96)."""
    return (
        bool(evaluation.combined_by)
        and evaluation.unsure is None
        and not evaluation.already_gathered
        and bool(evaluation.sinks)
        and all(_all_reduce_statement(ctx, call) for call in evaluation.combined_by)
        and id(evaluation.loop.node) not in ctx.facts.helper_evaluations
        and not ctx.unprepared_loaders(evaluation.loop)
    )


def _all_reduce_statement(ctx: Context, call: cst.Call) -> bool:
    statement = ctx.model.parent(ctx.model.parent(call))
    return (
        bool(ctx.model.call_names(call) & names.ALL_REDUCE)
        and isinstance(ctx.model.parent(call), cst.Expr)
        and isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
    )


def reductions_replaced_by_gathers(ctx: Context) -> dict[cst.Call, cst.CSTNode]:
    """The all-reduces `gathers_instead_of_reducing` removes, with their statements."""
    return {
        call: ctx.model.parent(ctx.model.parent(call))
        for evaluation in ctx.facts.evaluations
        if gathers_instead_of_reducing(ctx, evaluation)
        for call in evaluation.combined_by
    }


def _gather_in_helper(ctx: Context, helper: HelperEvaluation, done: set[int]) -> bool:
    """``eval_step(model, batch)`` per batch: its forward's outputs and labels gathered inside
    it, once for all the loops that call it. False (the loop's own review line stands) when
    the loop reads an unprepared loader or the gather cannot be made there."""
    if ctx.unprepared_loaders(helper.loop):
        return False
    if id(helper.helper) in done:
        return True
    made = _gather(ctx, helper.evaluation)
    if made:
        done.add(id(helper.helper))
        if helper.evaluation.caveat is not None:
            ctx.plan.review(
                ctx.line(helper.evaluation.caveat_at or helper.evaluation.line_node),
                f"evaluation gathered, but {helper.evaluation.caveat}",
                NoteKind.DIFFERS_ON_N_RANKS,
            )
    return bool(made)


def _review_kept_for_writes(ctx: Context, evaluation: Evaluation, whole: list[str]) -> None:
    """An evaluation of a loader left whole for a file the main process writes from it (every
    sample's prediction listed): preparing that loader, as the usual advice says, would shard
    the file too. What shards this evaluation alone is a loader of its own."""
    lines = ", ".join(str(ctx.line(ctx.kept_for_writes[n])) for n in whole)
    ctx.plan.review(
        ctx.line(evaluation.loop.node),
        f"evaluation left as is: it reads {loader_names(whole)} (left unprepared for the file "
        f"the main process writes from it at line {lines}), so every rank evaluates all of it "
        "and its metrics are right as they are (not sharded); to shard this evaluation alone, "
        "give it a DataLoader of its own over the same data, prepare that one, and gather "
        "predictions and labels together with "
        f"{ctx.a_at(evaluation.loop.node, 'gather_for_metrics')}",
    )


def loader_names(unprepared: list[str | None]) -> str:
    named = [f"`{name}`" for name in unprepared if name is not None]
    if None in unprepared:
        named.append("a loader made in a call's arguments")
    return " and ".join(named)


def _gather(ctx: Context, evaluation: Evaluation) -> bool:
    assert evaluation.statement is not None and evaluation.forward is not None
    # outside the class that owns ``self.accelerator``: ``trainer.accelerator`` in the scope
    # that made the trainer, or one handed to the module-level helper that evaluates
    acc = ctx.reachable_accelerator(evaluation.statement)
    handed = None
    if acc is None:
        handed = handed_accelerator.calls_to_pass(ctx, evaluation.statement)
        if handed is None:
            return False
        acc = HANDED_ACCELERATOR
    targets = [*evaluation.gathered, *(f.name for f in evaluation.fields)]
    values = [*evaluation.gathered, *(f.code for f in evaluation.fields)]
    renamed = [(use, f.name) for f in evaluation.fields for use in f.uses]
    extract = None
    if evaluation.extracted is not None:
        # ``se += ((model(x) - y) ** 2).sum()`` -> ``outputs = model(x)``, the gather, then
        # ``se += ((outputs - y) ** 2).sum()``.
        extract = (evaluation.forward, evaluation.extracted)
    pads = []
    if evaluation.pad_index is not None:
        # each value padded into its name to the ranks' longest second dimension, then gathered
        pad = f"{acc}.pad_across_processes"
        pads = [
            f"{t} = {pad}({v}, dim=1, pad_index={evaluation.pad_index})"
            for t, v in zip(targets, values, strict=True)
        ]
        values = list(targets)
    apart = [t for t in targets if t in evaluation.apart] if len(targets) > 1 else []
    joined = [(t, v) for t, v in zip(targets, values, strict=True) if t not in apart]
    gathers = [_gather_code(acc, [t for t, _ in joined], [v for _, v in joined])] if joined else []
    gathers = pads + gathers
    gathers += [_gather_code(acc, [name], [name]) for name in apart]
    made = ctx.plan.add(
        *gather_for_metrics(evaluation.statement, gathers, renamed, extract),
        line=ctx.line(evaluation.statement),
        text=f"evaluation: {', '.join(targets)} gathered from every rank (gather_for_metrics)"
        + _gathered_apart(apart, evaluation.outputs)
        + _kept_local(ctx, evaluation)
        + _padded(evaluation),
        anywhere=acc != ctx.acc,
    )
    if made and acc == ctx.acc:
        ctx.need(evaluation.statement)
    if made and handed is not None:
        handed_accelerator.hand_in(ctx, evaluation.statement, handed)
    return bool(made)


def _padded(evaluation: Evaluation) -> str:
    if evaluation.pad_index is None:
        return ""
    return (
        "; each padded first to the ranks' longest sequence (pad_across_processes, dim=1, "
        f"pad_index={evaluation.pad_index}: the value the metrics' mask leaves out, so the "
        "padding counts for nothing)"
    )


def _gathered_apart(apart: list[str], outputs: list[str]) -> str:
    if not apart:
        return ""
    made = [name for name in apart if name in outputs]
    read = [name for name in apart if name not in outputs]
    text = ""
    if read:
        its = "its" if len(read) == 1 else "their"
        text += (
            f"; {', '.join(read)} on {its} own: never read as a tensor, it may be a list, "
            "which a tuple would gather as objects"
        )
    if made:
        its = "its" if len(made) == 1 else "their"
        text += (
            f"; {', '.join(made)} on {its} own: the forward's output is a list here (made a "
            "tensor later, or returned as a list), which a tuple would gather as objects"
        )
    return text


def _kept_local(ctx: Context, evaluation: Evaluation) -> str:
    if evaluation.kept_local is None:
        return ""
    return (
        f" for the metrics only: line {ctx.line(evaluation.kept_local)} reshapes to one rank's "
        "batch size and keeps this rank's values"
    )


def _gather_code(acc: str, targets: list[str], values: list[str]) -> str:
    call = f"{acc}.gather_for_metrics"
    if len(targets) == 1:
        code = f"{targets[0]} = {call}({values[0]})"
    else:
        code = f"{', '.join(targets)} = {call}(({', '.join(values)}))"
    if len(code) <= 80:
        return code
    if len(targets) == 1:
        return f"{targets[0]} = {call}(\n    {values[0]}\n)"
    return f"{', '.join(targets)} = {call}(\n    ({', '.join(values)})\n)"


def _metric_driven_steps(ctx: Context, evaluation: Evaluation) -> None:
    """``scheduler.step(val_loss)`` (ReduceLROnPlateau) fed by an evaluation left per rank: each
    rank decides its own learning rate, and the ranks' parameters drift apart."""
    scope = ctx.model.scope_of(evaluation.loop.node)
    metrics = {name for sink in evaluation.sinks for name in written(sink)}
    fed = fed_by(ctx, scope, metrics)
    for call in ctx.model.calls:
        if not (steps_scheduler_on_a_value(ctx, call) and ctx.model.scope_of(call) is scope):
            continue
        read = {name for a in call.args for name in reads(a.value)}
        if read & fed:
            ctx.plan.review(
                ctx.line(call),
                f"{ctx.code(call.func)}(...) reads a metric of the evaluation at line "
                f"{ctx.line(evaluation.loop.node)}, which stays this rank's: each rank would "
                "change its learning rate on its own shard's metric and the ranks' parameters "
                "drift apart; gather the evaluation first",
            )


def written(sink: cst.CSTNode) -> set[str]:
    """The names a metric statement folds into: ``total += ...``, ``losses.append(...)``, and
    the attribute a method keeps it in (``self.total += ...``: ``self.total``, not ``self``)."""
    found = set()
    for node in walk(sink):
        if isinstance(node, cst.AugAssign | cst.AssignTarget):
            found |= stored(node.target)
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            container = node.func.value
            while isinstance(container, cst.Subscript):
                container = container.value
            chain = dotted(container)
            if chain:
                found.add(chain)
    return found


def fed_by(ctx: Context, scope: cst.CSTNode, sources: set[str]) -> set[str]:
    """``sources`` and every name of ``scope`` assigned from them, transitively. A store into
    an attribute or an item feeds that attribute (``self.best = train_loss`` feeds
    ``self.best``), not the object: ``self.validate()`` after it reads nothing fed."""
    fed = set(sources)
    assignments = [
        node
        for node in walk(scope)
        if isinstance(node, cst.Assign) and ctx.model.scope_of(node) is scope
    ]
    grown = True
    while grown and fed:
        grown = False
        for assign in assignments:
            if not reads(assign.value) & fed:
                continue
            for target in assign.targets:
                for name in stored(target.target) - fed:
                    fed.add(name)
                    grown = True
    return fed


def reads(node: cst.CSTNode) -> set[str]:
    """The names and attribute chains ``node`` reads, each chain with its prefixes:
    ``self.best`` reads ``self`` and ``self.best``; ``self.validate()`` reads ``self`` and
    ``self.validate``, never a bare ``validate`` or ``best``."""
    found: set[str] = set()
    pending: list[cst.CSTNode] = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, cst.Name | cst.Attribute) and (chain := dotted(current)):
            parts = chain.split(".")
            found |= {".".join(parts[: i + 1]) for i in range(len(parts))}
        elif isinstance(current, cst.Attribute):
            pending.append(current.value)  # ``make().x``: what the call reads
        else:
            pending += current.children
    return found


def stored(target: cst.BaseExpression) -> set[str]:
    """What an assignment target binds: a name, an attribute chain (``self.best``), the
    container an item is stored in (``history["train"]``: ``history``), each element of an
    unpacking."""
    if isinstance(target, cst.Tuple | cst.List):
        return {name for element in target.elements for name in stored(element.value)}
    if isinstance(target, cst.StarredElement):
        return stored(target.value)
    if isinstance(target, cst.Subscript):
        target = target.value
    chain = dotted(target)
    if chain is not None:
        return {chain}
    return {n.value for n in walk(target) if isinstance(n, cst.Name)}


def steps_scheduler_on_a_value(ctx: Context, call: cst.Call) -> bool:
    """``scheduler.step(metric)``: a scheduler (ReduceLROnPlateau) that decides on a value."""
    func = call.func
    return (
        isinstance(func, cst.Attribute)
        and func.attr.value == "step"
        and bool(call.args)
        and ctx.facts.flow.kind_of(dotted(func.value), call) is Kind.SCHEDULER
    )
