"""Review lines for what prepare cannot shard or synchronise: batches that do not come from a
DataLoader or from one that is not prepared, parameters updated by hand."""

from __future__ import annotations

import re

import libcst as cst

from accelify.analysis import names
from accelify.analysis.flow import entry_name, string_key_of
from accelify.analysis.loops import iterated_expression
from accelify.analysis.loss_sources import last_binding
from accelify.analysis.objects import attributes_kept, bound_arguments, loader_property
from accelify.analysis.own_values import OwnValues
from accelify.analysis.pass_counters import pass_counters
from accelify.analysis.randomness import draws_alike_per_step, randomness_of
from accelify.analysis.returned_values import discarded_by_every_caller
from accelify.analysis.sample_counts import SampleCount
from accelify.analysis.script_model import Kind, Loop
from accelify.analysis.shard_totals import ShardTotal, list_mean
from accelify.analysis.syntax import dotted, is_print_alone, rebound_targets, target_names, walk
from accelify.convert.steps.context import TARGET_MODULES, Context
from accelify.convert.steps.evaluation import loader_names
from accelify.convert.steps.host_inputs import cpu_only, prepared_model_called
from accelify.edits import rewrites
from accelify.edits.plan import NoteKind


def run(ctx: Context) -> None:
    _gradients_assigned_by_hand(ctx)
    draws_alike_on_every_rank(ctx)
    summed = _totals_over_dataset(ctx)
    _comprehended_shard_means(ctx)
    _samples_counted(ctx)
    _meters_over_shards(ctx)
    _statistics_over_a_shard(ctx)
    _printed_training_folds(ctx, summed)
    _passes_counted(ctx)
    _loader_dicts_made_before_the_prepare(ctx)
    _loaders_that_iterate_their_own_way(ctx)
    noted = False
    for loop in ctx.model.loops:
        unprepared = _trained_unprepared(ctx, loop) if loop.trains else []
        sharded = [n for n in unprepared if n in ctx.self_sharded]
        noted = noted or bool(sharded)  # its batches come from a DataLoader, said here
        noted = noted or _reads_undecided_phases(ctx, loop)  # said where the dict is made
        if sharded and cpu_only(ctx):
            ctx.review_at(
                loop.node,
                f"this training loop reads {loader_names(sharded)}, which its own sampler "
                "shards (left out of prepare): its batches stay where the loader makes them, "
                "on the host in this script, while prepare places the model on the device; "
                "on a GPU send them there first (batch.to(accelerator.device))",
            )
        unprepared = [n for n in unprepared if n not in ctx.self_sharded]
        if unprepared:
            noted = True
            is_, it = ("are", "them") if len(unprepared) > 1 else ("is", "it")
            ctx.plan.review(
                ctx.line(loop.node),
                f"this training loop reads {loader_names(unprepared)}, which {is_} not "
                f"prepared: every rank trains on all of {it} (correct, not data-parallel); "
                f"prepare {it} to shard {it}",
            )
    for loop in ctx.model.loops:
        made_by = loader_property(ctx.model, loop.iterable, loop.node) if loop.trains else None
        if made_by is not None:
            noted = True  # its batches come from a DataLoader, prepared or reviewed here
        if made_by is not None and loop.iterable not in ctx.prepared_arguments:
            ctx.plan.review(
                ctx.line(loop.node),
                f"this training loop reads {loop.iterable}, a property that builds a DataLoader "
                f"(line {ctx.line(made_by)}) the conversion does not prepare: every rank trains "
                f"on all of it (correct, not data-parallel); build the loader once where the "
                f"class assembles its objects ({loop.iterable} = DataLoader(...)) so it is "
                "prepared and sharded",
            )
    for loop, step in ctx.facts.step_driven_loops:
        unprepared = _trained_unprepared(ctx, loop)
        if unprepared:
            noted = True
            ctx.plan.review(
                ctx.line(loop.node),
                f"this loop trains through {_step_name(ctx, step)}, which runs the backward, "
                f"and reads {loader_names(unprepared)}, which is not prepared: every rank "
                "trains on all of it (correct, not data-parallel); prepare it where the "
                "accelerator is reached to shard it",
            )
    if not noted and _no_loader_prepared(ctx):
        noted = True
        loop = next(loop for loop in ctx.model.loops if loop.trains)
        ctx.plan.review(
            ctx.line(loop.node),
            "no DataLoader of this file is prepared, and this training loop reads data the "
            "conversion could not follow back to one: if it is a DataLoader, every rank trains "
            "on all of it (correct, not data-parallel); prepare the loaders where they are made "
            "and hand the prepared ones on",
        )
    if not ctx.model.of_kind(Kind.DATALOADER):
        line = ctx.line(ctx.model.backward_calls[0])
        randomness = randomness_of(ctx.model)
        # Seeded by the script, or by the seeding step because of draws before training.
        seeded = randomness.seeded or bool(randomness.setup_draws)
        if randomness.step_draws and not seeded:
            text = None  # every rank draws its own batches: data-parallel as it is
        elif randomness.step_draws:
            text = (
                "batches are drawn from the random generator, not a DataLoader: seeded alike, "
                "every rank draws the same batches (correct, not data-parallel); seed each rank "
                "apart before the loop (set_seed(seed, device_specific=True)) to split the work"
            )
        elif noted:
            text = None  # the training loop's own line says it
        elif inline := _inline_loaders(ctx):
            text = (
                f"the DataLoader made at line {ctx.line(inline[0])} is handed straight to a "
                "call the conversion does not follow: it is not prepared, so every rank trains "
                "on all of it (correct, not data-parallel); bind it to a name and prepare it to "
                "shard it"
            )
        elif _arguments_prepared_where_received(ctx):
            text = None  # made in a call's arguments, prepared by the function that receives it
        elif handed := _handed_in_from_outside(ctx):
            name, function, loop_node = handed
            text = (
                f"the training loop at line {ctx.line(loop_node)} reads {name}, which "
                f"{function} is handed by code "
                "outside this file (no call here passes it): if it is a DataLoader, it is not "
                "prepared, so every rank trains on all of it (correct, not data-parallel); "
                "prepare it where it is made and hand the prepared loader in"
            )
        elif stepped := _step_handed_its_batches_from_outside(ctx):
            function, parameters = stepped
            text = (
                f"{function}() trains on what its {parameters} handed by code outside this "
                "file (no call here passes it): if that comes from a DataLoader there, the "
                "loader is not prepared, so every rank trains on all of it (correct, not "
                "data-parallel); prepare it where it is made, with the accelerator this file "
                "creates, to shard it"
            )
        elif unfollowed := _handed_what_is_not_followed(ctx):
            name, function, loop_node, value = unfollowed
            text = (
                f"the training loop at line {ctx.line(loop_node)} reads {name}, which "
                f"{function}() is handed {ctx.code(value)} (line {ctx.line(value)}), a value "
                "the conversion does not follow back to where it is made: if it is a "
                "DataLoader, it is not prepared, so every rank trains on all of it (correct, "
                "not data-parallel); bind the loaders to names where they are received "
                "(train_loader, val_loader = ...) so they are prepared"
            )
        elif returned := _loader_returned_by_a_method(ctx):
            loop, call, made = returned
            text = (
                f"the training loop at line {ctx.line(loop.node)} reads {loop.iterable}, the "
                f"DataLoader {ctx.code(call)} returns (made at line {ctx.line(made)}), a method "
                "called on an object the conversion does not follow: it is not prepared, so "
                "every rank trains on all of it (correct, not data-parallel); prepare it where "
                f"it is received ({loop.iterable} = {ctx.a('prepare')}({loop.iterable})) to "
                "shard it"
            )
        elif per_round := _loader_of_an_outer_loop(ctx):
            loop, outer, made = per_round
            text = (
                f"the training loop at line {ctx.line(loop.node)} reads {loop.iterable}, a "
                f"target of the loop at line {ctx.line(outer)} over {ctx.code(outer.iter)} "
                f"(this file makes DataLoaders at line {ctx.line(made)}, which the conversion "
                "does not follow into that loop): it is not prepared, so every rank trains on "
                "all of it (correct, not data-parallel); to shard it, prepare each round's "
                f"loaders in that loop's body ({loop.iterable} = "
                f"{ctx.a('prepare')}({loop.iterable})) and gather what their evaluation "
                "computes"
            )
        elif kept := _loaders_kept_unnamed(ctx):
            text = (
                f"the DataLoader made at line {ctx.line(kept[0])} is kept in a container the "
                "conversion does not follow (a dict or a list), bound to no name: it is not "
                "prepared, so every rank trains on all of it (correct, not data-parallel); bind "
                "it to a name and prepare it before it is put in the container to shard it"
            )
        elif inherited := _batches_from_an_attribute_set_elsewhere(ctx):
            loop_node, attribute = inherited
            text = (
                f"the training loop at line {ctx.line(loop_node)} reads its batches from "
                f"{attribute}, which no code of this file sets (a base class of another module "
                "or a caller does): if a DataLoader is behind it, that loader is not prepared, "
                "so every rank trains on all of it (correct, not data-parallel); prepare the "
                "loader where it is made, before anything iterates it, and hand the prepared "
                "one in"
            )
        elif kept_from := _batches_from_a_constructor_parameter(ctx):
            loop_node, attribute, parameter, kept = kept_from
            text = (
                f"the training loop at line {ctx.line(loop_node)} reads its batches from "
                f"{attribute}, which __init__ keeps from its parameter {parameter} (line "
                f"{ctx.line(kept)}): what the callers hand it is not known to be a DataLoader "
                "here (a DataLoader subclass, or one made where the conversion does not follow), "
                "so it is not prepared: if it is a DataLoader, every rank trains on all of it "
                "(correct, not data-parallel); to shard it, prepare it where the class keeps it "
                f"({attribute} = {ctx.a_at(kept, 'prepare')}({attribute}))"
            )
        else:
            text = (
                "batches do not come from a DataLoader: every rank trains on the same data; "
                "wrap the data in a DataLoader and prepare it to shard it"
            )
        if text is not None:
            ctx.plan.review(line, text)
    by_hand = [c for c in ctx.model.backward_calls if not ctx.facts.trains_itself(c)]
    inline = _inline_optimizers(ctx)
    for call in inline if by_hand else []:
        ctx.plan.review(
            ctx.line(call),
            f"the optimizer made here is handed straight to {ctx.code(_receiver(ctx, call))}"
            "(), bound to no name, so it is not prepared: it steps on the DDP-averaged gradients "
            "as it is (right without mixed precision), but under --mixed-precision fp16 it "
            "would step on the scaled gradients; bind it to a name and prepare it with the model",
        )
    if by_hand and not ctx.model.of_kind(Kind.OPTIMIZER) and not inline:
        line = ctx.line(by_hand[0])
        models = {b.name for b in ctx.model.of_kind(Kind.MODEL)}
        kept = _optimizers_kept_unnamed(ctx)
        returned = [call for call in kept if isinstance(ctx.model.parent(call), cst.Return)]
        if models & set(ctx.plan.prepared) and returned:
            function = ctx.facts.placement.enclosing_function(returned[0])
            maker = f"{function.name.value}()" if function is not None else "a function"
            text = (
                f"the optimizer made at line {ctx.line(returned[0])} is returned by {maker}, "
                "whose caller the conversion does not follow (a method called on another "
                "object), so it is not prepared: it steps on the DDP-averaged gradients as it "
                "is (right without mixed precision), but under --mixed-precision fp16 it would "
                "step on the scaled gradients; prepare it with the model where the caller "
                "receives it"
            )
        elif models & set(ctx.plan.prepared) and kept:
            text = (
                f"the optimizers made at line {ctx.line(kept[0])} are kept in a container "
                "the conversion does not follow (a dict or a list), so they are not prepared: "
                "they step on the DDP-averaged gradients as they are (right without mixed "
                "precision), but under --mixed-precision fp16 they would step on the scaled "
                "gradients; bind each to a name and prepare it with the model"
            )
        elif models & set(ctx.plan.prepared):
            text = (
                "parameters are updated by hand (no torch.optim optimizer): the update runs "
                "on every rank with DDP-averaged gradients; check it"
            )
        else:
            text = (
                "no optimizer and no model the conversion recognises, so nothing that trains "
                "is prepared: no gradient is averaged across ranks, each rank trains its own "
                "copy; prepare the model and its optimizer"
            )
        ctx.plan.review(line, text)


def _gradients_assigned_by_hand(ctx: Context) -> None:
    """``meta_grads = torch.autograd.grad(meta_loss, self.weights)`` then ``w.grad = g`` in the
    same function, ahead of a prepared optimizer's step (MAML's outer loop, a hand-written
    second-order update): DDP averages the gradients a ``backward()`` through the prepared
    model's own forward produces; these never pass through it, so each rank steps on its own.
    The ranks stay in step only while they compute the same gradients (the same data on every
    rank); once each draws its own, they drift apart with nothing said. A gradient penalty
    (``autograd.grad`` with no ``.grad`` assigned) is left alone: its gradient goes into a loss
    that is backpropagated as usual."""
    if not ctx.plan.prepared:
        return
    for call in ctx.model.calls:
        if "torch.autograd.grad" not in ctx.model.qualified(call.func):
            continue
        function = ctx.facts.placement.enclosing_function(call)
        scope = function if function is not None else ctx.model.module
        if not _assigned_to_grad(ctx, call, scope):
            continue
        reduce = ctx.a_at(call, "reduce")
        ctx.plan.review(
            ctx.line(call),
            "gradients computed with torch.autograd.grad and assigned to .grad by hand: DDP "
            "averages only what a backward() through the prepared model's forward computes, so "
            "each rank steps on its own gradients (the ranks agree only while every rank "
            "computes on the same data); average each gradient across ranks before it is "
            f"assigned ({reduce}(g, 'mean'))",
        )
        return


def _assigned_to_grad(ctx: Context, call: cst.Call, scope: cst.CSTNode) -> bool:
    """A ``.grad = value`` of ``scope`` whose value comes from what ``call`` (an
    ``autograd.grad``) binds: ``meta_grads = autograd.grad(...)``, then ``for w, g in
    zip(ws, meta_grads): w.grad = g``. Names follow assignments and loop targets whose value
    reads one already found. ``p.grad = None`` (clearing before a gradient penalty's
    backward) and a value from elsewhere are not meta-gradients assigned by hand."""
    bound = ctx.model.parent(call)
    if not isinstance(bound, cst.Assign):
        return False
    found = set().union(*(target_names(t.target) for t in bound.targets))
    grows = True
    while grows:
        grows = False
        for node in walk(scope):
            if isinstance(node, cst.Assign) and _reads(node.value, found):
                targets = [t.target for t in node.targets]
            elif isinstance(node, cst.For) and _reads(node.iter, found):
                targets = [node.target]
            else:
                continue
            more = set().union(*(target_names(t) for t in targets)) - found
            if more:
                found |= more
                grows = True
    return any(
        isinstance(node, cst.Assign)
        and any(
            isinstance(t.target, cst.Attribute) and t.target.attr.value == "grad"
            for t in node.targets
        )
        and _reads(node.value, found)
        for node in walk(scope)
    )


def _loaders_that_iterate_their_own_way(ctx: Context) -> None:
    """A training loop over an instance of a DataLoader subclass of the file with its own
    ``__iter__``/``__len__``: a prepared loader iterates a plain DataLoader over the same data
    set, so prepare would drop what the subclass does to its batches; the analysis leaves it
    unprepared (not a DataLoader to it), and the review says so and how to shard it."""
    classes = ctx.model.iterating_loader_classes
    if not classes:
        return
    made = {
        target: dotted(assign.value.func)
        for assign in ctx.model.assignments
        if isinstance(assign, cst.Assign)
        and isinstance(assign.value, cst.Call)
        and dotted(assign.value.func) in classes
        for target in target_names(assign.targets[0].target)
    }
    for loop in ctx.model.loops:
        name = loop.iterable
        if name not in made or not (loop.trains or ctx.facts.calls.trains_through_calls(loop.node)):
            continue
        cls = made[name]
        own = ", ".join(f"{m}()" for m in classes[cls])  # type: ignore[index]
        ctx.plan.review(
            ctx.line(loop.node),
            f"this training loop reads {name}, a {cls}: a DataLoader subclass with its own "
            f"{own}, which a prepared loader (a plain DataLoader over the same data set) would "
            "not run, so it is not prepared: every rank trains on all of it (correct, not "
            "data-parallel); to shard it, move what that method does into the data set or a "
            "collate_fn and prepare the loader, or give it a sampler of this rank's share "
            "(DistributedSampler(dataset, num_replicas=accelerator.num_processes, "
            "rank=accelerator.process_index))",
        )


def _reads(value: cst.BaseExpression, found: set[str]) -> bool:
    return any(isinstance(n, cst.Name) and n.value in found for n in walk(value))


def _totals_over_dataset(ctx: Context) -> set[tuple[int, str]]:
    """``running_loss / len(train_loader.dataset)`` over a prepared loader: this rank's sum
    over the whole set's size; ``total_loss / len(train_loader)``: this rank's batches' mean.
    Returns the (loop id, total) of the sums made the whole run's before their print."""
    summed: set[tuple[int, str]] = set()
    for found in ctx.facts.shard_totals:
        loader = found.loop.iterable
        if _phases_split(ctx, found.loop):  # the trained entries prepared, the others whole
            phases = ctx.facts.phase_loaders[loader]  # type: ignore[index]
            trained = ", ".join(f'"{key}"' for key in phases.trained)
            ctx.plan.review(
                ctx.line(found.division),
                f"{found.total} sums this rank's batches in the {trained} phase and is divided "
                "by the whole set's size: on N ranks it reads about 1/N of the value there "
                "(the phases evaluated on every rank's whole set are right); gather each "
                f"batch's values with {ctx.a_at(found.division, 'gather_for_metrics')} before "
                "summing them",
                kind=NoteKind.DIFFERS_ON_N_RANKS,
            )
            continue
        whole = ctx.unprepared_loaders(found.loop)
        if whole:  # every rank reads all of it: the quotient is right, but for a prepared one
            _shard_value_beside_a_whole_loader(ctx, found.loop, found.division, whole)
            continue
        if found.over_batches and _printed_as_the_whole_runs_mean(ctx, found):
            summed.add((id(found.loop.node), found.total))
            continue
        if found.over_batches and _returned_to_no_reader(ctx, found):
            continue
        if found.over_batches:
            mean = found.mean or f"{found.total} / {ctx.code(found.divisor)}"
            reduced = found.mean or found.total
            # a backward in the body, or in a function it calls (a factory's train_step)
            trains = found.loop.trains or ctx.facts.calls.trains_through_calls(found.loop.node)
            ctx.plan.review(
                ctx.line(found.division),
                f"{mean} is the mean of this rank's batches "
                f"of {loader} only: on N ranks what the main process shows is its own shard's "
                "mean, not the whole set's; "
                + (
                    _list_gathered(ctx, found.total, found.mean)
                    if trains and found.mean is not None
                    else "for the whole set's, reduce it on every rank after the loop (each "
                    "rank has as many batches): "
                    f"{_across_ranks(ctx, found.division, reduced, 'mean')}"
                    if trains  # a collective per training step would cost more
                    else "gather each batch's values with "
                    f"{ctx.a_at(found.division, 'gather_for_metrics')} "
                    "before summing them for the whole set's"
                ),
                kind=NoteKind.DIFFERS_ON_N_RANKS,
            )
            continue
        loader = _loader_read(ctx, found.loop)
        size = found.size_from or _size_read(ctx, found.divisor, loader)
        divided = "shown over" if isinstance(found.division, cst.FormattedString) else "divided by"
        ctx.plan.review(
            ctx.line(found.division),
            f"{found.total} sums this rank's batches of {loader} and is {divided} the whole "
            f"set's size ({size}): on N ranks it reads about 1/N of the value; "
            "reducing the total is not enough (the prepared loader repeats samples to even out "
            f"the last batch): gather each batch's values with "
            f"{ctx.a_at(found.division, 'gather_for_metrics')} before summing them",
            kind=NoteKind.DIFFERS_ON_N_RANKS,
        )
    return summed


def _phases_split(ctx: Context, loop: Loop) -> bool:
    """``loop`` reads ``loaders[phase]`` of a dict whose entries for the phases it trains on
    are prepared where the dict is made, and those it only evaluates left whole
    (`PhaseLoaders`): a value over it is one rank's shard's in the training phases only. Not
    so for a dict written in a call (``run(model, {"train": tl, "val": vl})``), whose loaders
    are prepared by name, every one, or a dict of loaders none of which is prepared."""
    phases = ctx.facts.phase_loaders.get(loop.iterable or "")
    if phases is None or not phases.decided or phases.loop is not loop:
        return False
    prepared = set(ctx.plan.prepared)
    return any(entry_name(name, key) in prepared for name in phases.names for key in phases.trained)


def _returned_to_no_reader(ctx: Context, found: ShardTotal) -> bool:
    """``return total / len(loader)`` of a training helper whose callers never read the
    result: no line shows this rank's mean, so there is nothing to review."""
    shown = ctx.statement_of(found.division)
    returned = shown.body[0] if isinstance(shown, cst.SimpleStatementLine) else None
    return (
        isinstance(returned, cst.Return)
        and returned.value is found.division
        and discarded_by_every_caller(ctx.facts, returned)
    )


def _printed_as_the_whole_runs_mean(ctx: Context, found: ShardTotal) -> bool:
    """``print(f"... {total / len(train_loader):.4f}")`` right after the training loop that
    sums ``total``, in the same block: the print is the user's metric, so the sum becomes the
    mean of the ranks' sums before it (`rewrites.whole_run_sum`) and the main process prints
    the whole run's batch mean (each rank has as many batches), which is the original's on one
    process. Only where every rank reaches that line (the loop's own block, which they all
    run), the total is a plain name, and this print is the only place it is divided:
    another division (a history entry, a later line) keeps its review line, and the sum is
    then left as each rank's."""
    division = found.division
    if not (
        found.loop.trains
        and found.mean is None
        and isinstance(division, cst.BinaryOperation)
        and found.total.isidentifier()
    ):
        return False
    shown = ctx.statement_of(division)
    if not is_print_alone(shown):
        return False
    block = ctx.model.parent(shown)
    if block is None or block is not ctx.model.parent(found.loop.node):
        return False
    lines = list(getattr(block, "body", ()))
    if lines.index(found.loop.node) > lines.index(shown):
        return False
    between = lines[lines.index(found.loop.node) + 1 : lines.index(shown)]
    if not all(_falls_through(line) for line in between):
        return False  # a rank that leaves before the print would leave the others in the gather
    if not _read_once_as_numerator(shown, division, found.total):
        return False
    if any(
        other is not found and other.total == found.total and other.loop is found.loop
        for other in ctx.facts.shard_totals
    ):
        return False
    if _read_beside(ctx, found, shown):
        return False
    acc = ctx.reachable_accelerator(shown)
    if acc is None:
        return False
    planned = ctx.plan.add(
        rewrites.whole_run_sum(shown, found.total, acc),
        line=ctx.line(shown),
        text=f"{found.total} summed over every rank before it is shown (gather_object): "
        f"{ctx.code(division)} prints the whole run's batch mean, not the main process's shard's",
        anywhere=acc != ctx.acc,
    )
    if not planned:
        return False
    if acc == ctx.acc:
        ctx.need(shown)
    if "gather_object" not in ctx.uses:
        ctx.uses.append("gather_object")
    return True


def _falls_through(line: cst.CSTNode) -> bool:
    """A simple statement that cannot leave its block (no ``continue``, ``break``, ``return``
    or ``raise``): every rank that runs the loop reaches the print after it."""
    return isinstance(line, cst.SimpleStatementLine) and not any(
        isinstance(node, (cst.Continue, cst.Break, cst.Return, cst.Raise)) for node in walk(line)
    )


def _read_once_as_numerator(shown: cst.CSTNode, division: cst.BinaryOperation, total: str) -> bool:
    """The print reads ``total`` only as what ``division`` divides: shown alone (``correct
    {correct}``), the mean of the ranks' counts would be printed, and an integer count as a
    float on one process."""
    reads = [node for node in walk(shown) if isinstance(node, cst.Name) and node.value == total]
    return len(reads) == 1 and reads[0] is division.left


def _read_beside(ctx: Context, found: ShardTotal, shown: cst.CSTNode) -> bool:
    """The sum is read in its function elsewhere than its own folding and the print: a test
    (``if total < best``), a history, a return. Those keep their value, this rank's sum: the
    sum is then left as it is (with its review line)."""
    function = ctx.facts.placement.enclosing_function(shown) or ctx.model.module
    for node in ctx.model.index.own_nodes(function):
        if not isinstance(node, cst.Name) or node.value != found.total:
            continue
        if ctx.model.inside(node, shown) or _folded_by(ctx, node, found):
            continue
        parent = ctx.model.parent(node)
        if isinstance(parent, cst.AssignTarget):  # ``total = 0.0`` at each epoch's start
            continue
        return True
    return False


def _folded_by(ctx: Context, node: cst.Name, found: ShardTotal) -> bool:
    """``node`` is the target of a ``total += ...`` of the training loop that sums it."""
    parent = ctx.model.parent(node)
    return (
        isinstance(parent, cst.AugAssign)
        and parent.target is node
        and ctx.model.inside(parent, found.loop.node)
    )


def _samples_counted(ctx: Context) -> None:
    """``seen += len(x)`` per training batch, then ``seen`` or ``total / seen`` shown: over a
    prepared loader, this rank's count and this rank's mean (`sample_counts`). One review
    line per line that shows them. Said, not rewritten: the sum of the counts across ranks
    also counts the samples the prepared loader repeats to even out the last batch."""
    by_line: dict[int, list[SampleCount]] = {}
    mixed: list[SampleCount] = []
    phased: dict[int, list[SampleCount]] = {}
    for found in ctx.facts.sample_counts:
        if not ctx.unprepared_loaders(found.loop):  # else every rank counts the whole set
            # at the statement that shows it: one line for a print written over several
            by_line.setdefault(ctx.line(ctx.statement_of(found.read)), []).append(found)
        elif _phases_split(ctx, found.loop):
            phased.setdefault(ctx.line(ctx.statement_of(found.read)), []).append(found)
        else:
            mixed.append(found)
    _counted_on_the_prepared_calls(ctx, mixed)
    for line, found in phased.items():
        _counted_in_the_trained_phases(ctx, line, found)
    for line, found in by_line.items():
        shown = list(dict.fromkeys(_shown_count(entry) for entry in found))
        summed = list(dict.fromkeys(v for e in found for v in (e.total, e.shown) if v is not None))
        first = found[0]
        where = f"line {ctx.line(first.bump)}"
        if first.through is not None:
            where = f"{first.through}, counted at {where}"
        means = any(entry.total is not None for entry in found)
        share = "its own shard's mean" if means else "its own shard's count (about 1/N of it)"
        values = summed[0] if len(summed) == 1 else f"[{', '.join(summed)}]"
        ctx.plan.review(
            line,
            f"{_listed(shown)} {'are' if len(shown) > 1 else 'is'} over this rank's "
            f"samples of {first.loop.iterable} only ({where}): on N ranks the main process "
            f"shows {share}, not the whole set's; for the whole set's, sum "
            f"{'them' if len(summed) > 1 else 'it'} across ranks on every rank after the loop "
            f"and show that: {_across_ranks(ctx, first.read, values)} (which also "
            "counts the samples the prepared loader repeats to even out the last batch)",
            kind=NoteKind.DIFFERS_ON_N_RANKS,
        )


def _counted_in_the_trained_phases(ctx: Context, line: int, found: list[SampleCount]) -> None:
    """``for x, y in loaders[phase]:`` whose backward runs in the "train" phase only, its
    count or mean shown after the loop: the loaders of the phases it trains on are prepared,
    those it only evaluates are left whole (`PhaseLoaders`), so the value is this rank's
    shard's in a training phase and the whole set's in the others. A reduce must run in the
    training phases only (in the others it would count the set N times): said, with which."""
    first = found[0]
    phases = ctx.facts.phase_loaders[first.loop.iterable]  # type: ignore[index]
    container = first.loop.iterable
    trained = _listed([entry_name(container, key) for key in phases.trained])
    whole = _listed([entry_name(container, key) for key in phases.evaluated])
    shown = _listed(list(dict.fromkeys(_shown_count(entry) for entry in found)))
    reduces = "; ".join(
        dict.fromkeys(
            _across_ranks(
                ctx,
                entry.read,
                entry.shown if entry.total is None else f"{entry.total} / {entry.shown}",
                "sum" if entry.total is None else "mean",
            )
            for entry in found
        )
    )
    many = len(phases.evaluated) > 1
    ctx.plan.review(
        line,
        f"{shown} {'are' if len(found) > 1 else 'is'} over this rank's samples in the phases "
        f"the loop at line {ctx.line(first.loop.node)} trains on ({trained}, prepared): on N "
        "ranks the main process shows its own shard's value there, not the whole set's "
        f"({whole} {'are' if many else 'is'} read whole by every rank: right as it is); for "
        f"the whole set's, reduce on every rank in the training phases only: {reduces}",
        kind=NoteKind.DIFFERS_ON_N_RANKS,
    )


def _counted_on_the_prepared_calls(ctx: Context, found: list[SampleCount]) -> None:
    """A helper whose loop both trains and evaluates (``run_epoch(model, loader,
    optimizer=None)``, called with the training loader and the validation one) and shows or
    returns its count or mean: the validation loader is left whole (every rank reads all of
    it, the value is right there), the training one is prepared, so on that call the value is
    this rank's shard's. A returned value gets a review line on each call handed a prepared
    loader, with the reduce for that call's value only (the same reduce on the validation call
    would be wrong: every rank's value there is already the whole set's); one shown in the
    helper, a line there that says to reduce it only when the loop trains."""
    prepared = set(ctx.plan.prepared) | ctx.model.prepared_names | ctx.prepared_arguments
    by_call: dict[int, tuple[cst.Call, str, list[str], list[tuple[SampleCount, str]]]] = {}
    turns: set[int] = set()
    for entry in found:
        kept, _ = _entries_apart(ctx, entry.loop, ctx.unprepared_loaders(entry.loop), prepared)
        unprepared = sorted({o for o in kept if o is not None})
        calls = []
        for argument in ctx.facts.flow.call_site_arguments(entry.loop.iterable, entry.loop.node):
            call = ctx.model.parent(argument)
            loader = _handed_loader(argument.value)
            if loader is None or not isinstance(call, cst.Call):
                continue
            # ``self.train_loader``: the object the factory made and prepared as train_loader
            held = {loader} | ctx.facts.held_origins(loader, argument)
            if held & prepared and not held & set(unprepared):
                calls.append((call, loader))
            elif held & prepared:  # ``for phase, loader in [("train", tl), ("val", vl)]``
                turns.add(id(call))  # hands the prepared one in some turns only
                calls.append((call, _listed(sorted(held & prepared))))
        if not calls:
            continue
        index = _returned_at(ctx, entry.read)
        if index is None:
            _review_shown_in_the_helper(ctx, entry, calls, unprepared)
            continue
        for call, loader in calls:
            held = _held_as(ctx, call, index)
            by_call.setdefault(id(call), (call, loader, unprepared, []))[3].append((entry, held))
    for call, loader, whole, values in by_call.values():
        _review_prepared_call(ctx, call, loader, whole, values, id(call) in turns)


def _returned_at(ctx: Context, read: cst.CSTNode) -> int | None:
    """``read`` is what its function returns (-1), or element ``i`` of the tuple it returns
    (``return total_loss / seen, correct / seen``); None when it is shown there instead."""
    parent = ctx.model.parent(read)
    if isinstance(parent, cst.Return):
        return -1
    if isinstance(parent, cst.Element):
        values = ctx.model.parent(parent)
        if isinstance(values, cst.Tuple) and isinstance(ctx.model.parent(values), cst.Return):
            return next(i for i, e in enumerate(values.elements) if e is parent)
    return None


def _held_as(ctx: Context, call: cst.Call, index: int) -> str:
    """The caller's name for the returned value (``train_loss`` of ``train_loss = run_epoch(...)``,
    ``tr_acc`` of ``tr_loss, tr_acc = ...`` for element 1), else ``value``."""
    kept = ctx.model.parent(call)
    if not isinstance(kept, cst.Assign) or len(kept.targets) != 1 or kept.value is not call:
        return "value"
    target = kept.targets[0].target
    if index >= 0 and isinstance(target, (cst.Tuple, cst.List)):
        elements = target.elements
        target = elements[index].value if index < len(elements) else target
    return dotted(target) or "value"


def _review_shown_in_the_helper(
    ctx: Context, entry: SampleCount, calls: list[tuple[cst.Call, str]], whole: list[str]
) -> None:
    """The helper shows the count or mean itself: right for the whole loaders, this rank's
    shard's on the calls handed a prepared one; a reduce there must run on those calls only."""
    shown = _shown_count(entry)
    value = entry.shown if entry.total is None else f"{entry.total} / {entry.shown}"
    how = "sum" if entry.total is None else "mean"
    lines = ", ".join(f"line {ctx.line(call)}" for call, _ in calls)
    loaders = _listed(list(dict.fromkeys(loader for _, loader in calls)))
    ctx.plan.review(
        ctx.line(ctx.statement_of(entry.read)),
        f"{shown} is over this rank's samples only when the loop reads {loaders} ({lines}): on "
        f"N ranks the main process shows its own shard's value there, not the whole set's "
        f"({_listed(whole)} {'is' if len(whole) == 1 else 'are'} read whole by every rank: "
        "right as it is); for the whole set's, reduce it on every rank only when the loop "
        f"trains: {_across_ranks(ctx, entry.read, value, how)}",
        kind=NoteKind.DIFFERS_ON_N_RANKS,
    )


def _review_prepared_call(
    ctx: Context,
    call: cst.Call,
    loader: str,
    whole: list[str],
    values: list[tuple[SampleCount, str]],
    in_turns: bool = False,
) -> None:
    """``in_turns``: the call is in a loop that hands it ``loader`` in some turns and a loader
    left whole in the others (``for phase, loader in [("train", tl), ("val", vl)]``), so the
    reduce belongs to those turns only."""
    function = ctx.code(call.func)
    kinds = {"a mean" if entry.total is not None else "a count" for entry, _ in values}
    what = _listed(sorted(kinds)) if len(values) == 1 else "means and counts"
    if kinds == {"a mean"} and len(values) > 1:
        what = "means"
    held = _listed([name for _, name in values])
    reduces = "; ".join(
        f"{name} = {_across_ranks(ctx, call, name, 'mean' if e.total is not None else 'sum')}"
        ".item()"
        for e, name in values
    )
    ctx.plan.review(
        ctx.line(call),
        f"{function}() returns {what} over this rank's samples of {loader} only (counted at "
        f"line {ctx.line(values[0][0].bump)}): on N ranks the main process shows its own "
        f"shard's {held}, not the whole set's; for the whole set's, reduce on every rank after "
        f"this call{f' in the turns that hand it {loader}' if in_turns else ''} only: "
        f"{reduces} ({function}() on {_listed(whole)} reads it whole on every rank: no reduce "
        "there)",
        kind=NoteKind.DIFFERS_ON_N_RANKS,
    )


def _listed(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _shown_count(found: SampleCount) -> str:
    if found.total is None:
        return f"{found.shown} (a count)"
    return f"{found.total} / {found.shown} (a mean)"


def _list_gathered(ctx: Context, listed: str, mean: str) -> str:
    """Advice for a list of per-batch values averaged after the loop (``sum(losses) /
    len(losses)``): gather the lists, then average as written. Not rewritten: the gather is a
    collective every rank must reach, where the average is often read on the main process
    only. A reduce of the mean as a tensor would hold float32 (float64 is not on every device)
    and print other digits than the original on one process; the gathered Python floats are
    the original's there, and on N ranks the mean of every batch (each rank has as many)."""
    module = TARGET_MODULES[ctx.options.target]["gather_object"]
    gathered = "all_" + re.findall(r"\w+", listed)[-1]  # all_train_loss of log["train_loss"]
    averaged = re.sub(rf"(?<![\w.]){re.escape(listed)}(?!\w)", gathered, mean)
    return (
        f"for the whole set's, gather the lists on every rank after the loop and average "
        f"that (each rank has as many batches): {gathered} = gather_object({listed}) (from "
        f"{module} import gather_object), then {averaged}"
    )


def _comprehended_shard_means(ctx: Context) -> None:
    """``losses = [self._step(x) for (x,) in self.train_loader]`` where the called function
    trains (runs a backward) and the loader is prepared, then ``sum(losses) / len(losses)`` (or
    ``np.mean(losses)``) in the same scope: a training loop spelled as a comprehension, whose
    mean is this rank's shard's only, as ``total / len(loader)`` of a loop is."""
    prepared = set(ctx.plan.prepared) | ctx.model.prepared_names
    for assign in ctx.model.assignments:
        comp = assign.value
        if not (
            isinstance(assign, cst.Assign)
            and len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Name)
            and isinstance(comp, cst.ListComp)
            and comp.for_in.inner_for_in is None
            and isinstance(comp.elt, cst.Call)
        ):
            continue
        loader = dotted(comp.for_in.iter)
        if loader not in prepared or ctx.facts.flow.kind_of(loader, comp) is not Kind.DATALOADER:
            continue
        if not any(_runs_a_backward(ctx, f) for f in ctx.facts.calls.targets(comp.elt)):
            continue
        listed = assign.targets[0].target.value
        scope = ctx.model.scope_of(assign)
        for node in walk(scope):
            if not (
                isinstance(node, cst.BinaryOperation | cst.Call)
                and ctx.model.order(node) > ctx.model.order(assign)
                and ctx.model.scope_of(node) is scope
                and list_mean(ctx.model, node, loader) == listed
            ):
                continue
            mean = ctx.code(node)
            ctx.plan.review(
                ctx.line(node),
                f"{mean} is the mean of this rank's batches of {loader} only ({listed} holds "
                f"what {ctx.code(comp.elt.func)}() returns for each batch of this rank's "
                "shard): on N ranks what the main process shows or writes is its own shard's "
                "mean, not the whole set's; for the whole set's, reduce it on every rank after "
                "the list is made (each rank has as many batches): "
                f"{_across_ranks(ctx, node, mean, 'mean')}",
                kind=NoteKind.DIFFERS_ON_N_RANKS,
            )
            break


def _runs_a_backward(ctx: Context, function: cst.FunctionDef) -> bool:
    """A backward call in ``function`` itself: it trains on what it is handed."""
    return any(
        ctx.facts.placement.enclosing_function(call) is function
        for call in ctx.model.backward_calls
    )


def _across_ranks(ctx: Context, at: cst.CSTNode, values: str, how: str = "sum") -> str:
    """``accelerator.reduce(torch.tensor(values, device=...), "sum")`` as code at ``at``
    reaches the accelerator, or how to hand one in."""
    acc = ctx.advised_accelerator(at)
    if acc is None:
        return (
            f"accelerator.reduce(torch.tensor({values}, device=accelerator.device), '{how}'), "
            "with the accelerator handed in (none is reachable here)"
        )
    return f"{acc}.reduce(torch.tensor({values}, device={acc}.device), '{how}')"


def _meters_over_shards(ctx: Context) -> None:
    """``meter.update(loss.item(), x.size(0))`` per training batch, ``meter.avg`` after the
    loop: over a prepared loader the meter holds this rank's batches only."""
    for found in ctx.facts.shard_meters_with(ctx.imported_meters):
        whole = ctx.unprepared_loaders(found.loop)
        if whole:  # every rank reads all of it: the meter is right, but for a prepared one
            _shard_value_beside_a_whole_loader(ctx, found.loop, found.read, whole)
            continue
        source = found.loop.node.iter
        shown = (
            ctx.code(source)
            if isinstance(source, (cst.Name, cst.Attribute, cst.Subscript))
            else found.loop.iterable
        )
        ctx.plan.review(
            ctx.line(found.read),
            f"{found.meter} ({found.kind}) is updated with this rank's batches of "
            f"{shown} only (line {ctx.line(found.update)}): on N ranks what the "
            "main process reads from it here is its own shard's value, not the whole set's; "
            "for the whole set's, reduce its totals across ranks "
            f"({ctx.a_at(found.read, 'reduce')}) before reading them",
            kind=NoteKind.DIFFERS_ON_N_RANKS,
        )


def _printed_training_folds(ctx: Context, summed: set[tuple[int, str]]) -> None:
    """A value folded from this rank's training batches and printed after the loop that folds
    it: a per-epoch sum (``c_total += c_loss.item()``, then ``print(c_total)``), a running mean
    over the batches (``running / (step + 1)``), a mean over the samples: on N ranks the main
    process prints its own shard's. `own_values` follows the printed value back (the analysis
    ACC420 and ACC409 ask); a value the evaluation step gathers is no training loop's, and a
    line another review already speaks for (`_samples_counted`) is left to it, as is a sum
    made the whole run's before its print (``summed``, `_printed_as_the_whole_runs_mean`)."""
    reviewed = {note.line for note in ctx.plan.reviews}
    counted = {(id(f.loop.node), f.total) for f in ctx.facts.sample_counts if f.total}
    trains = {
        id(loop.node)
        for loop in ctx.model.loops
        if loop.trains or ctx.facts.calls.trains_through_calls(loop.node)
    }
    view = ctx.shard_view()
    for call in ctx.model.calls:
        qualified = ctx.model.call_names(call)
        if call in ctx.facts.print_alias_calls:
            qualified = qualified | {"builtins.print"}
        if not qualified & names.PRINT or ctx.facts.ranks.under_rank_guard(call):
            continue
        line = ctx.line(ctx.statement_of(call))
        if line in reviewed:
            continue
        shown: list[tuple[str, cst.CSTNode]] = []
        for value in _printed_values(call):
            origin = OwnValues(ctx.facts, view).origin(value, call, {})
            if origin is None or not _folds(origin):
                continue  # the last batch's ``loss.item()``: one batch, as the original's
            loop = ctx.model.index.enclosing_loop(origin)
            if loop is None or id(loop) not in trains or ctx.model.inside(call, loop):
                continue
            target = dotted(origin.target) if isinstance(origin, cst.AugAssign) else None
            if (id(loop), target) in counted | summed:
                continue  # ``total`` of ``total / n``: `_samples_counted` says it
            shown.append((ctx.code(value), origin))
        if not shown:
            continue
        values = ", ".join(code for code, _ in shown)
        folded = ", ".join(sorted({str(ctx.line(origin)) for _, origin in shown}, key=int))
        device = f"{ctx.advised_accelerator(call) or 'accelerator'}.device"
        ctx.plan.review(
            line,
            f"{values} {'are' if len(shown) > 1 else 'is'} folded from this rank's training "
            f"batches only ({'lines' if ',' in folded else 'line'} {folded}): on N ranks "
            "the main process prints its own "
            "shard's, not the whole run's; for the whole run's, reduce across ranks on every "
            f"rank before printing: {ctx.a_at(call, 'reduce')}(torch.tensor(value, "
            f"device={device}), 'sum').item() of a sum (of a mean: of the sum and of what it "
            "is divided by)",
            kind=NoteKind.DIFFERS_ON_N_RANKS,
        )


def _folds(statement: cst.CSTNode) -> bool:
    """``total += loss.item()``, ``losses.append(loss.item())``, ``running = running +
    loss.item()``: each batch adds to what the ones before left."""
    if isinstance(statement, cst.AugAssign):
        return True
    if isinstance(statement, cst.Expr | cst.Call):
        call = statement.value if isinstance(statement, cst.Expr) else statement
        return (
            isinstance(call, cst.Call)
            and isinstance(call.func, cst.Attribute)
            and call.func.attr.value in ("append", "extend")
        )
    if isinstance(statement, cst.Assign):
        targets = {dotted(t.target) for t in statement.targets}
        return any(
            dotted(node) in targets
            for node in walk(statement.value)
            if isinstance(node, cst.Name | cst.Attribute)
        )
    return False


def _printed_values(call: cst.Call) -> list[cst.BaseExpression]:
    """What a print shows: its arguments, and the expressions of an f-string among them."""
    found: list[cst.BaseExpression] = []
    for argument in call.args:
        if argument.keyword is not None:
            continue
        value = argument.value
        if isinstance(value, cst.FormattedString):
            found += [
                part.expression
                for part in value.parts
                if isinstance(part, cst.FormattedStringExpression)
            ]
        elif not isinstance(value, cst.SimpleString | cst.ConcatenatedString):
            found.append(value)
    return found


def _shard_value_beside_a_whole_loader(
    ctx: Context, loop: Loop, at: cst.CSTNode, whole: list[str | None]
) -> None:
    """A training total or meter (`_totals_over_dataset`, `_meters_over_shards`) in a loop
    that reads both a loader left whole and a prepared one (``run_epoch(train_loader,
    optimizer)`` beside ``run_epoch(val_loader)``): over the whole one every rank's value is
    the set's, over the prepared one it is this rank's shard's. One reduce cannot serve both
    (it would count the whole set N times), so it is said, per loader, at the line that reads
    the value."""
    prepared = set(ctx.plan.prepared) | ctx.model.prepared_names | ctx.prepared_arguments
    origins = ctx.facts.flow.origins(loop.iterable, loop.node, stop=prepared)
    sharded = sorted(o for o in origins if o is not None and o not in whole)
    whole, entries = _entries_apart(ctx, loop, whole, prepared)
    sharded += entries
    if not whole or not sharded or not _read_on_a_sharded_call(ctx, loop, at, set(sharded)):
        return
    ctx.plan.review(
        ctx.line(at),
        f"{ctx.code(at)} covers the batches the loop at line {ctx.line(loop.node)} reads: "
        f"over {loader_names(whole)} (left unprepared) every rank reads the whole set, so the "
        f"value is right; over {loader_names(sharded)} (prepared) each rank reads its own "
        "shard, so on N ranks the value of those calls is one shard's; for the whole set's, "
        "combine the ranks' values on every rank after the calls that hand the prepared "
        f"loader only: sums and counts with {ctx.a_at(at, 'reduce')} before dividing, a list "
        "with gather_object before averaging (either also counts the samples the prepared "
        "loader repeats to even out the last batch)",
        kind=NoteKind.DIFFERS_ON_N_RANKS,
    )


def _read_on_a_sharded_call(ctx: Context, loop: Loop, at: cst.CSTNode, sharded: set[str]) -> bool:
    """The value at ``at`` is shown where it is (not returned), or returned to a call that
    hands the loop a loader of ``sharded`` and keeps what it returns: a call whose result
    is dropped (``run_epoch(model, train_dl, optimizer)`` for its training alone) shows
    nothing."""
    if _returned_at(ctx, at) is None:
        return True
    for argument in ctx.facts.flow.call_site_arguments(loop.iterable, loop.node):
        call = ctx.model.parent(argument)
        if _handed_loader(argument.value) in sharded and not isinstance(
            ctx.model.parent(call), cst.Expr
        ):
            return True
    return False


def _entries_apart(
    ctx: Context, loop: Loop, whole: list[str | None], prepared: set[str]
) -> tuple[list[str | None], list[str]]:
    """``run_epoch(model, loaders["train"], opt)`` beside ``run_epoch(model, loaders["val"])``:
    the flow follows both entries back to ``loaders``, which ``whole`` then names though the
    conversion prepared ``loaders["train"]``. The loaders left whole with each such container
    replaced by its entries the calls hand that are not prepared, and the entries prepared."""
    entries = _entries_handed(ctx, loop, {w for w in whole if w is not None})
    if not entries:
        return whole, []
    containers = {entry.partition("[")[0] for entry in entries}
    kept = [w for w in whole if w not in containers]
    kept += sorted(entry for entry in entries if entry not in prepared)
    return kept, sorted(entry for entry in entries if entry in prepared)


def _entries_handed(ctx: Context, loop: Loop, containers: set[str]) -> set[str]:
    """``loaders["train"]`` and ``loaders["val"]`` where the calls hand the loop's helper
    entries of a dict of ``containers`` (the flow follows them back to the dict as a whole):
    the conversion prepares such an entry by itself, so each entry is its own loader, prepared
    or left whole as it is named in the plan."""
    found: set[str] = set()
    for argument in ctx.facts.flow.call_site_arguments(loop.iterable, loop.node):
        entry = string_key_of(argument.value)
        if entry is not None and entry[0] in containers:
            found.add(entry_name(*entry))
    return found


def _handed_loader(value: cst.BaseExpression) -> str | None:
    """The loader a call hands as the plan names it: ``val_loader``, ``self.loader``, or
    ``loaders["train"]`` for a dict's entry under a string key."""
    entry = string_key_of(value)
    return entry_name(*entry) if entry is not None else dotted(value)


def _size_read(ctx: Context, divisor: cst.BaseExpression, loader: str | None) -> str:
    """The divisor as written when it is not a plain name (``len(train_loader.sampler)``,
    ``dataset_sizes[phase]``), else what the name it reads was assigned: the loader's data
    set's length."""
    if not isinstance(divisor, cst.Name):
        return ctx.code(divisor)
    return f"len({loader}.dataset)"


def _loader_read(ctx: Context, loop: Loop) -> str | None:
    """The loader as the loop reads it: ``dataloaders[phase]`` of a dict of loaders (also
    through ``enumerate``/``tqdm``, or a local ``loader = dataloaders[phase]``), else the name
    it iterates."""
    iterable: cst.BaseExpression = iterated_expression(loop)
    while isinstance(iterable, cst.Call) and iterable.args:
        iterable = iterable.args[0].value
    if isinstance(iterable, cst.Subscript) and dotted(iterable.value) == loop.iterable:
        return ctx.code(iterable)
    return loop.iterable


def _inline_optimizers(ctx: Context) -> list[cst.Call]:
    """``TrainState(model=model, optimizer=torch.optim.Adam(model.parameters()))`` or
    ``trainer.set_optimizer(SGD(...))``: optimizers made in a call's arguments."""
    prepared = _arguments_prepared_where_received(ctx, Kind.OPTIMIZER)
    return [
        call
        for call in ctx.model.calls
        if any(names.is_optimizer_class(q) for q in ctx.model.call_names(call))
        and isinstance(ctx.model.parent(call), cst.Arg)
        and ctx.model.parent(call) not in prepared
    ]


def _optimizers_kept_unnamed(ctx: Context) -> list[cst.Call]:
    """``optimizers = {"encoder": Adam(...)}``, ``optimizers[t] = SGD(...)``: torch.optim
    optimizers made where no name the analysis follows holds them. The update is not written
    by hand: they step as they are, unprepared."""
    return [
        call
        for call in ctx.model.calls
        if any(names.is_optimizer_class(q) for q in ctx.model.call_names(call))
        and not isinstance(ctx.model.parent(call), cst.Arg)
    ]


def _loaders_kept_unnamed(ctx: Context) -> list[cst.Call]:
    """``state = {"train_loader": DataLoader(...), ...}``: DataLoaders made as an entry or an
    element of a container written out, where no name the analysis follows holds them (the
    loop reads ``state["train_loader"]``)."""
    return [
        call
        for call in ctx.model.calls
        if ctx.model.call_names(call) & names.DATALOADERS
        and isinstance(ctx.model.parent(call), cst.DictElement | cst.Element)
    ]


def _loader_of_an_outer_loop(ctx: Context) -> tuple[Loop, cst.For, cst.Call] | None:
    """``for fold, (train_loader, val_loader) in enumerate(make_folds(x, y)):`` around a
    training loop over ``train_loader``, in a file that makes DataLoaders (``make_folds``
    builds a pair per fold): the batches may well come from a DataLoader, one the analysis
    holds no binding for, since each round of the outer loop hands it a new one. The training
    loop, the outer loop, and the first DataLoader construction of the file."""
    made = next(
        (
            node
            for node in walk(ctx.model.module)
            if isinstance(node, cst.Call) and ctx.model.call_names(node) & names.DATALOADERS
        ),
        None,
    )
    if made is None:
        return None
    for loop in ctx.model.loops:
        if not loop.trains or loop.iterable is None:
            continue
        for ancestor in ctx.model.ancestors(loop.node):
            if isinstance(ancestor, cst.For) and loop.iterable in target_names(ancestor.target):
                return loop, ancestor, made
    return None


def _loader_returned_by_a_method(
    ctx: Context,
) -> tuple[Loop, cst.Call, cst.Call] | None:
    """``train_loader = datamodule.train_dataloader()`` read by a training loop, where a method
    of that name in the file returns ``DataLoader(...)``: batches that do come from a
    DataLoader, one the analysis does not see because it comes back from another object's
    method. The loop, the call, and the DataLoader construction."""
    for loop in ctx.model.loops:
        if not loop.trains or loop.iterable is None:
            continue
        binding = last_binding(ctx.model, loop.iterable, loop.node)
        value = binding.value if isinstance(binding, cst.Assign) else None
        if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)):
            continue
        method = value.func.attr.value
        for owner in ctx.model.classes.values():
            for statement in owner.body.body:
                if not (isinstance(statement, cst.FunctionDef) and statement.name.value == method):
                    continue
                for node in walk(statement):
                    made = node.value if isinstance(node, cst.Return) else None
                    if (
                        isinstance(made, cst.Call)
                        and ctx.model.call_names(made) & names.DATALOADERS
                    ):
                        return loop, value, made
    return None


def _receiver(ctx: Context, call: cst.Call) -> cst.BaseExpression:
    """The function of the call whose argument ``call`` is."""
    outer = ctx.model.parent(ctx.model.parent(call))
    return outer.func if isinstance(outer, cst.Call) else call.func


#: Calls that walk a whole loader to recompute a model's state (its BatchNorm statistics).
_WHOLE_LOADER_PASSES = {"torch.optim.swa_utils.update_bn"}


def _statistics_over_a_shard(ctx: Context) -> None:
    """``update_bn(train_loader, swa_model)`` over a prepared loader: each rank recomputes the
    BatchNorm statistics from its own shard, so the ranks' averaged models differ (their
    evaluations are gathered from different models) and none holds the whole set's statistics,
    the ones the original saves."""
    prepared = set(ctx.plan.prepared) | ctx.model.prepared_names
    flow = ctx.facts.flow
    for call in ctx.model.calls:
        name = dotted(call.func)
        if ctx.model.imports.resolve(name or "") not in _WHOLE_LOADER_PASSES or not call.args:
            continue
        loader = dotted(call.args[0].value)
        if loader is None or not flow.origins(loader, call, stop=prepared) & prepared:
            continue
        ctx.plan.review(
            ctx.line(call),
            f"{name}() reads {loader}, which is prepared: each rank recomputes the BatchNorm "
            "statistics from its own shard, so the ranks' models differ and none has the whole "
            "set's; hand it a DataLoader over the training set that is not prepared",
        )


def _inline_loaders(ctx: Context) -> list[cst.Call]:
    """``Trainer(train_loader=DataLoader(...))``: DataLoaders bound to no name, and handed to
    no parameter the conversion prepares (``trainer.fit(DataLoader(...))`` where ``fit``
    starts with ``loader = self.accelerator.prepare(loader)``)."""
    received = _arguments_prepared_where_received(ctx)
    return [
        call
        for call in ctx.model.calls
        if ctx.model.call_names(call) & names.DATALOADERS
        and isinstance(ctx.model.parent(call), cst.Arg)
        and ctx.model.parent(call) not in received
    ]


def _arguments_prepared_where_received(ctx: Context, kind: Kind = Kind.DATALOADER) -> list[cst.Arg]:
    """The arguments bound to a parameter of ``kind`` the conversion prepares in its function
    (itself, or the attribute it is kept in: ``self.optimizer = optimizer``)."""
    flow, found = ctx.facts.flow, []
    prepared = set(ctx.plan.prepared)
    kept = {
        dotted(b.value)
        for b in ctx.model.bindings
        if b.received and b.name in prepared and dotted(b.value) is not None
    }
    for function, parameters in flow.params.items():
        loaders = {n for n, k in parameters.items() if k is kind} & (prepared | kept)
        if not loaders:
            continue
        for call, implicit in flow.calls_of(function):
            found += [a for n, a in bound_arguments(function, call, implicit) if n in loaders]
    return found


def _handed_in_from_outside(ctx: Context) -> tuple[str, str, cst.For] | None:
    """The data a training loop reads is a parameter of its function that no call of this file
    hands over (``def train(self, train_loader, epochs)`` of a trainer another file builds), or
    an attribute a method keeps from its parameter (``set_loader(self, loader)``): made by
    another file, unseen here; or a parameter the file's functions hand on to it from such a
    function. The loop's name, the receiving function's (``train()``, ``train() (through
    train_epoch())``), and the loop."""
    placement, graph = ctx.facts.placement, ctx.facts.calls
    for loop in ctx.model.loops:
        if not loop.trains or loop.iterable is None:
            continue
        function = placement.enclosing_function(loop.node)
        if function is None:
            continue
        if loop.iterable in {p.name.value for p in function.params.params}:
            outermost = _received_from_outside(ctx, function, loop.iterable, set())
            if outermost is not None and outermost[0] is function:
                return loop.iterable, f"{function.name.value}()", loop.node
            if outermost is not None:  # handed on to it by this file's functions
                outer, parameter = outermost
                through = (
                    f"{outer.name.value}() (as its {parameter}, handed on to "
                    f"{function.name.value}())"
                )
                return loop.iterable, through, loop.node
            continue
        owner = placement.class_of(function)
        if owner is None or not loop.iterable.startswith("self."):
            continue
        for method in ctx.model.index.methods_of(owner.name.value).values():
            if loop.iterable in attributes_kept(ctx.model, method).values() and not (
                graph.callers(method) or graph.uncertain_callers(method)
            ):
                return loop.iterable, f"{method.name.value}()", loop.node
    return None


def _step_handed_its_batches_from_outside(ctx: Context) -> tuple[str, str] | None:
    """The function that runs the backward takes its batches as parameters that no call of the
    file passes (``train_step(self, x_data, y_irradiance, y_efficiency)`` of a trainer whose
    driver iterates the DataLoader and hands each batch in): where the data comes from is
    another file's. The function's name, and its parameters a prepared model is run on, as the
    review line names them."""
    placement = ctx.facts.placement
    for backward in ctx.model.backward_calls:
        function = placement.enclosing_function(backward)
        if function is None or any(
            isinstance(a, (cst.For, cst.While)) for a in ctx.model.ancestors(backward)
        ):
            continue
        parameters = {p.name.value for p in function.params.params} - {"self"}
        fed = [
            argument.value.value
            for call in walk(function.body)
            if isinstance(call, cst.Call) and prepared_model_called(ctx, call)
            for argument in call.args
            if isinstance(argument.value, cst.Name) and argument.value.value in parameters
        ]
        fed = [
            name
            for name in dict.fromkeys(fed)
            if _received_from_outside(ctx, function, name, set())
        ]
        if fed:
            several = len(fed) > 1
            named = f"parameters {', '.join(fed)} are" if several else f"parameter {fed[0]} is"
            return function.name.value, named
    return None


def _received_from_outside(
    ctx: Context, function: cst.FunctionDef, parameter: str, seen: set[int]
) -> tuple[cst.FunctionDef, str] | None:
    """The function of this file whose ``parameter`` no call of the file passes (code outside
    it does), where ``function`` gets it: ``function`` itself, or the function every call of
    ``function`` hands its own parameter on from (``train(self, train_loader, ...)`` calling
    ``self.train_epoch(train_loader)``, a trainer another file drives), with the name of its
    parameter there. None where a call of the file passes something else, or the chain turns
    back on itself."""
    graph, flow, placement = ctx.facts.calls, ctx.facts.flow, ctx.facts.placement
    if id(function) in seen or graph.uncertain_callers(function):
        return None
    if not graph.callers(function):
        return function, parameter
    seen.add(id(function))
    found: tuple[cst.FunctionDef, str] | None = None
    for call, implicit in flow.calls_of(function):
        caller = placement.enclosing_function(call)
        handed = [
            argument.value
            for name, argument in bound_arguments(function, call, implicit)
            if name == parameter
        ]
        if caller is None or len(handed) != 1 or not isinstance(handed[0], cst.Name):
            return None
        if handed[0].value not in {p.name.value for p in caller.params.params}:
            return None
        outer = _received_from_outside(ctx, caller, handed[0].value, seen)
        if outer is None or (found is not None and outer != found):
            return None
        found = outer
    return found


def _handed_what_is_not_followed(
    ctx: Context,
) -> tuple[str, str, cst.For, cst.BaseExpression] | None:
    """The data a training loop reads is a parameter of its function that a call of this file
    hands an element, an attribute or a call's result (ERNet's ``train_model(model, data[0],
    data[1], ...)`` after ``data = get_dataloader(8)``): made where the conversion does not
    look, so whether a DataLoader is behind it is unknown here; the review line must not say
    the batches come from none. The loop's name, the receiving function's, the loop and the
    value handed."""
    placement, flow = ctx.facts.placement, ctx.facts.flow
    for loop in ctx.model.loops:
        if not loop.trains or loop.iterable is None:
            continue
        function = placement.enclosing_function(loop.node)
        if function is None or loop.iterable not in {p.name.value for p in function.params.params}:
            continue
        iterated = getattr(loop.node, "iter", None)
        if isinstance(iterated, cst.Call) and dotted(iterated.func) == "range":
            continue  # ``for step in range(steps)``: a count, not data
        for call, implicit in flow.calls_of(function):
            for parameter, argument in bound_arguments(function, call, implicit):
                value = argument.value
                if parameter == loop.iterable and isinstance(
                    value, (cst.Subscript, cst.Attribute, cst.Call)
                ):
                    return loop.iterable, function.name.value, loop.node, value
    return None


def _batches_from_an_attribute_set_elsewhere(ctx: Context) -> tuple[cst.CSTNode, str] | None:
    """A training loop whose batches are read from ``self.<name>`` (what it iterates, or what
    ``next(...)`` draws from in its body) that no assignment of this file sets: a base class of
    another module made it (an audio GAN's ``self.train_loader_iter = cycle(iter(
    self.train_loader))`` in its ``trainers/base_trainer.py``). Whether a DataLoader is behind
    it is not known here, so the review line must not say the batches come from none. The loops
    are the ``for`` loops that train, the loops and comprehensions that train through a step
    (a comprehension's source is its ``for_in.iter``), and any loop around a backward (a
    ``while`` drawing ``next(self.train_iter)``)."""
    assigned = {
        target.attr.value
        for node in walk(ctx.model.module)
        if isinstance(node, (cst.Assign, cst.AnnAssign, cst.AugAssign))
        for target in rebound_targets(node)
        if isinstance(target, cst.Attribute)
    }
    loops: list[cst.CSTNode] = [loop.node for loop in ctx.model.loops if loop.trains]
    loops += [loop.node for loop, _ in ctx.facts.step_driven_loops]
    loops += [
        loop for call in ctx.model.backward_calls if (loop := _loop_around(ctx, call)) is not None
    ]
    for loop in loops:
        read, body = _source_and_body(loop)
        read += [
            node.args[0].value
            for node in walk(body)
            if isinstance(node, cst.Call) and dotted(node.func) == "next" and node.args
        ]
        for value in read:
            if (
                isinstance(value, cst.Attribute)
                and isinstance(value.value, cst.Name)
                and value.value.value == "self"
                and value.attr.value not in assigned
            ):
                return loop, f"self.{value.attr.value}"
    return None


def _batches_from_a_constructor_parameter(
    ctx: Context,
) -> tuple[cst.CSTNode, str, str, cst.CSTNode] | None:
    """A training loop that iterates ``self.<name>`` (also under ``enumerate``/``tqdm``), which
    the class's ``__init__`` keeps from one of its parameters (``self.dataloader =
    dataloader``): the callers hand it, so whether it is a DataLoader is not known here (a
    DataLoader subclass of another module is not taken for one: realconv37's dcgan trainer),
    and the review line must not say the batches come from none. The loop, the attribute, the
    parameter and the assignment."""
    loops: list[cst.CSTNode] = [loop.node for loop in ctx.model.loops if loop.trains]
    loops += [loop.node for loop, _ in ctx.facts.step_driven_loops]
    loops += [
        loop for call in ctx.model.backward_calls if (loop := _loop_around(ctx, call)) is not None
    ]
    for loop in loops:
        read, _ = _source_and_body(loop)
        owner = ctx.model.index.nearest(loop, cst.ClassDef)
        if owner is None:
            continue
        init = next(
            (
                s
                for s in owner.body.body
                if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"
            ),
            None,
        )
        if init is None:
            continue
        parameters = {p.name.value for p in init.params.params}
        for value in read:
            attributes = {
                dotted(node)
                for node in walk(value)
                if isinstance(node, cst.Attribute)
                and isinstance(node.value, cst.Name)
                and node.value.value == "self"
            }
            for node in walk(init.body):
                if (
                    isinstance(node, cst.Assign)
                    and len(node.targets) == 1
                    and dotted(node.targets[0].target) in attributes
                    and isinstance(node.value, cst.Name)
                    and node.value.value in parameters - {"self"}
                ):
                    attribute = dotted(node.targets[0].target) or ""
                    return loop, attribute, node.value.value, node
    return None


def _source_and_body(loop: cst.CSTNode) -> tuple[list[cst.BaseExpression], cst.CSTNode]:
    """What a loop iterates (none for a ``while``) and the body its steps run."""
    if isinstance(loop, cst.For):
        return [loop.iter], loop.body
    if isinstance(loop, cst.While):
        return [], loop.body
    if isinstance(loop, cst.DictComp):
        return [loop.for_in.iter], loop.value
    if isinstance(loop, (cst.ListComp, cst.SetComp, cst.GeneratorExp)):
        return [loop.for_in.iter], loop.elt
    return [], loop


def _loop_around(ctx: Context, node: cst.CSTNode) -> cst.While | None:
    """The innermost ``while`` loop around ``node`` in its own function (a ``for`` around it is
    one of the model's loops already)."""
    function = ctx.model.index.enclosing_function(node)
    parent = ctx.model.parent(node)
    while parent is not None and parent is not function:
        if isinstance(parent, cst.While):
            return parent
        parent = ctx.model.parent(parent)
    return None


def _no_loader_prepared(ctx: Context) -> bool:
    """The file makes DataLoaders, trains in a loop, and prepares none of them: the loop's data
    came to it some way the analysis did not follow (a dict built in a call's arguments)."""
    made = {b.name for b in ctx.model.of_kind(Kind.DATALOADER)}
    if not made or not any(loop.trains for loop in ctx.model.loops):
        return False
    prepared = set(ctx.plan.prepared) | ctx.prepared_arguments
    # ``train(self, training_data, ...)`` prepares the loader it receives: one of them
    received = ctx.facts.flow.param_names(Kind.DATALOADER) | _received_attributes(ctx)
    return not any(name in made | received or name.split("[", 1)[0] in made for name in prepared)


def _received_attributes(ctx: Context) -> set[str]:
    """``self.data_loader`` kept from a parameter that receives a DataLoader: prepared under
    the attribute's name, it is that received loader."""
    found = set()
    for function, parameters in ctx.facts.flow.params.items():
        kept = attributes_kept(ctx.model, function)
        found |= {kept[n] for n, k in parameters.items() if k is Kind.DATALOADER and n in kept}
    return found


def draws_alike_on_every_rank(ctx: Context, synchronized: frozenset[str] = frozenset()) -> None:
    """A training step that draws random values (a GAN's noise) after the same seed on every
    rank: the data is sharded, the draws are not, so what they feed repeats on every rank (the
    generator trains on one rank's noise batch, 1/N of what the N-rank run claims). Seeding
    each rank apart would change the draws a one-process run makes, so the code stays as it
    is and a review line says what to do. (Without a DataLoader the batches themselves are
    drawn: said by the review line of `run`.) The seeding step calls it again with the
    generators it ``synchronized`` before training in a script with no seed of its own: the
    same holds for them, with no seed call to name."""
    if not ctx.model.of_kind(Kind.DATALOADER):
        return
    training = [loop.node for loop in ctx.model.loops if loop.trains]
    training += [loop.node for loop, _ in ctx.facts.step_driven_loops]
    found = draws_alike_per_step(ctx.model, training, ctx.model.reads_rank, synchronized)
    if found is None:
        return
    draws, seed = found
    if (seed is None) != bool(synchronized):
        return  # the data notes' call reviews a seed of the script's own, the seeding step's not
    if seed is not None:
        cause = (
            f"after the same seed on every rank ({ctx.code(seed)}, line {ctx.line(seed)}): "
            "every rank draws the same values, so"
        )
        effect = (
            " (a GAN's generator trains on 1/N of the noise the N-rank run claims); to draw "
            "apart, seed each rank apart once the values every rank must share are drawn:"
        )
    else:
        cause = (
            "after the random state this conversion makes alike on every rank before training "
            "(so that the data every rank draws is the same): every rank then draws the same "
            "values here, so"
        )
        effect = "; to draw apart, seed each rank apart once the shared values are drawn:"
    for draw in draws:
        ctx.plan.review(
            ctx.line(draw),
            f"{ctx.code(draw)} is drawn each training step {cause} what they feed (a "
            "generator's noise, a random mask) repeats on each rank instead of adding to the "
            f"batch{effect} set_seed(seed, device_specific=True) before the training loop (on "
            "one process its draws then differ from the original's)",
        )


def _loader_dicts_made_before_the_prepare(ctx: Context) -> None:
    """``loaders = {"train": tl, "val": vl}`` made before the prepare call, read as
    ``loaders[split]`` (`flow.keyed_loaders`): it keeps ``tl`` and ``vl`` as they were made,
    so the loops that read it get the unprepared loaders (every rank reads all of each, its
    batches where the loader makes them) while the names are prepared. Said once per dict,
    with what to do: the review lines of the loops say what follows from it."""
    prepared = set(ctx.plan.prepared)
    said: set[int] = set()
    for loop in ctx.model.loops:
        stale: dict[int, tuple[cst.CSTNode, list[str]]] = {}
        for name, made in ctx.facts.flow.keyed_loaders(loop):
            if name in prepared and not ctx.after_prepare(made, name):
                stale.setdefault(id(made), (made, []))[1].append(name)
        for key, (made, held) in stale.items():
            if key in said:
                continue
            said.add(key)
            ctx.plan.review(
                ctx.line(made),
                f"this dict is made before the prepare call and keeps {', '.join(held)} as "
                f"they were made, not prepared: the loop at line {ctx.line(loop.node)} reads "
                "them whole on every rank (on a GPU their batches stay on the host); make the "
                "dict after the prepare call",
            )


def _reads_undecided_phases(ctx: Context, loop: Loop) -> bool:
    """``loop`` reads a dict of loaders of which none is prepared because which phases it
    trains on cannot be told (`PhaseLoaders.decided`): its batches do come from DataLoaders."""
    return any(not p.decided and p.loop is loop for p in ctx.facts.phase_loaders.values())


def _trained_unprepared(ctx: Context, loop: Loop) -> list[str]:
    """The unprepared loaders ``loop`` trains on; one also evaluated through it with training
    off (a shared loop, a phase) is left out: its own review line says why."""
    return [
        n
        for n in ctx.unprepared_loaders(loop)
        if n not in ctx.facts.shared_loop_evaluations and n not in ctx.facts.phase_loaders
    ]


def _step_name(ctx: Context, step: cst.FunctionDef) -> str:
    """``StepTrainer.__call__()`` for a method, ``train_step()`` for a function."""
    owner = ctx.model.call_graph.owner(step)
    prefix = f"{owner.name.value}." if owner is not None else ""
    return f"{prefix}{step.name.value}()"


def _passes_counted(ctx: Context) -> None:
    """``epoch += 1`` where a prepared loader's iterator runs out (`pass_counters`): the count
    of this rank's passes, N times the original one for the same steps. Said, not changed: it
    is the number of passes the ranks made over the set together."""
    prepared = set(ctx.plan.prepared) | ctx.prepared_arguments
    for counted in pass_counters(ctx.facts):
        outer = ctx.facts.flow.outer_name(counted.loader, counted.bump)
        if counted.loader not in prepared and outer not in prepared:
            continue
        ctx.plan.review(
            ctx.line(counted.bump),
            f"{counted.counter} counts the times {counted.loader} runs out, and prepared, each "
            f"rank's {counted.loader} holds 1/N of the set: in as many steps it runs out N "
            f"times as often, so {counted.counter} counts about N times as many passes as on "
            "one process (each "
            "step reads N batches, one per rank: the run reads N times the data, and each "
            f"count is a pass over the whole set by the ranks together); to train on as many "
            f"passes as on one process, divide the step count by "
            f"{ctx.a_at(counted.bump, 'num_processes')}",
        )
