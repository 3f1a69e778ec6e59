"""3. One ``prepare`` call for every model, optimizer, DataLoader and LR scheduler of the scope
that owns training, after the last of them is created, unpacked back into the same names."""

from __future__ import annotations

import builtins

import libcst as cst

from accelify.analysis.dataflow import (
    assigns,
    bound_by,
    fresh,
    is_binding,
    is_name_read,
    names_in_scope,
    variables_in,
)
from accelify.analysis.device_moves import strip_moves
from accelify.analysis.evaluation import Evaluation
from accelify.analysis.flow import entry_name, record_fields
from accelify.analysis.inline_evaluations import (
    computes_without_grad,
    drawn_evaluations,
    runs_a_model_copy,
)
from accelify.analysis.loader_readers import loops_reading
from accelify.analysis.loops import loop_source
from accelify.analysis.model_setup import last_building_statement
from accelify.analysis.objects import (
    attributes_kept,
    bound_arguments,
    callee,
    handed_loader_tuple,
    is_dict_of_loader_dicts,
    is_loader_dict,
    is_loader_tuple,
    loader_property,
    received_name,
    returned_local,
    tuple_handed_to,
)
from accelify.analysis.optimizer_models import entry_owners, parameter_owners, used_entry_aliases
from accelify.analysis.scheduler_preparation import PROCESS_COUNT, per_fixed_iteration_steps
from accelify.analysis.script_model import Binding, Kind, Loop, Scope, ScriptModel, owning_model
from accelify.analysis.sharded_loaders import sharding_sampler
from accelify.analysis.shared_loops import PhaseLoaders, SharedLoopEvaluation
from accelify.analysis.step_loaders import over_step_data
from accelify.analysis.syntax import (
    assigned_targets,
    dotted,
    has_parameter,
    if_chain,
    is_generator_function,
    is_main_guard,
    strip_self_methods,
    target_names,
    walk,
)
from accelify.analysis.wrapped_loaders import handed_wrapped, wraps
from accelify.analysis.writing_helpers import BINDS, MUTATORS
from accelify.convert.steps import handed_accelerator, shard_lengths
from accelify.convert.steps.context import Context, star_imported_from_the_project
from accelify.convert.steps.evaluation import loader_names
from accelify.convert.steps.saving import (
    can_open_on_main_only,
    file_write_blocks,
    result_read_after,
)
from accelify.edits.kinds import InsertBefore
from accelify.edits.plan import statement


def run(ctx: Context, scope: Scope) -> None:
    kinds = (Kind.MODEL, Kind.OPTIMIZER, Kind.DATALOADER, Kind.SCHEDULER)
    placement = ctx.facts.placement
    chosen: dict[str, Kind] = {}
    created: dict[str, int] = {}
    conditional: list[Binding] = []
    dict_parameters: set[str | None] = set()  # ``self.loaders = loaders``: each value prepared
    for binding in ctx.model.of_kind(*kinds):
        if binding.scope is not scope or binding.name in chosen:
            continue
        top = placement.top_statement(binding.statement, scope)
        if top is None:
            continue
        if _conditional(ctx, binding):
            if binding.name not in {b.name for b in conditional}:
                conditional.append(binding)
            continue
        if is_dict_of_loader_dicts(ctx.model, binding):
            ctx.plan.review(
                binding.line,
                f"{binding.name} is a dict of dicts of DataLoaders: prepare hands dicts back "
                "untouched, so its loaders are left unprepared and every rank reads all of them "
                "(correct, not data-parallel); prepare each loader where it is made",
            )
            if binding.received and isinstance(scope, cst.FunctionDef):
                dict_parameters.add(received_name(scope, binding.value))
            continue
        if is_loader_dict(ctx.model, binding):
            if not _dict_evaluated_unsure(ctx, binding):
                _prepare_each_value(ctx, binding)
            if binding.received and isinstance(scope, cst.FunctionDef):
                dict_parameters.add(received_name(scope, binding.value))
            continue
        if is_loader_tuple(ctx.model, binding):
            # one prepare call shards all its loaders: an evaluation of any of them that no
            # gather fits keeps the whole tuple as it is (its review line says why)
            # the same loaders under a trainer's names, once the tuple is handed to it
            held = [b.name for b in tuple_handed_to(ctx.model, binding)]
            probe = dict.fromkeys([binding.name, *held], Kind.DATALOADER)
            _keep_evaluated_loaders_whole(ctx, probe, {}, scope)
            if len(probe) == 1 + len(set(held)) and not _dict_evaluated_unsure(ctx, binding):
                _prepare_each_element(ctx, binding)
            continue
        chosen[binding.name] = binding.kind
        created[binding.name] = placement.index(top, scope)
    for binding in _made_by_earlier_setup_methods(ctx, scope):
        if binding.name not in chosen:
            chosen[binding.name] = binding.kind
            ctx.plan.change(
                binding.line,
                f"{binding.name} is made by a method the constructor calls before "
                f"{scope.name.value}(): prepared there with the rest",  # type: ignore[union-attr]
            )
    conditional = _drop_untrained_conditional(ctx, scope, chosen, conditional)
    _prepare_conditional(ctx, conditional)
    for entry in ctx.facts.self_training:
        for instance in entry.instances:  # it trains itself: see `self_training`
            chosen.pop(instance.name, None)
            created.pop(instance.name, None)
            ctx.frozen.add(instance.name)
    _add_models_set_by_other_methods(ctx, scope, chosen)
    aliases = _attribute_aliases(ctx, scope, chosen)
    _prepare_attributes_for_their_locals(ctx, scope, chosen, created, aliases)
    if isinstance(scope, cst.FunctionDef) and created:
        # A model handed in as a parameter and trained here (``def main(model):``); a
        # constructor that keeps it (``self.model = model``) prepares the attribute instead:
        # preparing both would wrap one module twice.
        trained_here = _trained_here(ctx, scope)
        for name, kind in ctx.facts.flow.params.get(scope, {}).items():
            if kind is not Kind.MODEL or name in aliases:
                continue
            if name in trained_here:
                chosen.setdefault(name, kind)
            elif trained_here:
                # A teacher handed in beside the student this scope's optimizer trains: not
                # prepared here, so its device moves stay.
                ctx.frozen.add(name)
        received = [n for n in _received_loaders(ctx, scope, aliases) if n not in dict_parameters]
        kept = attributes_kept(ctx.model, scope)
        chosen.update(dict.fromkeys((kept.get(n, n) for n in received), Kind.DATALOADER))
        for name in (kept[n] for n in received if n in kept):
            # prepared after the line that binds the attribute, wherever that stands
            created[name] = _attribute_index(ctx, scope, name)
    wrapped = {**_wrapped_loaders(ctx, scope, chosen), **_handed_wrapped(ctx, scope, chosen)}
    for name, wrap in wrapped.items():
        chosen.pop(name)
        created.pop(name, None)
        ctx.plan.review(
            ctx.line(wrap),
            f"{_wrapped_name(wrap, name)} is wrapped in {dotted(wrap.value.func)} (a class of "  # type: ignore[attr-defined]
            "this file) before it could be prepared: prepare would hand the wrapper back "
            "untouched, so it is left unprepared and every rank reads all of it (correct, not "
            "data-parallel); prepare the DataLoader before wrapping it (and gather its "
            "evaluation's results)",
        )
    for name, sampler in _sharded_by_own_samplers(ctx, scope, chosen).items():
        chosen.pop(name)
        created.pop(name, None)
        ctx.self_sharded.add(name)
        ctx.plan.change(
            _binding_line(ctx, name, scope),
            f"{name} is sharded by its own sampler ({sampler.name.value}, a class of this file "
            "handed the rank): left out of prepare, which would shard it again (each rank "
            "reading 1/N of its part); its batches stay where the script puts them",
        )
    for name, loop in _stepped_over_whole_loaders(ctx, chosen, set(wrapped)).items():
        chosen.pop(name)
        created.pop(name, None)
        ctx.plan.change(
            ctx.line(loop),
            f"{name} is stepped in a loop over {loop_source(loop.iter)}, which is left unprepared "
            "and read whole by every rank: left unprepared, so it steps once per optimizer step "
            "as on one process (prepared, it would step once per rank at each call and end its "
            "schedule N times too soon)",
        )
    _leave_out_schedulers_left_whole(ctx, scope, chosen, created)
    untrained = _untrained_models(ctx, scope, chosen, aliases)
    parts = _parts_of_other_models(ctx, scope, chosen, untrained)
    for name in untrained:
        chosen.pop(name)
        created.pop(name, None)
        ctx.frozen.add(name)
        if name in parts:
            ctx.plan.change(
                _binding_line(ctx, name, scope),
                f"{name} is part of {parts[name]} (handed to its constructor): prepared "
                f"inside {parts[name]}, not on its own",
            )
            continue
        _note_untrained(ctx, name, scope)
    body = placement.body_of(scope)
    last_statement = body[max(created.values())] if created else None
    _keep_evaluated_loaders_whole(ctx, chosen, created, scope)
    for name in sorted(ctx.facts.flow.unstepped_schedulers(set(chosen))):
        chosen.pop(name)
        created.pop(name, None)
        ctx.plan.review(
            _binding_line(ctx, name, scope),
            f"{name} is left unprepared: its step() is not called through a name the "
            "conversion follows, so whether it steps per batch or per epoch is unknown (a "
            "prepared scheduler steps once per rank at each call: ReduceLROnPlateau's patience "
            "would run N times faster); prepare it if it steps with the optimizer",
        )
    for name, loop in _stepped_per_fixed_iteration(ctx, chosen).items():
        chosen.pop(name)
        ctx.plan.change(
            ctx.line(loop),
            f"{name} is stepped in a loop of a fixed count that every rank runs whole: left "
            "unprepared, so it steps once per optimizer step as on one process (prepared, it "
            "would step once per rank at each call and end its schedule N times too soon)",
        )
    for name, steps in sorted(ctx.facts.flow.mixed_pace_schedulers(set(chosen)).items()):
        chosen.pop(name)
        created.pop(name, None)
        # stepped num_processes times per batch, or reviewed, once the plan is complete
        ctx.mixed_pace[name] = (_binding_line(ctx, name, scope), steps)
    per_epoch = ctx.facts.flow.per_epoch_schedulers(set(chosen))
    per_step = {n for n, kind in chosen.items() if kind is Kind.SCHEDULER} - per_epoch
    if per_epoch and not per_step:
        ctx.constructor["step_scheduler_with_optimizer"] = "False"
    elif per_epoch:
        for name in per_epoch:
            chosen.pop(name)
            ctx.plan.review(
                ctx.line(last_statement),
                f"{name} is stepped once per epoch and another scheduler once per step: "
                f"{name} is left unprepared so its schedule keeps its pace",
            )
    _leave_sets_with_container_models(ctx, scope, chosen, created)
    if _nothing_trained(ctx, chosen):
        for name in [n for n, kind in chosen.items() if kind is Kind.DATALOADER]:
            chosen.pop(name)
            created.pop(name, None)
            ctx.plan.review(
                _binding_line(ctx, name, scope),
                f"{name} is left unprepared: no model or optimizer the conversion recognises "
                "is prepared, so sharding the data would train each rank's copy on its own "
                "shard, never synchronised; every rank trains on all of it (correct, not "
                "data-parallel); prepare the model and its optimizer with it",
            )
        last_statement = body[max(created.values())] if created else None
    if ctx.acc == "self.accelerator":
        if _trains_nothing_prepared(ctx, chosen):
            _review_received_loaders(ctx, scope)
        else:
            _prepare_received_loaders(ctx, scope, set(chosen))
            shard_lengths.size_received(
                ctx, {name for name, kind in chosen.items() if kind is Kind.SCHEDULER}
            )
    if not chosen or last_statement is None:
        return
    kept = _left_out_schedulers_reading_loaders(ctx, scope, chosen)
    groups = [
        (anchor, sorted(names, key=lambda n: list(Kind).index(chosen[n])))
        for anchor, names in _groups(ctx, scope, chosen, created, kept)
    ]
    _size_schedulers_in_all_ranks_steps(ctx, scope, chosen, groups)
    _review_schedulers_reading_prepared(ctx, scope, groups, kept)
    for anchor, names in groups:
        _insert_prepare(ctx, anchor, names)
        ctx.prepared_after.update(dict.fromkeys(names, anchor))
        for name in names:
            ctx.prepared_anchors.setdefault(name, []).append(anchor)
    _prepare_recreated_optimizers(ctx, scope)
    ctx.plan.prepared = [*(n for _, names in groups for n in names), *ctx.plan.prepared]
    _prepare_tuples_handed_on(ctx, scope)
    ctx.prepare_anchor = groups[0][0]
    if ctx.acc == "self.accelerator":
        _prepare_step_driven_loaders(ctx)
        _prepare_loaders_of_loops_training_an_instance(ctx)
        _prepare_property_loaders(ctx)
    trained = [names for _, names in groups if {chosen[n] for n in names} & _TRAINED_KINDS]
    if len(trained) > 1:
        ctx.plan.review(
            ctx.line(groups[0][0]),
            "models trained one after the other are prepared in separate calls, each before "
            "its first use: with --backend fsdp or deepspeed, models and optimizers must be "
            "prepared in one call",
        )


def _keep_evaluated_loaders_whole(
    ctx: Context, chosen: dict[str, Kind], created: dict[str, int], scope: Scope | None = None
) -> None:
    """Takes out of ``chosen`` the loaders read only by evaluations no gather can be written in
    (in a comprehension, in a loop that also trains, out of the accelerator's reach, left as
    they are, in another module, inside a file written on the main process), each with its
    line: every rank evaluates all of it. A scope's objects and those a block makes together
    (one fold of a k-fold loop) pass the same test."""
    loaders = {n for n, kind in chosen.items() if kind is Kind.DATALOADER}
    _leave_whole_for_their_own_loops(ctx, chosen, created, scope)
    _leave_whole_beside_those_left(ctx, chosen, created, loaders - set(chosen))


def _leave_whole_for_their_own_loops(
    ctx: Context, chosen: dict[str, Kind], created: dict[str, int], scope: Scope | None
) -> None:
    """Each reason a loader's own evaluation loop gives to leave it unprepared, with its line."""
    inline = _comprehension_evaluations(ctx)
    for name in [n for n, kind in chosen.items() if kind is Kind.DATALOADER and n in inline]:
        chosen.pop(name)
        created.pop(name, None)
        direct = any(
            isinstance(n, cst.Call) and ctx.facts.flow.is_forward(n) for n in walk(inline[name])
        )
        where = "the forward inside it" if direct else "a function it calls runs the model"
        calls = [n for n in walk(inline[name]) if isinstance(n, cst.Call)]
        if any(runs_a_model_copy(ctx.facts, n) for n in calls):
            where = "a copy of the model runs inside it"
        elif not any(_runs_the_model(ctx, n) for n in calls):
            where = "gradients off, its batches run through a model the conversion does not know"
        spelled = "map()" if isinstance(inline[name], cst.Call) else "a comprehension"
        if isinstance(inline[name], (cst.For, cst.While)):
            spelled = "a loop that draws its batches with next()"
            ctx.left_whole.add(id(inline[name]))
        fits = (
            "the conversion gathers only in a for loop over the loader"
            if isinstance(inline[name], (cst.For, cst.While))
            else "no gather fits inside it"
        )
        ctx.plan.review(
            ctx.line(inline[name]),
            f"{name} is evaluated in {spelled} ({where}): its totals "
            f"would cover one rank's shard, and {fits}; left unprepared, so "
            "every rank evaluates all of it (correct, not sharded); write it as a for loop to "
            "shard it and gather the predictions",
        )
    shared = ctx.facts.shared_loop_evaluations
    whole = [n for n, kind in chosen.items() if kind is Kind.DATALOADER and n in shared]
    kept = {id(shared[n]) for n in whole}  # one loader's names share its entry
    for loop in {id(shared[n].loop.node) for n in whole}:
        if all(id(s) in kept for s in shared.values() if id(s.loop.node) == loop):
            ctx.left_whole.add(loop)
    for name in whole:
        chosen.pop(name)
        created.pop(name, None)
        _review_shared_evaluation(ctx, name, shared[name])
    for name, loop in _evaluated_out_of_reach(ctx, chosen).items():
        _leave_whole(ctx, chosen, created, name, loop)
        static = ctx.in_static(loop)
        where = (
            f"in a static or class method, with no instance to reach {ctx.acc} through"
            if static
            else f"outside the class that holds {ctx.acc}"
        )
        fix = "make it a method of the instance" if static else "hand the accelerator to this class"
        ctx.plan.review(
            ctx.line(loop),
            f"{name} is evaluated here, {where}: no gather can be written in this loop, so "
            f"{name} is left unprepared and every rank evaluates all of it (correct, not "
            f"sharded); {fix} to shard it and gather there",
        )
    for name, evaluation in _evaluated_unsure(ctx, chosen).items():
        _leave_whole(ctx, chosen, created, name, evaluation.loop.node)
        advice = _sharding_advice(ctx, evaluation)
        shown, it = _left_whole_words(ctx, evaluation, [name])
        ctx.plan.review(
            ctx.line(evaluation.line_node),
            f"evaluation left as is: {evaluation.unsure}; {shown} (correct, not sharded); to "
            f"shard {it}, {advice}",
        )
    beside = _evaluated_beside_a_whole_loader(ctx, scope, chosen) if scope is not None else {}
    for name, (loop, whole) in beside.items():
        _leave_whole(ctx, chosen, created, name, loop.node)
        ctx.plan.review(
            ctx.line(whole),
            f"{name} is evaluated by the loop at line {ctx.line(loop.node)}, which this call "
            "also runs on a loader no prepare takes (every rank reads all of it, so no gather "
            f"fits that loop): {name} is left unprepared too, and every rank evaluates all of "
            "it (correct, not sharded); prepare the loader this call hands over, and gather "
            "in that loop, to shard both",
        )
    for name, (loop, inline) in _evaluated_beside_an_inline_loader(ctx, chosen).items():
        _leave_whole(ctx, chosen, created, name, loop.node)
        ctx.plan.review(
            ctx.line(inline),
            f"{name} is evaluated by the loop at line {ctx.line(loop.node)}, which this call "
            "also runs on a loader made in its arguments, which no prepare takes (every rank "
            f"reads all of it, so no gather fits that loop): {name} is left unprepared too, "
            "and every rank evaluates all of it (correct, not sharded); bind that loader to a "
            "name before the call so that it is prepared, and gather in that loop, to shard both",
        )
    for name, store in _stored_into_a_dict_entry(ctx, chosen).items():
        _leave_whole(ctx, chosen, created, name, store)
        ctx.plan.review(
            ctx.line(store),
            f"{name} is stored into an entry of a dict here, which the conversion does not "
            "follow to the loop that reads it: no gather could be written there, so "
            f"{name} is left unprepared and every rank evaluates all of it (correct, not "
            "sharded); put it in the dict where the dict is made (or hand it to the function "
            "itself) to shard it and gather its evaluation",
        )
    for name, call in _evaluated_in_another_module(ctx, chosen).items():
        chosen.pop(name)
        created.pop(name, None)
        function = ctx.code(call.func)
        what = (
            "a function of another module that runs no backward (an evaluation)"
            if function in ctx.imported_evaluators
            else "a function of another module the conversion cannot see, handed no optimizer "
            "(an evaluation)"
        )
        ctx.plan.review(
            ctx.line(call),
            f"{name} is read only by {function}(), {what}: prepared, it would "
            f"evaluate one rank's shard and return that shard's numbers; {name} is left "
            "unprepared, so every rank evaluates all of it (correct, not sharded); to shard it, "
            f"prepare it and gather the predictions and labels inside {function}() with "
            f"{ctx.a('gather_for_metrics')}",
        )
    for name, (site, how) in _handed_where_not_followed(ctx, chosen).items():
        chosen.pop(name)
        created.pop(name, None)
        ctx.plan.review(
            ctx.line(site),
            f"{name} is handed on through {how}, which the conversion does not follow to the "
            f"loop that reads it: no gather could be written there, so {name} is left "
            "unprepared and every rank evaluates all of it (correct, not sharded); call the "
            "function directly with the loader to shard it and gather its evaluation",
        )
        _leave_loops_handed_whole(ctx, chosen, created, site, name)
    for name, loop in _read_where_written(ctx, chosen).items():
        _leave_whole(ctx, chosen, created, name, loop.node)
        ctx.kept_for_writes[name] = loop.node
        ctx.plan.change(
            ctx.line(loop.node),
            f"{name} is read here, where a file is written on the main process: left "
            "unprepared, so that process writes every sample's result",
        )


def _review_shared_evaluation(ctx: Context, name: str, through: SharedLoopEvaluation) -> None:
    ctx.plan.review(
        ctx.line(through.call),
        f"{name} is evaluated by {through.function.name.value}(), whose loop also trains "
        f"(line {ctx.line(through.loop.node)}): no gather fits a loop that runs in both "
        f"modes, so {name} is left unprepared and every rank evaluates all of it (correct, "
        "not sharded); give evaluation a loop of its own to shard it and gather there",
    )


def _leave_whole_beside_those_left(
    ctx: Context, chosen: dict[str, Kind], created: dict[str, int], whole: set[str]
) -> None:
    """A loop that evaluates a loader left whole gathers nothing (the whole set would be
    counted once per rank), so another loader it also evaluates (``evaluate(self.val_loader)``
    beside ``evaluate(self.test_loader)`` of a test set whose predictions are listed) would,
    prepared, have its metrics computed on one rank's shard and divided by that shard's count:
    silently 1/N of the set. It is left whole too, and so on, each at its loop with a review
    line. A loader some training loop reads keeps its prepare: its shard is what the rank
    trains on."""
    trained = _trained_loaders(ctx)
    pending = set(whole)
    while pending:
        beside: dict[str, tuple[Loop, str]] = {}
        for evaluation in ctx.facts.evaluations:
            origins = _loader_origins(ctx, evaluation.loop)
            left = sorted(origins & whole)
            if not left or evaluation.already_gathered:
                continue
            for name in sorted(origins - trained - whole):
                if chosen.get(name) is Kind.DATALOADER:
                    beside.setdefault(name, (evaluation.loop, left[0]))
        for name, (loop, other) in beside.items():
            _leave_whole(ctx, chosen, created, name, loop.node)
            ctx.plan.review(
                ctx.line(loop.node),
                f"{name} is evaluated by this loop, which also evaluates {other}, left "
                "unprepared (every rank reads all of it, so no gather fits this loop): "
                f"{name} is left unprepared too, and every rank evaluates all of it (correct, "
                f"not sharded); to shard both, shard {other} too (its own line says what "
                "keeps it whole), then gather predictions and labels together in this loop "
                f"with {ctx.a('gather_for_metrics')}",
            )
        pending = set(beside)
        whole |= pending


_TRAINED_KINDS = {Kind.MODEL, Kind.OPTIMIZER}


def prepare_loaders_made_where_trained(ctx: Context, scope: Scope) -> None:
    """``train_loader = DataLoader(train_dataset, ...)`` inside the method or helper that then
    trains on it (a BYOL trainer's ``train(self, train_dataset)``), away from the scope that
    prepares the model: prepared right where it is made, or every rank would train on all of
    it. Only a loader made once per call of a function called once (not per step of a loop),
    bound once in that function, and read only by training loops: those of the function when
    its name is bound nowhere else in the file, else only the helpers the function hands it
    to (a namesake elsewhere, the factory that made it, is not followed)."""
    placement, flow = ctx.facts.placement, ctx.facts.flow
    for binding in ctx.model.of_kind(Kind.DATALOADER):
        function = binding.scope
        name = binding.name
        if not isinstance(function, cst.FunctionDef) or function is scope:
            continue
        if binding.received or _conditional(ctx, binding) or is_loader_dict(ctx.model, binding):
            continue
        if placement.top_statement(binding.statement, function) is None:
            continue
        bound_here = [b for b in ctx.model.bindings if b.name == name and b.scope is function]
        unique = sum(1 for b in ctx.model.bindings if b.name == name) == 1
        if len(bound_here) != 1:
            continue
        if name in ctx.plan.prepared or name in ctx.model.prepared_names:
            continue
        returned = returned_local(ctx.model, name, binding.statement)
        if returned is not None and returned[0] in ctx.plan.prepared:
            continue  # ``model, opt, train_dl = setup(cfg)`` where setup() prepares them
        if unique:
            readers = [loop for loop in ctx.model.loops if loop.iterable == name]
            if not all(placement.inside(loop.node, function) for loop in readers):
                continue
        else:  # also bound elsewhere (the factory that made it): only what this one reaches
            readers = []
        if not readers:
            # handed to the helpers that train on it: ``train(net, trainloader, ...)``
            readers = loops_reading(ctx.model, placement, ctx.model.call_graph, name, function)
        if not readers or not all(
            loop.trains and _steps_what_is_prepared(ctx, loop, function) for loop in readers
        ):
            continue
        if any(over_step_data(ctx.facts, loop) for loop in readers):
            continue
        calls = [call for call, _ in flow.calls_of(function)]
        if len(calls) != 1 or _called_in_a_loop(ctx, calls[0]):
            continue
        if not ctx.plan.reaches(binding.statement):
            continue
        ctx.plan.insert_after(binding.statement, statement(f"{name} = {ctx.a('prepare')}({name})"))
        ctx.need(binding.statement)
        ctx.plan.prepared.append(name)
        # where: a local of the same name in another function (``loader`` of ``evaluate()``
        # beside the ``loader`` of ``train()``) is another object, not prepared
        ctx.prepared_after[name] = binding.statement
        ctx.prepared_anchors.setdefault(name, []).append(binding.statement)
        helpers = sorted(
            {
                f"{found.name.value}()"
                for loop in readers
                if (found := placement.enclosing_function(loop.node)) is not function
                and found is not None
            }
        )
        ctx.plan.change(
            binding.line,
            f"{name} is handed to {', '.join(helpers)}, which trains on it: prepared where it "
            "is made"
            if helpers
            else f"{name} is made where it is trained on: prepared there",
        )


def _steps_what_is_prepared(ctx: Context, loop: Loop, function: cst.FunctionDef) -> bool:
    """A loop of ``function`` itself; or a helper's that prepares nothing of its own and steps
    an optimizer it is handed, which every call of it passes a name the conversion prepares
    (``train(net, trainloader, criterion, optimizer)`` after ``setup_network()`` prepared
    ``optimizer``). A helper that makes its own optimizer (``finetune(model, loader)``) trains
    what it is handed unwrapped: its data sharded, each rank's copy would never be synchronised;
    one that prepares its parameters itself would wrap the loader twice. A method of the
    class of ``function`` that steps an optimizer attribute of the instance the conversion
    prepares trains what is prepared too."""
    placement = ctx.facts.placement
    helper = placement.enclosing_function(loop.node)
    if helper is function:
        return True
    if helper is None or any(
        placement.inside(anchor, helper)
        for anchors in ctx.prepared_anchors.values()
        for anchor in anchors
    ):
        return False
    stepped = {
        dotted(node.args[0].value if node.args else node.func.value)
        for node in walk(loop.node.body)
        if isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "step"
        and len(node.args) <= 1
    }
    owner = placement.class_of(helper)
    # a method of the same class stepping the instance's prepared optimizer
    # (``self._train(train_loader)`` of ``run()`` steps ``self.optimizer``, which
    # ``__init__`` prepared): the loader it is handed trains what is prepared
    if (
        owner is not None
        and owner is placement.class_of(function)
        and any(name in ctx.plan.prepared for name in stepped if name and name.startswith("self."))
    ):
        return True
    parameters = {p.name.value for p in helper.params.params}
    return any(_handed_prepared(ctx, helper, parameter) for parameter in stepped & parameters)


def _handed_prepared(
    ctx: Context, function: cst.FunctionDef, parameter: str, depth: int = 0
) -> bool:
    """Every call of ``function`` hands ``parameter`` an object the conversion prepares, each
    resolved in its caller's scope: a name prepared there (not a namesake another function
    prepares: ``pretrain_probe()``'s own ``optimizer`` beside ``main()``'s), or a parameter of
    the caller that its own callers hand a prepared object (``depth`` bounds the climb)."""
    placement = ctx.facts.placement
    passed = [
        (dotted(argument.value), call)
        for call, implicit in ctx.model.call_graph.calls_of(function)
        for bound, argument in bound_arguments(function, call, implicit)
        if bound == parameter
    ]
    if not passed:
        return False
    for name, call in passed:
        if name is None:
            return False
        if name in ctx.plan.prepared and not ctx.prepared_anchors.get(name):
            continue  # prepared where it is made (`prepare_loaders_made_where_trained`)
        if name in ctx.plan.prepared and _prepared_in_scope(ctx, name, call, 0):
            continue
        caller = placement.enclosing_function(call)
        if not (
            depth < 3
            and caller is not None
            and name in {p.name.value for p in caller.params.params}
            and _handed_prepared(ctx, caller, name, depth + 1)
        ):
            return False
    return True


def _prepared_in_scope(ctx: Context, name: str, at: cst.CSTNode, depth: int) -> bool:
    """``name`` at ``at`` is an object a ``prepare`` call rebinds: prepared in ``at``'s scope
    (``self.x``: in its class), or handed back by a factory that prepared its own local
    (``net, optimizer = setup_network(lr)``)."""
    placement = ctx.facts.placement
    anchors = ctx.prepared_anchors.get(name, [])
    if name.startswith("self."):
        owner = placement.class_of(at)
        return owner is not None and any(placement.class_of(a) is owner for a in anchors)
    if any(ctx.model.scope_of(a) is ctx.model.scope_of(at) for a in anchors):
        return True
    returned = returned_local(ctx.model, name, at) if depth < 3 else None
    return returned is not None and _prepared_in_scope(ctx, *returned, depth + 1)


def _called_in_a_loop(ctx: Context, call: cst.Call) -> bool:
    function = ctx.facts.placement.enclosing_function(call)
    for ancestor in ctx.model.ancestors(call):
        if ancestor is function:
            return False
        if isinstance(ancestor, (cst.For, cst.While, cst.Lambda)):
            return True
    return False


def _made_by_earlier_setup_methods(ctx: Context, scope: Scope) -> list[Binding]:
    """A trainer that assembles itself in steps (``self.__prepare_data(cfg)`` then
    ``self.__prepare_model(cfg)`` in ``__init__``): the attributes the earlier steps make
    (``self.train_dataloader``) exist when ``scope``, a later step, prepares what it makes, so
    they are prepared with it, or every rank would train on all the data. Only methods the
    constructor calls once, as statements of its own before it calls ``scope``, and nothing
    else calls; what they make under a condition is left to its own review."""
    placement = ctx.facts.placement
    owner = placement.class_of(scope)
    if owner is None or not isinstance(scope, cst.FunctionDef):
        return []
    methods = [m for m in placement.body_of(owner) if isinstance(m, cst.FunctionDef)]
    init = next((m for m in methods if m.name.value == "__init__"), None)
    if init is None or init is scope:
        return []
    steps = _setup_calls(ctx, init)
    position = steps.get(scope.name.value)
    if position is None:
        return []
    kinds = (Kind.MODEL, Kind.OPTIMIZER, Kind.DATALOADER, Kind.SCHEDULER)
    found = []
    for method in methods:
        if steps.get(method.name.value, position) >= position:
            continue
        for binding in ctx.model.of_kind(*kinds):
            if (
                binding.scope is method
                and binding.name.startswith("self.")
                and not binding.received
                and not _conditional(ctx, binding)
                and not is_loader_dict(ctx.model, binding)
            ):
                found.append(binding)
    return found


def _setup_calls(ctx: Context, init: cst.FunctionDef) -> dict[str, int]:
    """The methods ``init`` calls as statements of its own (``self._build()``), by name, with
    the index of the statement; a method also called anywhere else is not one of them."""
    placement = ctx.facts.placement
    found: dict[str, int] = {}
    for index, line in enumerate(placement.body_of(init)):
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            continue
        expression = line.body[0]
        if not isinstance(expression, cst.Expr) or not isinstance(expression.value, cst.Call):
            continue
        name = dotted(expression.value.func)
        if name is not None and name.startswith("self.") and name.count(".") == 1:
            found.setdefault(name[len("self.") :], index)
    methods = [
        m
        for m in placement.body_of(placement.class_of(init))  # type: ignore[arg-type]
        if isinstance(m, cst.FunctionDef)
    ]
    called_once = {m.name.value for m in methods if len(ctx.facts.flow.calls_of(m)) == 1}
    return {name: index for name, index in found.items() if name in called_once}


def _wrapped_loaders(ctx: Context, scope: Scope, chosen: dict[str, Kind]) -> dict[str, cst.Assign]:
    """Loaders of ``chosen`` rebound in ``scope`` to an instance of a class of this file that
    is not a module and receives the loader (the nn tutorial's ``train_dl =
    WrappedDataLoader(train_dl, preprocess)``), with that assignment: ``prepare`` shards
    DataLoaders only and hands any other object back as it is."""
    found: dict[str, cst.Assign] = {}
    for assign in ctx.model.assignments:
        value = assign.value
        if ctx.model.scope_of(assign) is not scope or len(assigned_targets(assign)) != 1:
            continue
        name = dotted(assigned_targets(assign)[0])
        if chosen.get(name or "") is not Kind.DATALOADER or not isinstance(value, cst.Call):
            continue
        if wraps(ctx.model, assign, name):  # type: ignore[arg-type]
            found.setdefault(name, assign)  # type: ignore[index]
    return found


def _wrapped_name(wrap: cst.Assign, name: str) -> str:
    """``train_dl`` for a loader wrapped where it is made; ``train_dl (handed in as
    train_loader)`` for one a caller wrapped and handed in."""
    wrapped = dotted(assigned_targets(wrap)[0])
    return name if wrapped == name else f"{wrapped} (handed in as {name})"


def _handed_wrapped(ctx: Context, scope: Scope, chosen: dict[str, Kind]) -> dict[str, cst.Assign]:
    """Loaders of ``chosen`` that ``scope`` receives from callers that wrapped them first
    (`handed_wrapped`), with the caller's wrapping assignment: as `_wrapped_loaders` there."""
    if not isinstance(scope, cst.FunctionDef):
        return {}
    found: dict[str, cst.Assign] = {}
    for name, kind in ctx.facts.flow.params.get(scope, {}).items():
        if kind is not Kind.DATALOADER or chosen.get(name) is not Kind.DATALOADER:
            continue
        wrap = handed_wrapped(ctx.model, ctx.facts.flow, scope, name)
        if wrap is not None:
            found[name] = wrap
    return found


def _stepped_over_whole_loaders(
    ctx: Context, chosen: dict[str, Kind], whole: set[str]
) -> dict[str, cst.For]:
    """Schedulers of ``chosen`` every ``step()`` of which runs in a training loop over a loader
    of ``whole`` (left unprepared, every rank reads all of it), by that loop: a prepared
    scheduler steps once per rank at each call, N times the pace of the unsharded loop."""
    if not whole:
        return {}
    schedulers = {n for n, kind in chosen.items() if kind is Kind.SCHEDULER}
    loops = {id(loop.node): loop for loop in ctx.model.loops if loop.trains}
    found: dict[str, cst.For] = {}
    for name in sorted(schedulers):
        steps = [s.call for s in ctx.facts.flow.scheduler_steps(schedulers) if s.scheduler == name]
        around = [_nearest_loop(ctx, step, loops) for step in steps]
        if steps and all(loop is not None and loop.iterable in whole for loop in around):
            found[name] = around[0].node  # type: ignore[union-attr]
    return found


def stepped_over_unprepared_loaders(ctx: Context) -> dict[str, str]:
    """Prepared schedulers every ``step()`` of which runs in a training loop that reads a loader
    the conversion leaves unprepared (made where no prepare reaches it: a factory prepares the
    model, optimizer and scheduler it returns, the loader is made outside it), each with the
    loop and loaders that say why. Every rank reads all of that loader, so a prepared scheduler,
    stepping once per rank at each call, would end its schedule N times too soon; the next
    round of planning leaves it out of ``prepare`` (`_leave_out_schedulers_left_whole`). A
    prepared scheduler goes only with a prepared training loader."""
    schedulers = {
        name
        for name in ctx.plan.prepared
        if any(b.name == name for b in ctx.model.of_kind(Kind.SCHEDULER))
    } - set(ctx.left_whole_schedulers)
    if not schedulers:
        return {}
    loops = {id(loop.node): loop for loop in ctx.model.loops if loop.trains}
    found: dict[str, str] = {}
    for name in sorted(schedulers):
        steps = [s.call for s in ctx.facts.flow.scheduler_steps(schedulers) if s.scheduler == name]
        around = [_nearest_loop(ctx, step, loops) for step in steps]
        whole = [_left_unprepared(ctx, loop) if loop is not None else [] for loop in around]
        if steps and all(whole):
            loop = around[0]
            assert loop is not None
            found[name] = (
                f"the training loop at line {ctx.line(loop.node)} that steps it reads "
                f"{loader_names(whole[0])}, left unprepared"
            )
    return found


def _left_unprepared(ctx: Context, loop: Loop) -> list[str | None]:
    """The loaders ``loop`` trains on that stay whole on every rank: not prepared, not sharded
    by a sampler of their own; one it only evaluates (a shared loop run with training off)
    aside, as in the review line of `data_notes`."""
    evaluated = set(ctx.facts.shared_loop_evaluations) | set(ctx.facts.phase_loaders)
    return [
        n for n in ctx.unprepared_loaders(loop) if n not in ctx.self_sharded and n not in evaluated
    ]


def _leave_out_schedulers_left_whole(
    ctx: Context, scope: Scope, chosen: dict[str, Kind], created: dict[str, int]
) -> None:
    """Takes out of ``chosen`` the schedulers an earlier round found stepped only over loaders
    left unprepared (`stepped_over_unprepared_loaders`), with a line saying why."""
    for name in sorted(ctx.left_whole_schedulers):
        if chosen.get(name) is not Kind.SCHEDULER:
            continue
        chosen.pop(name)
        created.pop(name, None)
        _say_left_whole(ctx, name, _binding_line(ctx, name, scope))


def _say_left_whole(ctx: Context, name: str, line: int) -> None:
    ctx.plan.change(
        line,
        f"{name} is left unprepared: {ctx.left_whole_schedulers[name]} and read whole by "
        "every rank, so it steps once per optimizer step as on one process (prepared, it "
        "would step once per rank at each call and end its schedule N times too soon)",
    )


def _nearest_loop(ctx: Context, node: cst.CSTNode, loops: dict[int, Loop]) -> Loop | None:
    """The training loop nearest around ``node`` in its function."""
    for ancestor in ctx.model.ancestors(node):
        if isinstance(ancestor, cst.FunctionDef | cst.ClassDef):
            return None
        if id(ancestor) in loops:
            return loops[id(ancestor)]
    return None


def _leave_sets_with_container_models(
    ctx: Context, scope: Scope, chosen: dict[str, Kind], created: dict[str, int]
) -> None:
    """An optimizer over a model kept in a container entry (``models = {"net": Net()}``,
    ``Adam(models["net"].parameters())``): the model has no name to prepare it under, and an
    optimizer and loaders prepared without it would train each rank's unsynchronised copy on
    its own shard. Nothing that trains is prepared then (`_nothing_trained` leaves the loaders
    whole), and a review line says why."""
    entries = [
        (binding, entry)
        for binding in ctx.model.of_kind(Kind.OPTIMIZER)
        if chosen.get(binding.name) is Kind.OPTIMIZER and binding.scope is scope
        for entry in entry_owners(binding)
    ]
    if not entries:
        _leave_sets_with_entry_aliases(ctx, scope, chosen, created)
        return
    _keep_only_the_loaders(ctx, chosen, created)
    binding, entry = entries[0]
    code = ctx.code(entry)
    ctx.plan.review(
        binding.line,
        f"{binding.name} trains {code}, a model kept in a container entry the conversion does "
        "not prepare: nothing that trains is prepared (preparing the optimizer and the data "
        "without the model would train unsynchronised copies), so every rank trains on all the "
        "data (correct, not data-parallel); bind the model to a name, prepare it with its "
        "optimizer and loaders, and store it back in the entry",
    )


def _leave_sets_with_entry_aliases(
    ctx: Context, scope: Scope, chosen: dict[str, Kind], created: dict[str, int]
) -> None:
    """A model prepared under its name but also kept in a container entry that is read
    (``net = Net(); models = {"net": net}``, then ``models["net"](xb)``): the entry still holds
    the bare module, so a forward through it skips DDP and its gradients are never
    synchronised, while the prepared loaders shard the data. Nothing that trains is prepared
    then (as for an entry-only model), and a review line says why."""
    # the prepare call goes below the last object it prepares
    lines = [b.line for b in ctx.model.bindings if b.name in chosen and b.scope is scope]
    if not lines:
        return
    aliased = [
        (binding, read)
        for binding in ctx.model.of_kind(Kind.MODEL)
        if chosen.get(binding.name) is Kind.MODEL and binding.scope is scope
        for read in used_entry_aliases(ctx.model, binding, max(lines))
    ]
    if not aliased:
        return
    _keep_only_the_loaders(ctx, chosen, created)
    binding, read = aliased[0]
    ctx.plan.review(
        binding.line,
        f"{binding.name} is also kept in a container entry that is used ({ctx.code(read)}): "
        f"preparing {binding.name} would leave the entry the bare module, so a forward through "
        "it would train unsynchronised copies; nothing that trains is prepared, so every rank "
        "trains on all the data (correct, not data-parallel); prepare the model, then store "
        "the prepared one back in the entry",
    )


def _keep_only_the_loaders(ctx: Context, chosen: dict[str, Kind], created: dict[str, int]) -> None:
    """Nothing that trains is prepared (its model lives in a container entry): the models and
    optimizers leave the prepare call, kept as they are; `_nothing_trained` then leaves the
    loaders whole too."""
    for name in [n for n, kind in chosen.items() if kind is not Kind.DATALOADER]:
        chosen.pop(name)
        created.pop(name, None)
        ctx.frozen.add(name)


def _nothing_trained(ctx: Context, chosen: dict[str, Kind]) -> bool:
    """Loaders to prepare, and a backward through the prepared code, but no model or optimizer
    is prepared anywhere (an optimizer made in a way the analysis does not follow): sharded
    data would then train unsynchronised copies."""
    if set(chosen.values()) & _TRAINED_KINDS or Kind.DATALOADER not in chosen.values():
        return False
    trained = {b.name for b in ctx.model.of_kind(*_TRAINED_KINDS)}
    if trained & (set(ctx.plan.prepared) | ctx.model.prepared_names):
        return False
    return any(not ctx.facts.trains_itself(call) for call in ctx.model.backward_calls)


def _trains_nothing_prepared(ctx: Context, chosen: dict[str, Kind]) -> bool:
    """No model or optimizer is prepared, here or anywhere (a trainer whose model comes through
    ``set_model(nn.Sequential(...))`` and whose optimizer is built from a class it is handed):
    loaders its methods receive would then shard the data of unsynchronised copies."""
    if set(chosen.values()) & _TRAINED_KINDS:
        return False
    trained = {b.name for b in ctx.model.of_kind(*_TRAINED_KINDS)}
    return not trained & (set(ctx.plan.prepared) | ctx.model.prepared_names)


def _review_received_loaders(ctx: Context, scope: Scope) -> None:
    """The loaders the trainer's methods receive stay as they are when nothing that trains is
    prepared (`_trains_nothing_prepared`), each method with the reason."""
    owner = ctx.facts.placement.class_of(scope)
    if owner is None:
        return
    flow = ctx.facts.flow
    for method in ctx.facts.placement.body_of(owner):
        if not isinstance(method, cst.FunctionDef) or method is scope:
            continue
        received = flow.params.get(method, {})
        loaders = [p.name.value for p in method.params.params]
        loaders = [name for name in loaders if received.get(name) is Kind.DATALOADER]
        if not loaders or not flow.calls_of(method):
            continue
        ctx.plan.review(
            ctx.line(method),
            f"{method.name.value}() receives {', '.join(loaders)}, left unprepared: no model or "
            "optimizer the conversion recognises is prepared, so sharding the data would train "
            "each rank's copy on its own shard, never synchronised; every rank trains on all of "
            "it (correct, not data-parallel); prepare the model and its optimizer with it",
        )


def _insert_prepare(ctx: Context, anchor: cst.CSTNode, order: list[str]) -> None:
    targets = ", ".join(order)
    ctx.plan.insert_after(anchor, statement(_prepare_code(ctx, order, anchor)))
    ctx.need(anchor)
    ctx.plan.change(ctx.line(anchor), f"prepare {targets} after line {ctx.line(anchor)}")


def _groups(
    ctx: Context,
    scope: Scope,
    chosen: dict[str, Kind],
    created: dict[str, int],
    kept: dict[str, tuple[int, set[str]]],
) -> list[tuple[cst.CSTNode, list[str]]]:
    """One prepare after the last object is created, unless something trains or evaluates in
    between (a script that trains one model, then builds another): then each group of objects
    is prepared after its last creation and before the first statement that uses it. A
    parameter (no creation in this scope) goes with the first group. A group also waits for
    the schedulers left out of prepare that read its loaders (``kept``), when it can before
    its first use, so that they read the loader the original read."""
    body = ctx.facts.placement.body_of(scope)
    uses = [(index, _objects_used(ctx, line, set(chosen))) for index, line in enumerate(body)]
    groups: dict[int, list[str]] = {}
    for name in chosen:
        made = created.get(name, -1)
        first_use = next(
            (index for index, used in uses if index > made and name in used), len(body)
        )
        groups.setdefault(first_use, []).append(name)
    placed = []
    for first_use, names in sorted(groups.items()):
        last = max(created.get(name, -1) for name in names)
        waits = [index for index, loaders in kept.values() if loaders & set(names)]
        last = max([last, *(index for index in waits if index < first_use)])
        placed.append((last, names))
    if placed[0][0] < 0:  # only parameters before the first use: go with the next group
        return _parameters_read_first(ctx, body, chosen, created, sorted(groups.items()))
    return [(body[last], names) for last, names in placed]


def _parameters_read_first(
    ctx: Context,
    body: list[cst.CSTNode],
    chosen: dict[str, Kind],
    created: dict[str, int],
    groups: list[tuple[int, list[str]]],
) -> list[tuple[cst.CSTNode, list[str]]]:
    """Parameters go with the objects made here, prepared after the last of them, unless the
    function reads them before that (``linear_probe(encoder, train_loader, test_loader)``
    extracts features from both loaders, then builds and trains its probe): those are prepared
    on their own just before their first use, or a prepare after it would leave that read on
    every rank's copy of the whole set (an evaluation there gathering N copies of it). Read
    by the first statement, where no statement precedes to place a prepare after, they stay
    with the rest and a review line says so."""
    end = max(created.values())
    early = [
        (use, names) for use, names in groups if use <= end and all(n not in created for n in names)
    ]
    if not early:
        return [(body[end], list(chosen))]
    first_use = early[0][0]
    read_first = [n for _, names in early for n in names]
    if first_use == 0:
        ctx.plan.review(
            ctx.line(body[0]),
            f"{', '.join(read_first)} {'is' if len(read_first) == 1 else 'are'} read from this "
            "line on, "
            f"before line {ctx.line(body[end])} makes what they are prepared with: this read "
            "is of every rank's copy of the whole set (what it gathers, N copies of it); "
            "prepare them where they are made, before they are handed in",
        )
        return [(body[end], list(chosen))]
    rest = [n for n in chosen if n not in read_first]
    return [(body[first_use - 1], read_first), (body[end], rest)]


def _left_out_schedulers_reading_loaders(
    ctx: Context, scope: Scope, chosen: dict[str, Kind]
) -> dict[str, tuple[int, set[str]]]:
    """Schedulers of the scope's body left out of prepare whose arguments read a loader that is
    prepared (``CosineAnnealingLR(opt, T_max=len(train_loader) * epochs)``), directly or through
    names bound before them (``total = len(train_loader) * epochs``): by name, the index of
    their statement and the loaders. Made after the prepare, they would read the prepared
    loader's length, one rank's shard: the schedule would change meaning."""
    placement = ctx.facts.placement
    body = placement.body_of(scope)
    loaders = {name for name, kind in chosen.items() if kind is Kind.DATALOADER}
    found: dict[str, tuple[int, set[str]]] = {}
    for binding in ctx.model.of_kind(Kind.SCHEDULER):
        if binding.scope is not scope or binding.name in chosen or _conditional(ctx, binding):
            continue
        top = placement.top_statement(binding.statement, scope)
        if top is None or binding.value is None:
            continue
        index = placement.index(top, scope)
        read = _read_through(ctx, body[:index], binding.value) & loaders
        if read:
            found[binding.name] = (index, read)
    return found


def _size_schedulers_in_all_ranks_steps(
    ctx: Context, scope: Scope, chosen: dict[str, Kind], groups: list[tuple[cst.CSTNode, list[str]]]
) -> None:
    """Schedulers to be prepared that are made after the prepare of a loader whose length they
    read (a warm-up pass over ``loaders["train"]`` before ``OneCycleLR(opt, total_steps=2 *
    len(loaders["train"]))``): sized in all ranks' steps by `shard_lengths`, the one policy for
    a scheduler sized by a prepared loader. A sizing that reads such a loader some way it does
    not follow (a name bound other than by an assignment) gets its review line here."""
    placement = ctx.facts.placement
    body = placement.body_of(scope)
    early: dict[str, int] = {
        name: placement.index(anchor, scope)
        for anchor, names in groups
        for name in names
        if chosen[name] is Kind.DATALOADER
    }
    for name, anchor in ctx.loader_dicts_prepared_after.items():
        top = placement.top_statement(anchor, scope)
        if top is not None:
            early[name] = placement.index(top, scope)
    for binding in ctx.model.of_kind(Kind.SCHEDULER):
        if binding.scope is not scope or chosen.get(binding.name) is not Kind.SCHEDULER:
            continue
        top = placement.top_statement(binding.statement, scope)
        if top is None or binding.value is None:
            continue
        index = placement.index(top, scope)
        before = {n for n, at in early.items() if at < index}
        read = _read_through(ctx, body[:index], binding.value) & before
        if not read or PROCESS_COUNT.search(ctx.code(binding.value)):
            continue
        why = "used before it is made"
        if not shard_lengths.size_in_all_ranks_steps(ctx, binding, before, why):
            ctx.plan.review(
                binding.line,
                f"{binding.name} is sized from {', '.join(sorted(read))}, prepared before it is "
                "made (its loaders are used first): if its sizes count batches, they count one "
                "rank's shard (N times fewer) while a prepared scheduler steps N times per "
                f"call, so the schedule ends N times too soon; multiply those counts by "
                f"{ctx.a('num_processes')}, or compute them from the loaders before they are "
                "prepared",
            )


def _read_through(ctx: Context, earlier: list[cst.CSTNode], value: cst.CSTNode) -> set[str]:
    """The names ``value`` reads, and those read by the statements of ``earlier`` that bind
    them (latest first)."""
    read = _names_read(ctx, value)
    for line in reversed(earlier):
        for small in walk(line):
            if bound_by(small) & read:
                read |= _names_read(ctx, small)
    return read


def _names_read(ctx: Context, node: cst.CSTNode) -> set[str]:
    """Variables and dotted names (``self.loader``) under ``node``."""
    dotted_names = {dotted(n) for n in walk(node) if isinstance(n, cst.Attribute)} - {None}
    return variables_in(ctx.model, node) | dotted_names  # type: ignore[operator]


def _review_schedulers_reading_prepared(
    ctx: Context,
    scope: Scope,
    groups: list[tuple[cst.CSTNode, list[str]]],
    kept: dict[str, tuple[int, set[str]]],
) -> None:
    """A kept scheduler made after the prepare of a loader it reads (the loader is used for
    training before the scheduler is made): it now reads the prepared loader, one rank's shard;
    said in a review line."""
    placement = ctx.facts.placement
    body = placement.body_of(scope)
    for name, (index, loaders) in sorted(kept.items()):
        for anchor, names in groups:
            early = sorted(loaders & set(names))
            if early and placement.index(anchor, scope) < index:
                ctx.plan.review(
                    ctx.line(body[index]),
                    f"{name} is left out of prepare and made after {', '.join(early)} is "
                    f"prepared (it is used before {name} is made): its arguments now read the "
                    "prepared loader, one rank's shard (len() is N times smaller); compute "
                    "them from the loader before the prepare if the schedule counts the whole "
                    "dataset",
                )


def _objects_used(ctx: Context, line: cst.CSTNode, chosen: set[str]) -> set[str]:
    """Which of the ``chosen`` objects a top-level statement uses: all of them when it trains or
    evaluates (a training or evaluation loop, a backward, or a call of a function of this file
    that holds one); only those it hands to a generator function (``self.dl = cycle(dl)``: the
    call runs none of the generator's body but keeps ``dl``). A ``def`` or ``class`` statement
    runs none of its body: a training function defined between the model and its optimizer
    does not split the prepare call."""
    if isinstance(line, (cst.FunctionDef, cst.ClassDef)):
        return set()
    flow = ctx.facts.flow
    for loop in ctx.model.loops:
        if ctx.facts.placement.inside(loop.node, line) and (loop.trains or flow.reads_loader(loop)):
            return chosen
    for call in ctx.model.backward_calls:
        if ctx.facts.placement.inside(call, line):
            return chosen
    handed: set[str] = set()
    for node in walk(line):
        if isinstance(node, cst.Call):
            target = callee(ctx.model, node)
            if target is not None and _trains_or_evaluates(ctx, target[0]):
                if not is_generator_function(target[0]):
                    return chosen
                handed |= _handed_to_a_generator(node, chosen)
            if _bundles_prepared_kinds(ctx, node):
                return chosen
    return handed


def _handed_to_a_generator(call: cst.Call, chosen: set[str]) -> set[str]:
    """The objects a generator function's call is handed (``cycle(dl)``): the call runs none
    of its body, so only they are used there. Counted as a use of everything, the call split
    the prepare call and the model was prepared before the statements after it: an EMA
    ``copy.deepcopy(self.model)`` copied the DDP wrapper, whose ``load_state_dict`` then
    refused the unwrapped weights on 2 ranks."""
    return {dotted(argument.value) for argument in call.args} & chosen


_BUNDLED_KINDS = {Kind.DATALOADER, Kind.MODEL, Kind.OPTIMIZER, Kind.SCHEDULER}


def _bundles_prepared_kinds(ctx: Context, call: cst.Call) -> bool:
    """``Loaders(train_dl, val_dl)`` or ``TrainState(model, optimizer)`` of a namedtuple or
    dataclass: the record keeps what it is given, so that is prepared before it is built, or
    the code that reads its fields would get the unprepared objects (a model trained unwrapped,
    unsynchronised, on a sharded loader)."""
    if not record_fields(ctx.model, dotted(call.func)):
        return False
    flow = ctx.facts.flow
    return any(flow.kind_of(dotted(a.value), call) in _BUNDLED_KINDS for a in call.args)


def _trains_or_evaluates(ctx: Context, function: cst.FunctionDef) -> bool:
    return any(
        ctx.facts.placement.inside(loop.node, function)
        and (loop.trains or ctx.facts.flow.reads_loader(loop))
        for loop in ctx.model.loops
    ) or any(ctx.facts.placement.inside(call, function) for call in ctx.model.backward_calls)


def _sharded_by_own_samplers(
    ctx: Context, scope: Scope, chosen: dict[str, Kind]
) -> dict[str, cst.ClassDef]:
    """The loaders of ``chosen`` built here with ``sampler=``/``batch_sampler=`` of a sampler
    class of the file that shards by the rank its call hands it (lint's ACC402 test,
    `sharding_sampler`): each rank already reads its own part."""
    found: dict[str, cst.ClassDef] = {}
    for binding in ctx.model.of_kind(Kind.DATALOADER):
        if binding.scope is not scope or chosen.get(binding.name) is not Kind.DATALOADER:
            continue
        value = strip_self_methods(binding.value)
        sharding = sharding_sampler(ctx.model, value) if isinstance(value, cst.Call) else None
        if sharding is not None and sharding.own is not None:
            found[binding.name] = sharding.own
    return found


def _binding_line(ctx: Context, name: str, scope: Scope) -> int:
    return next(b.line for b in ctx.model.bindings if b.name == name and b.scope is scope)


def _add_models_set_by_other_methods(ctx: Context, scope: Scope, chosen: dict[str, Kind]) -> None:
    """``self.optimizer = SGD(self.model.parameters())`` in ``setup()``, where ``self.model`` was
    set by another method (``set_model(model)``): the model exists where its optimizer is made,
    so it is prepared with it. Left out, the optimizer would be prepared and the data sharded
    while the model, never wrapped, trained unsynchronised on each rank's shard."""
    flow = ctx.facts.flow
    prepared = set(ctx.plan.prepared) | ctx.model.prepared_names
    for binding in ctx.model.of_kind(Kind.OPTIMIZER):
        if binding.scope is not scope or binding.name not in chosen:
            continue
        for owner in sorted(parameter_owners(binding)):
            if owner in chosen or owner in prepared or not owner.startswith("self."):
                continue
            bound_here = any(b.name == owner and b.scope is scope for b in ctx.model.bindings)
            if not bound_here and flow.kind_of(owner, binding.statement) is Kind.MODEL:
                chosen[owner] = Kind.MODEL


def _attribute_aliases(ctx: Context, scope: Scope, chosen: dict[str, Kind]) -> dict[str, str]:
    """``self.model = model`` in a constructor that received ``model``: the parameter's name
    -> the attribute's, one object under two names."""
    aliases = {}
    for binding in ctx.model.bindings:
        if binding.scope is scope and binding.received and binding.name in chosen:
            source = dotted(strip_self_methods(binding.value))
            if source is not None and "." not in source:
                aliases[source] = binding.name
    return aliases


def _prepare_attributes_for_their_locals(
    ctx: Context,
    scope: Scope,
    chosen: dict[str, Kind],
    created: dict[str, int],
    aliases: dict[str, str],
) -> None:
    """``model = build_model(cfg)``, ``self.model = model``: one object under two names, and
    the other methods read the attribute. It is prepared in the local's place (preparing both
    would wrap one module twice; the local alone would leave ``self.model`` the bare module,
    trained unsynchronised). When the method reads the local after the prepare, neither name
    can stand for both: the local is prepared, as before, and a review line says so."""
    if not isinstance(scope, cst.FunctionDef):
        return
    locals_ = {b.name for b in ctx.model.bindings if b.scope is scope and not b.received}
    for local, attribute in aliases.items():
        if local not in locals_ or local not in chosen or attribute not in chosen:
            continue
        after = max(created.values()) if created else 0
        body = ctx.facts.placement.body_of(scope)
        if any(
            isinstance(node, cst.Name) and node.value == local
            for statement in body[after + 1 :]
            for node in walk(statement)
        ):
            chosen.pop(attribute)
            created.pop(attribute, None)
            ctx.plan.review(
                _binding_line(ctx, attribute, scope),
                f"{attribute} is left the bare {local}, trained unsynchronised on each rank: "
                f"{local} is prepared, and read after the prepare, so {attribute} cannot take "
                f"its place; set {attribute} from the prepared {local} after the prepare",
            )
            continue
        chosen.pop(local)
        created.pop(local, None)


def _untrained_models(
    ctx: Context, scope: Scope, chosen: dict[str, Kind], aliases: dict[str, str]
) -> list[str]:
    """Models of ``scope`` that no optimizer trains (a frozen feature extractor, a teacher;
    style transfer optimises an image: ``Adam([target])``). Only when every optimizer's
    parameters are known: built from ``.parameters()`` of named models, or a list of tensors.
    An optimizer built from a received parameter (``SGD(model.parameters())`` beside
    ``self.model = model``) trains the attribute too."""
    optimizers = [b for b in ctx.model.of_kind(Kind.OPTIMIZER) if b.name in chosen]
    if not optimizers:
        return []
    models = {n for n, kind in chosen.items() if kind is Kind.MODEL}
    trained: set[str] = set()
    for optimizer in optimizers:
        owners = parameter_owners(optimizer)
        if not owners and not _tensor_list(optimizer, models):
            return []
        trained |= owners | {aliases[owner] for owner in owners if owner in aliases}
    return [name for name in models if name not in trained]


def _parts_of_other_models(
    ctx: Context, scope: Scope, chosen: dict[str, Kind], untrained: list[str]
) -> dict[str, str]:
    """Untrained models handed to the constructor of a model that is prepared
    (``model = ClassificationNet(embedding_net, n_classes)``, siamese-triplet's shape): a
    submodule of it, trained through ``model.parameters()``, by the name of that model."""
    parts: dict[str, str] = {}
    for binding in ctx.model.of_kind(Kind.MODEL):
        if binding.scope is not scope or chosen.get(binding.name) is not Kind.MODEL:
            continue
        if binding.name in untrained:
            continue
        value = strip_moves(binding.value)
        if not isinstance(value, cst.Call):
            continue
        for argument in value.args:
            name = dotted(argument.value)
            if name in untrained:
                parts.setdefault(name, binding.name)
    return parts


def _drop_untrained_conditional(
    ctx: Context, scope: Scope, chosen: dict[str, Kind], conditional: list[Binding]
) -> list[Binding]:
    """A model created under a condition that no optimizer trains (a distillation teacher built
    in ``if params.teacher == "resnet18":``) is left where the script places it, as one
    created unconditionally is: prepared, DDP would wrap a model whose gradients never come."""
    models = {b.name for b in conditional if b.kind is Kind.MODEL}
    if not models:
        return conditional
    pool = {**chosen, **{b.name: b.kind for b in conditional}}
    untrained = set(_untrained_models(ctx, scope, pool, {})) & models
    for name in sorted(untrained):
        ctx.frozen.add(name)
        _note_untrained(ctx, name, scope)
    return [b for b in conditional if b.name not in untrained]


def _note_untrained(ctx: Context, name: str, scope: Scope) -> None:
    """The summary's line for ``name``, left out of prepare: trained by no optimizer of the
    scope (a teacher a caller trained before handing it in is said to be), and where it
    stays: where the script places it, unless the device step moves it beside the batches
    (which says so on its own line)."""
    line = _binding_line(ctx, name, scope)
    trained = _trained_before_handed_in(ctx, name, scope)
    if trained is None:
        said = f"{name} is trained by no optimizer: not prepared (DDP refuses a model with "
    else:
        handed, optimizer = trained
        owner = ctx.facts.placement.class_of(scope)
        here = f"{owner.name.value}" if owner is not None else f"{scope.name.value}()"  # type: ignore[union-attr]
        said = (
            f"{name} is trained by no optimizer of {here} (the {dotted(handed.value)} line "
            f"{ctx.line(handed)} hands in is trained before, by {optimizer.name} of line "
            f"{optimizer.line}): not prepared here (DDP refuses a model with "
        )
    ctx.plan.change(line, said + "nothing to train)", when=lambda: name in ctx.moved_untrained)
    ctx.plan.change(
        line,
        said + "nothing to train); it stays where the script places it",
        when=lambda: name not in ctx.moved_untrained,
    )


def _trained_before_handed_in(
    ctx: Context, name: str, scope: Scope
) -> tuple[cst.Arg, Binding] | None:
    """``self.teacher = teacher`` of a constructor that ``Distiller(teacher, student)`` calls
    after ``topt = Adam(teacher.parameters())`` trained ``teacher`` in the caller: the
    argument handed in and that optimizer, at the first such call."""
    if not isinstance(scope, cst.FunctionDef):
        return None
    received = [b for b in ctx.model.of_kind(Kind.MODEL) if b.name == name and b.scope is scope]
    parameters = {received_name(scope, b.value) for b in received if b.received} - {None}
    if not parameters:
        return None
    optimizers = ctx.model.of_kind(Kind.OPTIMIZER)
    for call, implicit in ctx.facts.flow.calls_of(scope):
        caller = ctx.model.scope_of(call)
        for parameter, argument in bound_arguments(scope, call, implicit):
            handed = dotted(argument.value)
            if parameter not in parameters or handed is None:
                continue
            for optimizer in optimizers:
                if (
                    optimizer.scope is caller
                    and ctx.model.order(optimizer.statement) < ctx.model.order(call)
                    and handed in parameter_owners(optimizer)
                ):
                    return argument, optimizer
    return None


def _tensor_list(optimizer: Binding, models: set[str]) -> bool:
    """``Adam([target], lr=...)``: the optimizer's parameters are named tensors, no model's."""
    value = optimizer.value
    if not isinstance(value, cst.Call) or not value.args or value.args[0].keyword is not None:
        return False
    first = value.args[0].value
    if not isinstance(first, (cst.List, cst.Tuple)) or not first.elements:
        return False
    names = [dotted(e.value) for e in first.elements if isinstance(e, cst.Element)]
    return len(names) == len(first.elements) and all(
        name is not None and owning_model(name) not in models for name in names
    )


def _received_loaders(ctx: Context, scope: cst.FunctionDef, aliases: dict[str, str]) -> list[str]:
    """``def run_training(self, model, train_loader, val_loader, config):`` builds the optimizer
    and trains: the loaders it receives are prepared with what it creates, or every rank would
    train on all the data and evaluate all of it. Only when no call of it runs in a loop (each
    call would wrap the loader anew) and the caller did not prepare them already."""
    flow, placement = ctx.facts.flow, ctx.facts.placement
    calls = [call for call, _ in flow.calls_of(scope)]
    if not calls:
        return []
    for call in calls:
        function = placement.enclosing_function(call)
        for ancestor in ctx.model.ancestors(call):
            if ancestor is function:
                break
            if isinstance(ancestor, (cst.For, cst.While, cst.Lambda)):
                return []
    prepared = _prepared_on_the_way(ctx, scope, calls)
    kept = _kept_by_a_base_constructor(ctx, scope)
    return [
        name
        for name, kind in flow.params.get(scope, {}).items()
        if kind is Kind.DATALOADER
        and name not in aliases
        and name not in kept
        and any(o not in prepared for o in flow.origins(name, scope.body, stop=prepared))
    ]


def _attribute_index(ctx: Context, scope: cst.FunctionDef, attribute: str) -> int:
    """The index in ``scope``'s body of the statement that binds ``attribute``."""
    placement = ctx.facts.placement
    for assign in ctx.model.index.own_assignments(scope):
        if any(dotted(t) == attribute for t in assigned_targets(assign)):
            top = placement.top_statement(assign, scope)
            if top is not None:
                return placement.index(top, scope)
    return 0


def _kept_by_a_base_constructor(ctx: Context, scope: cst.FunctionDef) -> set[str]:
    """The parameters ``scope`` hands to another constructor (``super().__init__(train_loader,
    val_loader)``), which keeps them as attributes: preparing the local afterwards would leave
    the attribute, the object the loops read, unprepared."""
    found: set[str] = set()
    for node in walk(scope.body):
        if not isinstance(node, cst.Call):
            continue
        target = callee(ctx.model, node)
        if target is None or target[0].name.value != "__init__" or target[0] is scope:
            continue
        found |= {name for a in node.args if (name := dotted(a.value)) and "." not in name}
    return found


def _prepared_on_the_way(ctx: Context, scope: cst.FunctionDef, calls: list[cst.Call]) -> set[str]:
    """Names prepared where they can reach ``scope``'s parameters: at module level, in a
    function that calls ``scope``, or in ``scope`` itself. A sibling's local of the same name
    (``train(model, train_loader)`` prepares its own ``train_loader``) is another object."""
    placement = ctx.facts.placement
    callers = {placement.enclosing_function(call) for call in calls}
    names = set(ctx.model.prepared_names)
    for name in ctx.plan.prepared:
        anchor = ctx.prepared_after.get(name)
        where = placement.enclosing_function(anchor) if anchor is not None else None
        if anchor is None or where is None or where is scope or where in callers:
            names.add(name)
    return names


def _trained_here(ctx: Context, scope: Scope) -> set[str]:
    return {
        name
        for optimizer in ctx.model.of_kind(Kind.OPTIMIZER)
        if optimizer.scope is scope
        for name in parameter_owners(optimizer)
    }


def _conditional(ctx: Context, binding: Binding) -> bool:
    """Created under an ``if`` (or in a loop or ``try``) that may not run: a prepare call after
    the block would raise NameError on the runs that skip it. An ``if``/``else`` that binds the
    name on every branch is not conditional."""
    for ancestor in ctx.model.ancestors(binding.statement):
        if ancestor is binding.scope:
            return False
        if isinstance(ancestor, (cst.For, cst.While, cst.Try)):
            return True
        if is_main_guard(ancestor):
            continue
        if (
            isinstance(ancestor, cst.If)
            and not _bound_on_every_branch(ancestor, binding.name)
            and not _read_after(ctx, ancestor, binding.name)
        ):
            return True
    return False


def _read_after(ctx: Context, branch: cst.If, name: str) -> bool:
    """``if args.arch == "mlp": model = ...`` / ``if args.arch == "cnn": model = ...`` (no
    ``else: raise``), then ``optimizer = SGD(model.parameters())`` in the same block: a
    statement after the chain that always runs reads ``name``, so every run that gets past it
    has bound it (the others stop there with a NameError, converted or not). Past the chain the
    name is as good as bound on every branch: prepared after it with the rest, not in the one
    branch the conversion saw first (the other branch's model was left unprepared).

    Not when a branch uses the object after binding it (each branch builds the model and trains
    it, the save after the chain): prepared after the chain, every branch would train it
    unwrapped, each rank on its own. Only real reads count: ``cfg.model`` and
    ``build(model=None)`` do not read ``model``."""
    top: cst.CSTNode = branch
    while isinstance(ctx.model.parent(top), cst.If):  # an ``elif``: its chain's first ``if``
        top = ctx.model.parent(top)
    block = ctx.model.parent(top)
    lines = getattr(block, "body", None)
    if not isinstance(lines, (list, tuple)) or top not in lines:
        return False
    assert isinstance(top, cst.If)
    if any(_used_after_binding(ctx, suite, name) for suite in if_chain(top)[1]):
        return False
    return any(
        is_name_read(ctx.model, node, name)
        for line in lines[lines.index(top) + 1 :]
        if isinstance(line, cst.SimpleStatementLine)
        for node in walk(line)
    )


def _used_after_binding(ctx: Context, suite: cst.BaseSuite, name: str) -> bool:
    """A branch of the chain reads ``name`` after a statement of it binds ``name``."""
    bound = [
        ctx.model.order(node)
        for node in walk(suite)
        if isinstance(node, cst.Name) and node.value == name and is_binding(ctx.model, node)
    ]
    return bool(bound) and any(
        is_name_read(ctx.model, node, name) and ctx.model.order(node) > min(bound)
        for node in walk(suite)
    )


def _where_it_may_not_run(ctx: Context, binding: Binding) -> str:
    """How `_conditional` found ``binding`` conditional, in words for a review line: a
    scheduler made per fold is in a loop, not under a condition."""
    for ancestor in ctx.model.ancestors(binding.statement):
        if isinstance(ancestor, (cst.For, cst.While)):
            return "in a loop"
        if isinstance(ancestor, cst.Try):
            return "in a try block"
        if isinstance(ancestor, cst.If) and not is_main_guard(ancestor):
            return "under a condition"
    return "under a condition"


def _bound_on_every_branch(branch: cst.If, name: str) -> bool:
    """Every branch binds ``name`` or leaves the scope (``else: raise NotImplementedError``):
    past the ``if`` the name is always bound."""
    _, blocks, has_else = if_chain(branch)
    return has_else and all(_binds(block, name) or _leaves(block) for block in blocks)


#: calls that end the process, as a statement of their own
_EXITS = frozenset({"exit", "quit", "sys.exit", "os._exit"})


def _leaves(block: cst.CSTNode) -> bool:
    """The block's (an ``if``'s suite, or a statement holding one) last statement raises,
    returns or exits the process: nothing after the ``if`` runs once it is taken."""
    if isinstance(block, cst.SimpleStatementSuite):  # ``else: raise NotImplementedError``
        smalls = block.body
    else:
        body = getattr(block, "body", None)
        lines = getattr(body, "body", body)
        if not isinstance(lines, (list, tuple)) or not lines:
            return False
        last = lines[-1]
        if not isinstance(last, cst.SimpleStatementLine):
            return False
        smalls = last.body
    if not smalls:
        return False
    small = smalls[-1]
    if isinstance(small, (cst.Raise, cst.Return)):
        return True
    return (
        isinstance(small, cst.Expr)
        and isinstance(small.value, cst.Call)
        and dotted(small.value.func) in _EXITS
    )


def _binds(block: cst.CSTNode, name: str) -> bool:
    return any(
        isinstance(node, cst.AssignTarget) and dotted(node.target) == name for node in walk(block)
    )


def _prepare_conditional(ctx: Context, bindings: list[Binding]) -> None:
    """Objects created under a condition. Those created in one block (``if args.do_train:``,
    one pass of a loop over configurations) are prepared there together, after the last of
    them and before the block first uses them, as a scope's objects are; the rest each where
    it is created."""
    by_block: dict[cst.CSTNode, list[Binding]] = {}
    schedulers: list[tuple[cst.CSTNode, Binding]] = []
    for binding in bindings:
        if binding.kind is Kind.SCHEDULER and binding.name in ctx.left_whole_schedulers:
            _say_left_whole(ctx, binding.name, binding.line)
            continue
        block = ctx.model.parent(ctx.model.parent(binding.statement) or binding.statement)
        if not isinstance(block, (cst.If, cst.For, cst.While)):
            _prepare_where_created(ctx, binding)
            continue
        if binding.kind is Kind.SCHEDULER:
            schedulers.append((block, binding))
            continue
        by_block.setdefault(block, []).append(binding)
    for block, binding in schedulers:
        if _steps_with_an_optimizer_of(ctx, binding, by_block.get(block, [])):
            by_block[block].append(binding)
        else:
            _prepare_where_created(ctx, binding)
    for block, members in by_block.items():
        members = _without_loader_dicts(ctx, members)
        if not members:
            continue
        kinds = {b.kind for b in members}
        if len(members) == 1 or not kinds & _TRAINED_KINDS:
            for binding in members:
                _prepare_where_created(ctx, binding)
            continue
        chosen = {b.name: b.kind for b in members}
        body = ctx.facts.placement.body_of(block)
        created = {b.name: body.index(b.statement) for b in members}
        _keep_evaluated_loaders_whole(ctx, chosen, created)
        if not set(chosen.values()) & _TRAINED_KINDS:
            continue  # no model or optimizer left (``created`` holds ``chosen``'s names)
        for anchor, names in _groups(ctx, block, chosen, created, {}):
            order = sorted(names, key=lambda n: list(Kind).index(chosen[n]))
            _insert_prepare(ctx, anchor, order)
            ctx.prepared_after.update(dict.fromkeys(order, anchor))
            for name in order:
                ctx.prepared_anchors.setdefault(name, []).append(anchor)
            ctx.plan.prepared.extend(order)


def _stepped_per_fixed_iteration(
    ctx: Context, chosen: dict[str, Kind]
) -> dict[str, cst.For | cst.While]:
    """Schedulers every ``step()`` of which runs once per optimizer step in a loop of a fixed
    count (`per_fixed_iteration_steps`), by the loop: each rank runs all of it, so the schedule
    must step once per call, as an unprepared one does."""
    schedulers = {n for n, kind in chosen.items() if kind is Kind.SCHEDULER}
    steps = ctx.facts.flow.scheduler_steps(schedulers)
    found: dict[str, cst.For | cst.While] = {}
    for name in sorted(schedulers):
        own = [step.call for step in steps if step.scheduler == name]
        fixed = per_fixed_iteration_steps(ctx.facts, own)
        if fixed is not None:
            found[name] = fixed[0][1]
    return found


def _steps_with_an_optimizer_of(ctx: Context, scheduler: Binding, members: list[Binding]) -> bool:
    """A scheduler made in the block (one fold of a k-fold loop) that makes its optimizer, and
    stepped per batch: prepared with the fold's objects, it keeps the original's pace on N ranks
    (a prepared scheduler steps once per rank at each call) instead of falling N times behind."""
    value = scheduler.value
    if not isinstance(value, cst.Call) or not value.args:
        return False
    optimizer = dotted(value.args[0].value)
    if not any(m.kind is Kind.OPTIMIZER and m.name == optimizer for m in members):
        return False
    return scheduler.name not in ctx.facts.flow.per_epoch_schedulers({scheduler.name})


def _without_loader_dicts(ctx: Context, members: list[Binding]) -> list[Binding]:
    """The block's objects but its dicts of DataLoaders (one fold's ``loaders = {"train": ...,
    "val": ...}``), whose loaders are prepared each where the dict is made, as a scope's are:
    ``prepare`` hands a dict back untouched, so ``loaders = accelerator.prepare(loaders)``
    would leave every rank reading all of them while the summary said prepared. The rest of
    the block (the fold's model and optimizer) is still prepared together."""
    kept = []
    for binding in members:
        if not is_loader_dict(ctx.model, binding):
            kept.append(binding)
        elif not _dict_evaluated_unsure(ctx, binding):
            _prepare_each_value(ctx, binding)
    return kept


def _prepare_where_created(ctx: Context, binding: Binding) -> None:
    """Prepared on its own, right where it exists. A scheduler is not: prepared before its
    optimizer it would not see the prepared one, and one stepped per epoch must stay as it is
    (a prepared scheduler steps once per rank)."""
    name = binding.name
    if binding.kind is Kind.SCHEDULER:
        if name not in ctx.facts.flow.per_epoch_schedulers({name}):
            ctx.plan.review(
                binding.line,
                f"{name} is created {_where_it_may_not_run(ctx, binding)} and left unprepared: "
                "it steps once per "
                "optimizer step on each rank; prepare it with its optimizer if it should "
                "follow the global step count",
            )
        return
    if binding.kind is Kind.DATALOADER:
        # read only by an evaluation no gather fits: left whole, as in an unconditional scope
        alone = {name: binding.kind}
        _keep_evaluated_loaders_whole(ctx, alone, {})
        if name not in alone:
            return
    anchor = binding.statement
    if binding.kind is Kind.MODEL:  # after its new head and frozen backbone, not before them
        anchor = last_building_statement(ctx.model, binding.statement, name)
    ctx.plan.insert_after(anchor, statement(f"{name} = {ctx.a('prepare')}({name})"))
    ctx.need(anchor)
    ctx.plan.prepared.append(name)
    ctx.prepared_after[name] = anchor
    ctx.prepared_anchors.setdefault(name, []).append(anchor)
    where = "where it is created" if anchor is binding.statement else "once it is built"
    ctx.plan.change(binding.line, f"{name} is created under a condition: prepared {where}")
    if binding.kind in (Kind.MODEL, Kind.OPTIMIZER):
        ctx.plan.review(
            binding.line,
            f"{name} is prepared on its own: with --backend fsdp or deepspeed, models and "
            "optimizers must be prepared in one call",
        )


def _prepare_recreated_optimizers(ctx: Context, scope: Scope) -> None:
    """``optimizer = torch.optim.Adam(model.parameters(), lr=lr)`` again after the prepare call
    (a learning rate decayed by rebuilding the optimizer, a second stage after unfreezing):
    the new optimizer is prepared where it is made, or it would step without the Accelerator
    (no loss-scale unscaling under fp16, no accumulation, not the engine's optimizer). One made
    inside the statement the prepare call follows (each arm of ``if regularize: ... else: ...``
    making its own) is the one that call prepares: prepared again there, it would be prepared
    twice, the first time on its own before its model."""
    for binding in ctx.model.of_kind(Kind.OPTIMIZER):
        anchor = ctx.prepared_after.get(binding.name)
        if binding.scope is not scope or anchor is None:
            continue
        if ctx.model.order(binding.statement) <= ctx.model.order(anchor):
            continue
        if ctx.model.inside(binding.statement, anchor):
            continue
        names = [*_models_built_again_with(ctx, binding), binding.name]
        joined = ", ".join(names)
        ctx.plan.insert_after(
            binding.statement, statement(f"{joined} = {ctx.a('prepare')}({joined})")
        )
        ctx.need(binding.statement)
        where = "it is" if len(names) == 1 else "they are"
        verb = "is" if len(names) == 1 else "are"
        ctx.plan.change(
            binding.line, f"{joined} {verb} created again: prepared where {where} created"
        )


def _models_built_again_with(ctx: Context, optimizer: Binding) -> list[str]:
    """The prepared models the optimizer made again is over that are themselves made again just
    above it in its block (``elif args.arch == "linear": model = nn.Linear(...)``, ``optimizer =
    SGD(model.parameters())``, when the first branch's were prepared): prepared with it, or the
    new model would train unwrapped, each rank on its own."""
    block = ctx.model.parent(optimizer.statement)
    found = []
    for name in sorted(parameter_owners(optimizer)):
        anchor = ctx.prepared_after.get(name)
        if anchor is None:
            continue
        if any(
            model.name == name
            and model.scope is optimizer.scope
            and ctx.model.parent(model.statement) is block
            and ctx.model.order(anchor) < ctx.model.order(model.statement)
            and ctx.model.order(model.statement) < ctx.model.order(optimizer.statement)
            and not ctx.model.inside(model.statement, anchor)
            for model in ctx.model.of_kind(Kind.MODEL)
        ):
            found.append(name)
    return found


def _prepare_each_value(ctx: Context, binding: Binding) -> None:
    """``loaders = {"train": DataLoader(...), ...}``: each loader prepared, the dict kept."""
    name = binding.name
    phases = ctx.facts.phase_loaders.get(name)
    if phases is not None and not phases.decided:
        _leave_undecided_phases_whole(ctx, binding, phases)
        return
    if phases is not None:
        _prepare_trained_phases(ctx, binding, phases)
        return
    taken = names_in_scope(ctx.model, binding.scope)
    key, loader = fresh("key", taken), fresh("loader", taken)
    comprehension = f"{key}: {ctx.a('prepare')}({loader}) for {key}, {loader} in {name}.items()"
    indent = 4 * sum(isinstance(a, cst.IndentedBlock) for a in ctx.model.ancestors(binding.assign))
    code = f"{name} = {{{comprehension}}}"
    if indent + len(code) > 88:
        code = f"{name} = {{\n    {comprehension}\n}}"
    sized = _schedulers_sized_by_the_dict(ctx, binding)
    anchor = sized[0] if sized else binding.statement
    ctx.loader_dicts_prepared_after[name] = anchor
    ctx.plan.insert_after(anchor, statement(code))
    ctx.need(anchor)
    ctx.plan.prepared.append(name)
    if sized:
        ctx.plan.change(
            binding.line,
            f"each loader of {name} prepared after line {ctx.line(anchor)}, where "
            f"{', '.join(sized[1])} has read the whole loaders' length (a prepared scheduler "
            "steps once per rank at each call: it counts the whole set's steps)",
        )
        return
    where = "it is received" if binding.received else "the dict is created"
    ctx.plan.change(binding.line, f"each loader of {name} prepared where {where}")


def _prepare_tuples_handed_on(ctx: Context, scope: Scope) -> None:
    """``Trainer(model, optimizer, make_loaders(cfg))`` in the scope that prepares: the
    constructor keeps the factory's loaders (``self.train_loader, self.val_loader =
    loaders``), which no name of this scope holds. Prepared in the argument,
    ``accelerator.prepare(*make_loaders(cfg))`` (a tuple again, element by element), when
    every one of them may be: one evaluated where no gather fits keeps them all whole (its
    review line says why; the others' loops say they are not prepared)."""
    if ctx.acc.startswith("self."):
        return  # the constructor prepares what it receives
    placement = ctx.facts.placement
    for call in ctx.model.calls:
        if ctx.model.scope_of(call) is not scope:
            continue
        for argument, held in handed_loader_tuple(ctx.model, call) or []:
            names = [b.name for b in held]
            probe = dict.fromkeys(names, Kind.DATALOADER)
            _keep_evaluated_loaders_whole(ctx, probe, {}, scope)
            top = placement.top_statement(call, scope)
            if len(probe) != len(names) or top is None:
                continue
            code = f"{ctx.a('prepare')}(*{ctx.code(argument.value)})"
            made = ctx.plan.replace(
                argument.value,
                lambda _node, code=code: cst.parse_expression(code),
                ctx.line(call),
                f"{', '.join(names)}, the tuple {ctx.code(argument.value.func)}() returns, "  # type: ignore[attr-defined]
                "prepared where it is handed on",
            )
            if not made:
                continue
            ctx.need(top)
            ctx.plan.prepared.extend(names)
            ctx.prepared_arguments.update(names)


def _prepare_each_element(ctx: Context, binding: Binding) -> None:
    """``data = build_data(cfg)`` of a factory returning ``train_loader, val_loader``: its
    loaders prepared together, ``data = accelerator.prepare(*data)`` (a tuple of as many)."""
    name = binding.name
    ctx.plan.insert_after(binding.statement, statement(f"{name} = {ctx.a('prepare')}(*{name})"))
    ctx.need(binding.statement)
    ctx.plan.prepared.append(name)
    ctx.loader_dicts_prepared_after[name] = binding.statement
    factory = dotted(binding.value.func)  # type: ignore[attr-defined]
    ctx.plan.change(
        binding.line,
        f"each loader of {name}, the tuple {factory}() returns, prepared where it is bound",
    )


def _schedulers_sized_by_the_dict(
    ctx: Context, binding: Binding
) -> tuple[cst.CSTNode, list[str]] | None:
    """``loaders = build_loaders(cfg)`` then ``scheduler = build_scheduler(opt,
    len(loaders["train"]))``: schedulers made later in the scope whose arguments read the dict
    (directly or through names bound before them), as `_left_out_schedulers_reading_loaders`
    finds for a loader of its own. Prepared where the dict is made, its loaders would hand
    them one rank's length and the schedule would end N times too soon. The top statement of
    the last of them and their names, when the dict is read in between only by ``len()`` (so
    its loaders can be prepared after them); None when there is none or the dict is used
    (iterated, handed on) before them: those schedulers then read its prepared loaders
    (`_size_schedulers_in_all_ranks_steps`)."""
    placement, model = ctx.facts.placement, ctx.model
    scope = binding.scope
    top = placement.top_statement(binding.statement, scope)
    if top is None:
        return None
    body = placement.body_of(scope)
    start = placement.index(top, scope)
    sized: list[tuple[int, str]] = []
    for scheduler in model.of_kind(Kind.SCHEDULER):
        if scheduler.scope is not scope or scheduler.value is None or _conditional(ctx, scheduler):
            continue
        made = placement.top_statement(scheduler.statement, scope)
        if made is None or placement.index(made, scope) <= start:
            continue
        index = placement.index(made, scope)
        if binding.name in _read_through(ctx, body[:index], scheduler.value):
            sized.append((index, scheduler.name))
    if not sized:
        return None
    last = max(index for index, _ in sized)
    names = sorted({name for _, name in sized})
    for line in body[start + 1 : last + 1]:
        for read in walk(line):
            if (
                isinstance(read, cst.Name)
                and read.value == binding.name
                and not _only_its_length(model, read, line)
            ):
                return None
    return body[last], names


def _only_its_length(model: ScriptModel, read: cst.Name, line: cst.CSTNode) -> bool:
    """``read`` (a loader dict's name) is inside a ``len()`` call's argument in ``line``:
    ``len(loaders["train"])``, ``len(loaders)``."""
    for ancestor in model.ancestors(read):
        if ancestor is line:
            return False
        if isinstance(ancestor, cst.Call) and dotted(ancestor.func) == "len":
            return True
    return False


def _prepare_trained_phases(ctx: Context, binding: Binding, phases: PhaseLoaders) -> None:
    """The phases a ``loaders[phase]`` loop trains on are prepared; those it only evaluates are
    left whole, so every rank evaluates all of them and the phase's totals are the set's."""
    name = binding.name
    code = "\n".join(
        f"{name}[{key!r}] = {ctx.a('prepare')}({name}[{key!r}])".replace("'", '"')
        for key in phases.trained
    )
    ctx.plan.insert_after(binding.statement, statement(code))
    ctx.need(binding.statement)
    ctx.left_whole.add(id(phases.loop.node))
    trained = [entry_name(name, key) for key in phases.trained]
    ctx.plan.prepared.extend(trained)
    ctx.plan.change(
        binding.line,
        f"{', '.join(trained)} prepared where the dict is created (the phase the loop at line "
        f"{ctx.line(phases.loop.node)} trains on)",
    )
    evaluated = ", ".join(entry_name(name, key) for key in phases.evaluated)
    ctx.plan.review(
        ctx.line(phases.loop.node),
        f"{evaluated} is evaluated by this loop, which also trains (its backward runs under "
        f"`if` on {phases.phase}): no gather fits a loop that runs in both modes, so it is left "
        "unprepared and every rank evaluates all of it (correct, not sharded); give evaluation "
        "a loop of its own to shard it and gather there",
    )


def _leave_undecided_phases_whole(ctx: Context, binding: Binding, phases: PhaseLoaders) -> None:
    """A loop that trains or evaluates by a flag, handed ``loaders[phase]`` where the flag's
    value in some phase cannot be told: any loader of the dict may be one it only evaluates,
    whose totals would be one rank's shard's once prepared (and no gather fits such a loop).
    None is prepared: every rank reads all of them, which is correct, not data-parallel."""
    ctx.left_whole.add(id(phases.loop.node))
    ctx.plan.review(
        binding.line,
        f"which loaders of {binding.name} the loop at line {ctx.line(phases.loop.node)} trains "
        f"on, and which it only evaluates, cannot be told (its backward runs under `if` on "
        f"{phases.phase}, whose value per phase is not known): each loader of {binding.name} is "
        "left unprepared, so every rank reads all of them (correct, not data-parallel); to "
        f"shard the training one, hand {phases.phase} as a literal or a test of the phase "
        '(`phase == "train"`), or prepare it and give evaluation a loop of its own',
    )


def _prepare_code(ctx: Context, order: list[str], anchor: cst.CSTNode) -> str:
    """``a, b = accelerator.prepare(a, b)``, wrapped as black wraps it when too long."""
    indent = 4 * sum(isinstance(a, cst.IndentedBlock) for a in ctx.model.ancestors(anchor))
    targets = ", ".join(order)
    call = ctx.a("prepare")
    code = f"{targets} = {call}({targets})"
    if indent + len(code) <= 88:
        return code
    if indent + len(f"{targets} = {call}(") <= 88 and indent + 4 + len(targets) <= 88:
        return f"{targets} = {call}(\n    {targets}\n)"
    one_per_line = "".join(f"    {name},\n" for name in order)
    if indent + 4 + len(targets) <= 88:
        return f"(\n{one_per_line}) = {call}(\n    {targets}\n)"
    return f"(\n{one_per_line}) = {call}(\n{one_per_line})"


def _handed_a_loader_dict(ctx: Context, method: cst.FunctionDef, parameter: str) -> bool:
    """``def fit(self, dataloaders_dict)`` called with ``{"train": DataLoader(...), ...}``:
    ``prepare(dataloaders_dict)`` would hand the dict back untouched (a prepare that does
    nothing), and preparing each value would shard the loaders it only evaluates too."""
    for call, implicit in ctx.facts.flow.calls_of(method):
        for name, argument in bound_arguments(method, call, implicit):
            value = argument.value
            if name != parameter or not isinstance(value, (cst.Name, cst.Attribute)):
                continue
            handed = dotted(value)
            if any(
                b.name == handed and not b.received and is_loader_dict(ctx.model, b)
                for b in ctx.model.bindings
            ):
                return True
    return False


def _prepare_received_loaders(ctx: Context, scope: Scope, chosen: set[str]) -> None:
    """``trainer.fit(train_loader, val_loader)``: a method of the trainer class receives loaders
    the caller never prepared. They are prepared as the method starts, when every call of it
    comes from outside the class and runs once (not in a loop: one called every epoch with the
    same loader would wrap it anew each time); a method also called inside the class
    (``self.evaluate(self.val_loader)``) gets them prepared at the outside call instead
    (``trainer.evaluate(trainer.accelerator.prepare(test_loader))``). Else they stay, and their
    loops get review lines (`data_notes`, `evaluation`)."""
    owner = ctx.facts.placement.class_of(scope)
    flow = ctx.facts.flow
    if owner is None:
        return
    # The loaders a method prepares are its parameters: a caller's variable of the same name
    # (``engine.evaluation(val_loader)`` beside ``def train(self, train_loader, val_loader)``)
    # is another object, still unprepared.
    received_here: set[str] = set()
    for method in ctx.facts.placement.body_of(owner):
        if not isinstance(method, cst.FunctionDef) or method is scope:
            continue
        parameters = [p.name.value for p in method.params.params]
        received = flow.params.get(method, {})
        loaders = [p for p in parameters if received.get(p) is Kind.DATALOADER]
        calls = [call for call, _ in flow.calls_of(method)]
        prepared = (set(ctx.plan.prepared) - received_here) | ctx.model.prepared_names | chosen
        outside = [c for c in calls if not ctx.facts.placement.inside(c, owner)]
        if not calls:
            # constructed by another file of the folder only, once, outside any loop, handed
            # a DataLoader it made there and never prepares (`convert.handed_loaders`)
            handed = ctx.model.given_parameters.get(method, {})
            loaders = [p for p in loaders if p in handed and not handed[p].prepared]
        elif not outside:
            continue
        if not loaders:
            continue
        if len(outside) < len(calls):
            if all(_once_outside(ctx, call, owner) for call in outside):
                at_call = list(loaders)
                _leave_evaluated_whole(ctx, method, at_call, by_caller=True)
                for call in outside:
                    _prepare_at_call(ctx, method, call, set(at_call), prepared)
            continue
        if not all(_once_outside(ctx, call, owner) for call in calls):
            if isinstance(scope, cst.FunctionDef) and scope.name.value == "__init__":
                _prepare_before_loops(ctx, method, calls, loaders, prepared)
            continue
        unprepared = [
            name
            for name in loaders
            if any(o not in prepared for o in flow.origins(name, method.body, stop=prepared))
        ]
        by_hand = _iterated_by_hand(ctx)
        for name in [n for n in unprepared if flow.origins(n, method.body) & set(by_hand)]:
            unprepared.remove(name)
            ctx.plan.review(
                ctx.line(by_hand[next(iter(flow.origins(name, method.body) & set(by_hand)))]),
                f"{name} is read through iter()/next() outside any loop over it, where no "
                "training step is seen: whether it is trained or evaluated is unknown, and "
                "prepared, an evaluation's totals would cover one rank's shard; left "
                "unprepared, so every rank reads all of it (correct, not sharded); iterate it "
                "with a for loop to shard it",
            )
        _leave_evaluated_whole(ctx, method, unprepared)
        body = ctx.facts.placement.body_of(method)
        if not unprepared or not body:
            continue
        first = body[ctx.facts.placement.first_free_index(method)] if body else None
        if first is None:
            continue
        for name in [n for n in unprepared if _handed_a_loader_dict(ctx, method, n)]:
            unprepared.remove(name)
            ctx.plan.review(
                ctx.line(method),
                f"{name} is a dict of DataLoaders {method.name.value}() receives: prepare hands "
                "a dict back untouched, and which of its loaders are trained and which only "
                "evaluated is not followed through the calls made with its values, so it is "
                "left unprepared and every rank reads all of it (correct, not data-parallel); "
                "prepare the training loader where the dict is made",
            )
        if not unprepared:
            continue
        targets = ", ".join(unprepared)
        code = f"{targets} = {ctx.a('prepare')}({targets})"
        ctx.plan.insert_before(first, statement(code))
        ctx.need(first)
        received_here.update(n for n in unprepared if n not in ctx.plan.prepared)
        ctx.plan.prepared.extend(unprepared)
        # ``self.test_loader = test_loader`` below the prepare call keeps the prepared object:
        # the other methods' loops over the attribute read it sharded (their evaluation is
        # gathered, their training loop needs no review line).
        kept = attributes_kept(ctx.model, method)
        ctx.prepared_arguments.update(kept[n] for n in unprepared if n in kept)
        ctx.received_preparations.append((owner, method, list(unprepared), kept))
        handed = ctx.model.given_parameters.get(method, {}) if not calls else {}
        sites = sorted({handed[n].where for n in unprepared if n in handed})
        ctx.plan.change(
            ctx.line(method),
            f"{method.name.value}() prepares the loaders it receives: {targets}"
            + (f" (handed by {', '.join(sites)})" if sites else ""),
        )


def _leave_evaluated_whole(
    ctx: Context, method: cst.FunctionDef, unprepared: list[str], *, by_caller: bool = False
) -> None:
    """Of the loaders ``method`` receives and would prepare, those read only by evaluations the
    conversion leaves as they are (``validation_score += self._compute_loss(batch).item()``,
    the forward in a helper method) are taken out of ``unprepared``: as where loaders are made
    (`_evaluated_unsure`), every rank evaluates all of it, and what is printed or decided on
    its totals is the whole set's. ``by_caller`` names a loader in the review as its callers
    do (``engine.evaluation(valLoader)``), for a loader that would be prepared at their call."""
    flow = ctx.facts.flow
    origins = {name: flow.origins(name, method.body) - {None} for name in unprepared}
    shared = ctx.facts.shared_loop_evaluations
    for name in list(unprepared):
        if not origins[name] or not origins[name] <= set(shared):
            continue
        # ``fit(train_loader, val_loader)`` evaluating ``val_loader`` through a loop that
        # also trains: prepared here, its totals would be one rank's shard
        unprepared.remove(name)
        origin = sorted(origins[name])[0]
        _review_shared_evaluation(ctx, origin if by_caller else name, shared[origin])
    candidates = {o: Kind.DATALOADER for found in origins.values() for o in found}
    unsure = _evaluated_unsure(ctx, dict(candidates))  # type: ignore[arg-type]
    for name in list(unprepared):
        if not origins[name] or not origins[name] <= set(unsure):
            continue
        evaluation = unsure[next(iter(origins[name]))]
        unprepared.remove(name)
        ctx.left_whole.add(id(evaluation.loop.node))
        shown, it = _left_whole_words(
            ctx, evaluation, sorted(origins[name]) if by_caller else [name]
        )
        advice = _sharding_advice(ctx, evaluation)
        ctx.plan.review(
            ctx.line(evaluation.line_node),
            f"evaluation left as is: {evaluation.unsure}; {shown} (correct, not sharded); to "
            f"shard {it}, {advice}",
        )


def _left_whole_words(ctx: Context, evaluation: Evaluation, names: list[str]) -> tuple[str, str]:
    """``test_loader and val_loader are left unprepared, so ...`` and its pronoun: every
    loader no training loop reads that reaches the evaluation's loop, whichever method's
    parameter it is said for, so that the two methods it passes through (``fit(val_loader)``
    calling ``self.evaluate(loader)``, and ``evaluate`` handed ``test_loader`` by ``main``)
    say one line, not two that overlap (trial24 lit2: "test_loader, val_loader is left
    unprepared" beside "val_loader is left unprepared")."""
    rows = set(ctx.facts.flow.row_loaders_unknown(evaluation.loop))
    reaching = sorted(rows or _loader_origins(ctx, evaluation.loop) - _trained_loaders(ctx))
    names = reaching if set(names) <= set(reaching) else names
    if len(names) == 1:
        return f"{names[0]} is left unprepared, so every rank evaluates all of it", "it"
    listed = f"{', '.join(names[:-1])} and {names[-1]}"
    return f"{listed} are left unprepared, so every rank evaluates all of them", "them"


def _prepare_at_call(
    ctx: Context, method: cst.FunctionDef, call: cst.Call, loaders: set[str], prepared: set[str]
) -> None:
    """``trainer.evaluate(test_loader)`` -> ``trainer.evaluate(trainer.accelerator.prepare(
    test_loader))``, for each loader argument no ``prepare`` took."""
    func = call.func
    receiver = dotted(func.value) if isinstance(func, cst.Attribute) else None
    if receiver is None or receiver.startswith("self"):
        return
    flow = ctx.facts.flow
    for parameter, argument in bound_arguments(method, call, 1):
        value = argument.value
        if parameter not in loaders or not isinstance(value, cst.Name):
            continue
        if all(o in prepared for o in flow.origins(value.value, call, stop=prepared)):
            continue
        through = ctx.facts.shared_loop_evaluations.get(value.value)
        if through is not None and through.call is call:
            # ``trainer.run_epoch(test_loader)`` with training off, through the loop that also
            # trains: no gather fits there, so the loader stays whole on every rank
            _review_shared_evaluation(ctx, value.value, through)
            continue
        code = f"{receiver}.accelerator.prepare({value.value})"
        ctx.plan.replace(
            value,
            lambda _node, code=code: cst.parse_expression(code),
            ctx.line(call),
            f"{value.value} prepared where it is handed to {method.name.value}()",
            anywhere=True,
        )
        ctx.prepared_arguments.add(value.value)


def _prepare_before_loops(
    ctx: Context,
    method: cst.FunctionDef,
    calls: list[cst.Call],
    loaders: list[str],
    prepared: set[str],
) -> None:
    """``for epoch in ...: trainer.train_epoch(train_loader)``: the method is called every
    epoch, so preparing what it receives there would wrap the loader anew each time. The
    caller's loaders are prepared once instead, right before the loop, through the instance
    (``train_loader = trainer.accelerator.prepare(train_loader)``; the instance has it, made
    in its constructor): when every call is made on
    a name the caller bound before that loop, with loaders that are plain names the loop does
    not rebind. A call outside any loop gets its loader prepared where it is handed over, unless
    that loader was prepared before an earlier loop. Otherwise nothing changes here (their loops
    get review lines)."""
    at_call = list(loaders)
    _leave_evaluated_whole(ctx, method, at_call, by_caller=True)
    flow = ctx.facts.flow
    planned: dict[tuple[int, str], tuple[cst.CSTNode, list[str]]] = {}
    dicts: dict[tuple[int, str], tuple[cst.CSTNode, list[Binding]]] = {}
    single: list[cst.Call] = []
    for call in calls:
        func = call.func
        receiver = dotted(func.value) if isinstance(func, cst.Attribute) else None
        if receiver is None or "." in receiver or receiver == "self":
            return
        top = _outermost_loop(ctx, call)
        if top is None:
            single.append(call)
            continue
        if not _bound_before(ctx, receiver, top):
            return
        for parameter, argument in bound_arguments(method, call, 1):
            value = argument.value
            if parameter not in at_call:
                continue
            held = _loader_dict_of_entry(ctx, value, call)
            if held is not None:  # ``engine.train_one_epoch(loaders["train"], epoch)``
                if assigns(top, held.name):
                    return
                if held.name not in ctx.prepared_arguments:
                    found = dicts.setdefault((id(top), receiver), (top, []))[1]
                    if held not in found:
                        found.append(held)
                continue
            if not isinstance(value, cst.Name) or assigns(top, value.value):
                return
            if all(o in prepared for o in flow.origins(value.value, call, stop=prepared)):
                continue
            names = planned.setdefault((id(top), receiver), (top, []))[1]
            if value.value not in names:
                names.append(value.value)
    for (_, receiver), (top, names) in planned.items():
        them = "it" if len(names) == 1 else "them"
        _prepare_before(
            ctx, top, receiver, names, f"hands {them} to {method.name.value}() on every pass"
        )
    for (_, receiver), (top, held) in dicts.items():
        for binding in held:
            if binding.name in ctx.prepared_arguments or _dict_evaluated_unsure(ctx, binding):
                continue
            loop = f"hands its loaders to {method.name.value}() on every pass"
            _prepare_dict_before(ctx, top, receiver, binding, loop)
    for call in single:
        earlier = {
            name
            for top, names in planned.values()
            if ctx.model.scope_of(top) is ctx.model.scope_of(call)
            and ctx.model.order(top) < ctx.model.order(call)
            for name in names
        }
        _prepare_at_call(ctx, method, call, set(at_call), prepared | earlier)


def _prepare_before(
    ctx: Context, top: cst.CSTNode, holder: str, names: list[str], loop: str
) -> None:
    """``names = holder.accelerator.prepare(names)`` inserted before the statement ``top``
    (the outermost loop that uses them), its review line saying what that loop does."""
    targets = ", ".join(names)
    ctx.plan.add(
        InsertBefore(top, statement(f"{targets} = {holder}.accelerator.prepare({targets})")),
        line=ctx.line(top),
        text=f"{targets} prepared once before the loop that {loop}",
        anywhere=True,
    )
    ctx.prepared_arguments.update(names)
    for name in names:
        ctx.prepared_before.setdefault(name, []).append(top)


def _loader_dict_of_entry(
    ctx: Context, value: cst.BaseExpression, call: cst.Call
) -> Binding | None:
    """The dict of DataLoaders whose entry ``value`` is (``loaders["train"]``, a string key of
    a plain name): bound once in the function of ``call``, made there (or by a factory, of the
    file or of another module of the project: `objects.is_loader_dict`), not under a branch
    that may not run."""
    if not (
        isinstance(value, cst.Subscript)
        and isinstance(value.value, cst.Name)
        and len(value.slice) == 1
        and isinstance(value.slice[0].slice, cst.Index)
        and isinstance(value.slice[0].slice.value, cst.SimpleString)
    ):
        return None
    name = value.value.value
    function = ctx.facts.placement.enclosing_function(call)
    bound = [b for b in ctx.model.bindings if b.name == name and b.scope is function]
    if len(bound) != 1 or len(ctx.model.index.assignments_to(name)) != 1:
        return None
    binding = bound[0]
    if binding.received or _conditional(ctx, binding) or not is_loader_dict(ctx.model, binding):
        return None
    return binding


def _prepare_dict_before(
    ctx: Context, top: cst.CSTNode, holder: str, binding: Binding, loop: str
) -> None:
    """``loaders = {key: holder.accelerator.prepare(loader) for key, loader in
    loaders.items()}`` inserted before the statement ``top`` (the outermost loop that hands
    the dict's entries to the instance's methods): ``prepare`` hands a dict back untouched, so
    each of its loaders is prepared, the dict kept; its loops, in the methods, read them
    sharded (an evaluation there gathered)."""
    name = binding.name
    taken = names_in_scope(ctx.model, binding.scope)
    key, loader = fresh("key", taken), fresh("loader", taken)
    comprehension = (
        f"{key}: {holder}.accelerator.prepare({loader}) for {key}, {loader} in {name}.items()"
    )
    indent = 4 * sum(isinstance(a, cst.IndentedBlock) for a in ctx.model.ancestors(top))
    code = f"{name} = {{{comprehension}}}"
    if indent + len(code) > 88:
        code = f"{name} = {{\n    {comprehension}\n}}"
    ctx.plan.add(
        InsertBefore(top, statement(code)),
        line=ctx.line(top),
        text=f"each loader of {name} prepared once before the loop that {loop}",
        anywhere=True,
    )
    ctx.prepared_arguments.add(name)


def _prepare_step_driven_loaders(ctx: Context) -> None:
    """``for x, y in train_loader: trainer.train_step(x, y)`` in ``main()``, where the trainer's
    constructor makes the accelerator: the runner's loader is prepared once, through the
    instance, before the outermost loop that reads it (``train_loader =
    trainer.accelerator.prepare(train_loader)``). Only a loader made by a DataLoader call in the
    runner's own function, read there by nothing but this loop (a ``len()`` or another loop
    would see the shard too), with the instance bound before that loop; else the loop keeps its
    review line (`data_notes`)."""
    owner = ctx.facts.placement.class_of(ctx.prepare_anchor)
    if owner is None:
        return
    graph = ctx.facts.calls
    for loop, step in ctx.facts.step_driven_loops:
        if graph.owner(step) is None or not graph.is_or_derives(graph.owner(step), owner):
            continue
        instance = ctx.instance_outside_class(loop.node)
        function = ctx.facts.placement.enclosing_function(loop.node)
        if instance is None or function is None:
            continue
        trains = f"trains through {owner.name.value}.{step.name.value}()"
        _prepare_loop_loaders_through(ctx, loop, instance, function, trains, say_only=True)


def _prepare_loaders_of_loops_training_an_instance(ctx: Context) -> None:
    """``for x, y in loader: ... obj.model(x) ... loss.backward(); obj.optimizer.step()`` in
    ``main()``, where ``obj``'s class builds and prepares the model and the optimizer: the
    loop's loader is prepared once, through the instance, before the outermost loop that reads
    it (``loader = obj.accelerator.prepare(loader)``). The same conditions as a step-driven
    loop's (`_prepare_step_driven_loaders`): a DataLoader made in that function, read there by
    nothing but this loop; the loop reads one of the objects the class prepares."""
    owner = ctx.facts.placement.class_of(ctx.prepare_anchor)
    if owner is None:
        return
    prepared = {n.split(".", 1)[1] for n in ctx.plan.prepared if n.startswith("self.")}
    for loop in ctx.model.loops:
        if not loop.trains or ctx.facts.placement.inside(loop.node, owner):
            continue
        instance = ctx.instance_outside_class(loop.node)
        function = ctx.facts.placement.enclosing_function(loop.node)
        if instance is None or function is None:
            continue
        read = {dotted(node) for node in walk(loop.node.body) if isinstance(node, cst.Attribute)}
        if not any(f"{instance}.{name}" in read for name in prepared):
            continue  # it trains something else than what the class prepares
        trains = f"trains {instance}'s prepared objects"
        _prepare_loop_loaders_through(ctx, loop, instance, function, trains)


def _prepare_loop_loaders_through(
    ctx: Context,
    loop: Loop,
    instance: str,
    function: cst.FunctionDef,
    trains: str,
    say_only: bool = False,
) -> None:
    """Prepare ``loop``'s unprepared DataLoaders through ``instance``'s accelerator, once,
    before the outermost loop around it: only loaders made in ``function`` and read there by
    nothing but this loop (or by what runs before that outermost loop, which the prepare's
    rebinding leaves the loader as made), where ``instance`` is bound before that loop and not
    rebound in it. ``say_only``: the summary says that loop is the only reader."""
    top = _outermost_loop_of(ctx, loop.node, function)
    names = [
        name
        for name in ctx.unprepared_loaders(loop)
        if name is not None
        and name not in ctx.facts.shared_loop_evaluations
        and name not in ctx.facts.phase_loaders
    ]
    if not names or not _bound_before(ctx, instance, top) or assigns(top, instance):
        return
    if not all(_only_read_by(ctx, name, function, loop, top) for name in names):
        return
    earlier = sorted(
        {
            ctx.line(node)
            for name in names
            for node in walk(function)
            if isinstance(node, cst.Name)
            and node.value == name
            and not _binds_name(ctx, node)
            and _read_before(ctx, node, function, top)
        }
    )
    if earlier:  # ``for x, y in train_loader:`` training the teacher before it, as made
        shown = ", ".join(map(str, earlier))
        lines, reads = ("line", "reads") if len(earlier) == 1 else ("lines", "read")
        trains += f" (read after it by that loop only; {lines} {shown}, before it, {reads} it"
        trains += " as made)"
    elif say_only:
        trains += " (read by that loop only)"
    _prepare_before(ctx, top, instance, names, trains)


def _prepare_property_loaders(ctx: Context) -> None:
    """``@property def train_loader(self): return DataLoader(...)`` read by the training loop of
    the class that owns the accelerator: built at each read, no binding holds it, so nothing
    prepares it. Where building it once reads the same data (its method takes nothing but
    ``self`` and reads attributes only the constructor sets, calls no method of the class, and
    every read of it is a training loop's iterable), it becomes a ``cached_property`` that
    returns the prepared loader: built and prepared at the first read, after the constructor. A
    DataLoader's shuffle draws its order from the global generator at each pass, not when it
    is made, so one loader read every epoch shuffles as a new one each epoch did. Else the
    loop keeps its review line (`data_notes`)."""
    owner = ctx.facts.placement.class_of(ctx.prepare_anchor)
    if owner is None or _has_slots(owner):
        return
    done: set[str] = set()
    for loop in ctx.model.loops:
        name = loop.iterable
        if not loop.trains or name is None or name in done:
            continue
        method = loader_property(ctx.model, name, loop.node)
        if method is None or ctx.facts.calls.owner(method) is not owner:
            continue
        done.add(name)
        returned = _built_once(ctx, owner, method, name)
        if returned is None:
            continue
        decorator = next(
            d for d in method.decorators if dotted(d.decorator) in ("property", *_CACHED)
        )
        if dotted(decorator.decorator) == "property":
            cached = _cached_property_name(ctx)
            ctx.plan.replace(
                decorator.decorator,
                lambda _node, code=cached: cst.parse_expression(code),
                anywhere=True,
            )
        ctx.plan.replace(
            returned,
            lambda node: cst.parse_expression("self.accelerator.prepare(x)").with_changes(
                args=[cst.Arg(node)]
            ),
            ctx.line(method),
            f"{name} is a property that builds a DataLoader from what the constructor sets: "
            "made a cached_property that returns it prepared, built once at the first read",
            anywhere=True,
        )
        ctx.prepared_arguments.add(name)


_CACHED = ("cached_property", "functools.cached_property")


def _has_slots(owner: cst.ClassDef) -> bool:
    return any(
        isinstance(n, cst.AssignTarget) and dotted(n.target) == "__slots__" for n in walk(owner)
    )


def _built_once(
    ctx: Context, owner: cst.ClassDef, method: cst.FunctionDef, name: str
) -> cst.BaseExpression | None:
    """The DataLoader ``method`` returns, when building it once is the same as building it at
    each read (see `_prepare_property_loaders`): ``method`` takes ``self`` only, returns once,
    calls no method of the class, and reads no free name but ``self``, an import, a builtin or
    a module constant (a name bound once, to a literal, and never written again). No write
    anywhere in the file outside the class's constructor and the property itself (an
    assignment, augmented or annotated one, a ``for`` or ``with ... as`` target, a walrus, a
    ``del``, a mutating method call such as ``append``, or ``setattr``) reaches what it reads:
    a written path overlaps a read one (``self.cfg`` and ``self.cfg.batch_size``), compared
    after the root so an alias of the instance (``trainer.cfg.batch_size *= 2``) counts too.
    Every other read of the property is a training loop's iterable."""
    params = method.params
    if (
        len(params.params) != 1
        or params.star_arg is not cst.MaybeSentinel.DEFAULT
        or params.kwonly_params
        or params.star_kwarg is not None
        or len(method.decorators) != 1
    ):
        return None
    returns = [n for n in walk(method) if isinstance(n, cst.Return)]
    if len(returns) != 1 or returns[0].value is None:
        return None
    value = returns[0].value
    if isinstance(value, cst.Call) and (dotted(value.func) or "").endswith(".prepare"):
        return None
    for node in walk(method):
        if isinstance(node, cst.Call) and (dotted(node.func) or "").startswith("self."):
            return None  # a method of the class: what it does at each read is not followed
    read = _property_reads(ctx, method)
    if read is None:
        return None
    constructor = next(
        (
            s
            for s in owner.body.body
            if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"
        ),
        None,
    )
    for target, node in _written_paths(ctx.model.module):
        if ctx.facts.placement.inside(node, method):
            continue  # a local of the property itself
        if constructor is not None and ctx.facts.placement.inside(node, constructor):
            continue  # what the constructor sets: read after it
        if any(_overlaps(target, path) for path in read):
            return None  # changed after the constructor: a new read would see the change
    attribute = name.split(".", 1)[1]
    trained = {id(loop.node) for loop in ctx.model.loops if loop.trains and loop.iterable == name}
    for node in walk(ctx.model.module):
        if not (isinstance(node, cst.Attribute) and node.attr.value == attribute):
            continue
        if node is method.name:
            continue
        if not any(
            id(a) in trained and ctx.facts.placement.inside(node, a.iter)  # type: ignore[attr-defined]
            for a in ctx.model.ancestors(node)
            if isinstance(a, cst.For)
        ):
            return None  # read elsewhere too (a len(), an evaluation): left as it is
    return value


_CONSTANT_LITERALS = (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString)


def _property_reads(ctx: Context, method: cst.FunctionDef) -> set[str] | None:
    """The paths ``method`` reads (``self.cfg.batch_size``, ``self.x``), each with its
    prefixes; None when it reads a free name that is not ``self``, an import, a builtin or a
    module constant (what the module binds may change between reads)."""
    local = {"self"}
    for node in walk(method.body):
        if isinstance(node, BINDS):
            local |= target_names(node.target)
        elif isinstance(node, cst.WithItem) and node.asname is not None:
            local |= target_names(node.asname.name)
    constants = _module_constants(ctx.model.module)
    read: set[str] = set()
    for node in walk(method.body):
        if isinstance(node, cst.Attribute) and (path := dotted(node)) is not None:
            parts = path.split(".")
            read.update(".".join(parts[:i]) for i in range(2, len(parts) + 1))
        if not isinstance(node, cst.Name):
            continue
        parent = ctx.model.parent(node)
        if isinstance(parent, cst.Attribute) and parent.attr is node:
            continue
        if isinstance(parent, cst.Arg) and parent.keyword is node:
            continue
        value = node.value
        if value in local or value in ctx.model.imports.bound or value in constants:
            continue
        if value in ("True", "False", "None") or hasattr(builtins, value):
            continue
        return None  # a module global or a name bound elsewhere: may change between reads
    return {path for path in read if path.startswith("self.")}


def _module_constants(module: cst.Module) -> set[str]:
    """Module names bound once, at the top level, to a literal, and never written again."""
    bound: dict[str, int] = {}
    literal: set[str] = set()
    for target, node in _written_paths(module):
        bound[target] = bound.get(target, 0) + 1
        if (
            isinstance(node, cst.Assign)
            and isinstance(node.value, _CONSTANT_LITERALS)
            and len(node.targets) == 1
            and isinstance(node.targets[0].target, cst.Name)
        ):
            literal.add(target)
    top = {
        t.target.value
        for s in module.body
        if isinstance(s, cst.SimpleStatementLine)
        for a in s.body
        if isinstance(a, cst.Assign)
        for t in a.targets
        if isinstance(t.target, cst.Name)
    }
    return {name for name in literal & top if bound[name] == 1}


def _written_paths(module: cst.Module) -> list[tuple[str, cst.CSTNode]]:
    """Each path written in ``module`` (``self.cfg.batch_size``, ``BATCH`` for ``BATCH[0]``)
    with the node that writes it: assignments of every kind, loop, ``with`` and comprehension
    targets, walruses, ``del``, mutating method calls and ``setattr``."""
    found: list[tuple[str, cst.CSTNode]] = []

    def add(target: cst.BaseExpression, node: cst.CSTNode) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                add(element.value, node)
            return
        if isinstance(target, cst.StarredElement):
            add(target.value, node)
            return
        while isinstance(target, cst.Subscript):
            target = target.value
        path = dotted(target)
        if path is not None:
            found.append((path, node))

    for node in walk(module):
        if isinstance(node, cst.Assign):
            for t in node.targets:
                add(t.target, node)
        elif isinstance(node, BINDS) and not isinstance(node, cst.AssignTarget):
            add(node.target, node)  # an Assign's targets: above
        elif isinstance(node, cst.WithItem) and node.asname is not None:
            add(node.asname.name, node)
        elif isinstance(node, cst.Del):
            add(node.target, node)
        elif isinstance(node, cst.Call):
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value in MUTATORS:
                add(func.value, node)
            elif dotted(func) in ("setattr", "delattr") and node.args:
                add(node.args[0].value, node)
    return found


def _overlaps(written: str, read: str) -> bool:
    """Writing ``written`` may change what reading ``read`` sees: one is a prefix of the
    other. Both are compared after their root too, so another name of the instance
    (``trainer.cfg``) meets ``self.cfg``; a bare name written meets only itself."""
    if written == read or read.startswith(written + ".") or written.startswith(read + "."):
        return True
    if "." not in written:
        return False
    written_tail, read_tail = written.split(".", 1)[1], read.split(".", 1)[1]
    return (
        written_tail == read_tail
        or read_tail.startswith(written_tail + ".")
        or written_tail.startswith(read_tail + ".")
    )


def _cached_property_name(ctx: Context) -> str:
    """``cached_property`` imported from functools for the edit, or how the script names it."""
    for bound, qualified in ctx.model.imports.bound.items():
        if qualified == "functools.cached_property":
            return bound
        if qualified == "functools":
            return f"{bound}.cached_property"
    ctx.extra_imports.append("from functools import cached_property")
    return "cached_property"


def _outermost_loop_of(ctx: Context, node: cst.CSTNode, function: cst.FunctionDef) -> cst.CSTNode:
    """The outermost ``for``/``while`` of ``function`` around ``node``, or ``node``'s own
    statement."""
    top: cst.CSTNode = node
    for ancestor in ctx.model.ancestors(node):
        if ancestor is function:
            break
        if isinstance(ancestor, (cst.For, cst.While)):
            top = ancestor
    if top is node and not isinstance(node, (cst.For, cst.While)):
        statement_node = ctx.facts.placement.top_statement(node, function)
        return statement_node if statement_node is not None else node
    return top


def _only_read_by(
    ctx: Context, name: str, function: cst.FunctionDef, loop: Loop, top: cst.CSTNode
) -> bool:
    """``name`` is a local of ``function`` made once by a DataLoader call before ``top``, not
    rebound, and read nowhere in the function but as ``loop``'s iterable, or before ``top``
    (a teacher trained on it first, in ``main()`` where no accelerator exists yet): the prepare
    inserted before ``top`` rebinds the name there, so what runs before still reads the loader
    as made. A read in a nested function or lambda may run at any time: it counts."""
    if "." in name:
        return False
    made = [b for b in ctx.model.bindings if b.name == name and b.scope is function]
    if len(made) != 1 or made[0].kind is not Kind.DATALOADER or made[0].received:
        return False
    if _conditional(ctx, made[0]) or ctx.model.order(made[0].statement) > ctx.model.order(top):
        return False
    if (
        sum(1 for a in ctx.model.index.assignments_to(name) if ctx.model.scope_of(a) is function)
        != 1
    ):
        return False
    iterable = loop.node.iter if isinstance(loop.node, cst.For) else loop.node.for_in.iter  # type: ignore[union-attr]
    reads = [
        node
        for node in walk(function)
        if isinstance(node, cst.Name) and node.value == name and not _binds_name(ctx, node)
    ]
    return bool(reads) and all(
        ctx.facts.placement.inside(node, iterable) or _read_before(ctx, node, function, top)
        for node in reads
    )


def _read_before(
    ctx: Context, node: cst.CSTNode, function: cst.FunctionDef, top: cst.CSTNode
) -> bool:
    """``node`` is what a ``for`` loop of ``function`` iterates (``for x, y in train_loader:``,
    ``enumerate(train_loader)``) and runs before ``top`` each time ``function`` runs: earlier in
    its own body, not in a nested function, lambda or class (whose code may run later). Another
    read (``n = len(train_loader)``) may keep a value the loop after ``top`` uses with the
    shard (a sum over it divided by the whole length): it does not count."""
    if ctx.model.order(node) >= ctx.model.order(top) or ctx.facts.placement.inside(node, top):
        return False
    iterated = False
    for ancestor in ctx.model.ancestors(node):
        if ancestor is function:
            return iterated
        if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef, *_COMPREHENSIONS)):
            return False
        if isinstance(ancestor, cst.For) and ctx.facts.placement.inside(node, ancestor.iter):
            iterated = True
    return False


def _binds_name(ctx: Context, node: cst.Name) -> bool:
    parent = ctx.model.parent(node)
    return isinstance(parent, cst.AssignTarget) and parent.target is node


def _outermost_loop(ctx: Context, call: cst.Call) -> cst.CSTNode | None:
    """The outermost ``for``/``while`` around ``call`` in its function (None: not in a loop,
    or in a lambda, whose body runs who knows when)."""
    function = ctx.facts.placement.enclosing_function(call)
    top = None
    for ancestor in ctx.model.ancestors(call):
        if ancestor is function:
            break
        if isinstance(ancestor, cst.Lambda):
            return None
        if isinstance(ancestor, (cst.For, cst.While)):
            top = ancestor
    return top


def _bound_before(ctx: Context, name: str, statement_node: cst.CSTNode) -> bool:
    scope = ctx.model.scope_of(statement_node)
    return any(
        ctx.model.scope_of(a) is scope and ctx.model.order(a) < ctx.model.order(statement_node)
        for a in ctx.model.index.assignments_to(name)
    )


def _once_outside(ctx: Context, call: cst.Call, owner: cst.ClassDef) -> bool:
    """``call`` is made outside ``owner`` and not inside a loop of its function."""
    placement = ctx.facts.placement
    if placement.inside(call, owner):
        return False
    function = placement.enclosing_function(call)
    for ancestor in ctx.model.ancestors(call):
        if ancestor is function:
            break
        if isinstance(ancestor, (cst.For, cst.While, cst.Lambda)):
            return False
    return True


_COMPREHENSIONS = (cst.GeneratorExp, cst.ListComp, cst.SetComp, cst.DictComp)


def _comprehension_evaluations(ctx: Context) -> dict[str, cst.CSTNode]:
    """``sum((model(x).argmax(1) == y).sum().item() for x, y in val_loader)``: a loader a
    comprehension reads and runs a model over, by the name it was made under (followed back
    through the helpers' parameters), with the comprehension. The model may run in a function
    of the file the comprehension calls (``[eval_step(x, y) for x, y in val_loader]``), one
    that does not train, or be one the analysis does not know, under ``torch.no_grad()`` (an
    EMA copy). A loop that draws a loader's batches with ``next()`` and evaluates counts too
    (`inline_evaluations`): it maps to that loop."""
    flow = ctx.facts.flow
    found: dict[str, cst.CSTNode] = {}
    for node in ctx.facts.placement.all_nodes():
        if isinstance(node, cst.Call) and _maps_the_model(ctx, node):
            for argument in node.args[1:]:
                name = loop_source(argument.value)
                if flow.kind_of(name, node) is Kind.DATALOADER:
                    for origin in flow.origins(name, node):
                        if origin is not None:
                            found.setdefault(origin, node)
            continue
        if not isinstance(node, _COMPREHENSIONS):
            continue
        if not any(
            isinstance(n, cst.Call) and _runs_the_model(ctx, n) for n in walk(node)
        ) and not computes_without_grad(ctx.facts, node):
            continue
        for_in: cst.CompFor | None = node.for_in
        while for_in is not None:
            name = loop_source(for_in.iter)
            if flow.kind_of(name, node) is Kind.DATALOADER:
                for origin in flow.origins(name, node):
                    if origin is not None:
                        found.setdefault(origin, node)
            for_in = for_in.inner_for_in
    for loader, call, loop in drawn_evaluations(ctx.facts):
        for origin in flow.origins(loader, call):
            if origin is not None:
                found.setdefault(origin, loop)
    return found


def _maps_the_model(ctx: Context, call: cst.Call) -> bool:
    """``map(lambda b: score_batch(model, b), val_loader)``, ``map(eval_step, val_loader)``:
    an evaluation as a comprehension is, spelled with the builtin ``map``, whose function runs
    the model (a lambda whose body does, or a function of the file that does)."""
    if not call.args or "map" not in ctx.model.qualified(call.func) | {dotted(call.func)}:
        return False
    mapped = call.args[0].value
    if isinstance(mapped, cst.Lambda):
        return any(
            isinstance(n, cst.Call) and _runs_the_model(ctx, n) for n in walk(mapped)
        ) or computes_without_grad(ctx.facts, mapped)
    function = _function_named(ctx, mapped, call)
    if function is None:
        return False
    calls = [n for n in walk(function.body) if isinstance(n, cst.Call)]
    return any(ctx.facts.flow.is_forward(n) for n in calls) and not any(
        ctx.facts.placement.inside(b, function) for b in ctx.model.backward_calls
    )


def _runs_the_model(ctx: Context, call: cst.Call) -> bool:
    """A forward pass, or a call of a function of the file that runs one and no backward."""
    flow = ctx.facts.flow
    if flow.is_forward(call):
        return True
    for function in ctx.facts.calls.targets(call):
        inside = [n for n in walk(function.body) if isinstance(n, cst.Call)]
        if any(flow.is_forward(n) for n in inside) and not any(
            ctx.facts.placement.inside(b, function) for b in ctx.model.backward_calls
        ):
            return True
    return False


def _leave_whole(
    ctx: Context, chosen: dict[str, Kind], created: dict[str, int], name: str, loop: cst.CSTNode
) -> None:
    """``name`` stays unprepared, and the loop that reads it gathers nothing: every rank reads
    all of it."""
    chosen.pop(name)
    created.pop(name, None)
    ctx.left_whole.add(id(loop))


def _evaluated_out_of_reach(ctx: Context, chosen: dict[str, Kind]) -> dict[str, cst.CSTNode]:
    """Loaders of ``chosen`` that an evaluation loop reads where ``self.accelerator`` cannot be
    reached (an ``Evaluator`` class the trainer hands its ``self.val_loader``), by name, with
    the loop: prepared, the loop's totals would cover one rank's shard with no gather to fix
    them, and whatever is decided on them (an early stop, a best checkpoint) would differ
    between ranks. A loader some training loop also reads is not among them."""
    found: dict[str, cst.CSTNode] = {}
    trained = _trained_loaders(ctx)
    for evaluation in ctx.facts.evaluations:
        loop = evaluation.loop
        if evaluation.already_gathered or not evaluation.sinks or ctx.plan.reaches(loop.node):
            continue
        if handed_accelerator.calls_to_pass(ctx, loop.node) is not None:
            continue  # a module-level helper every caller can hand the accelerator to
        for name in sorted(_loader_origins(ctx, loop) - trained):
            if chosen.get(name) is Kind.DATALOADER:
                found.setdefault(name, loop.node)
    return found


def _evaluated_unsure(ctx: Context, chosen: dict[str, Kind]) -> dict[str, Evaluation]:
    """Loaders of ``chosen`` read only by evaluations the conversion leaves as they are (a
    record taken before the forward pass, a per-batch loss): prepared, each rank's totals would
    cover its own shard, and what is printed or decided on them would be one rank's. A loader
    some training loop also reads is not among them: its shard is what that rank trains on."""
    trained = _trained_loaders(ctx)
    blocks = _main_only_write_blocks(ctx)
    found: dict[str, Evaluation] = {}
    for evaluation in ctx.facts.evaluations:
        if evaluation.unsure is None or evaluation.already_gathered or not evaluation.sinks:
            continue
        if evaluation.syncs_itself or id(evaluation.loop.node) in ctx.facts.helper_evaluations:
            continue  # a helper gathers for it, or whole sets would be counted N times
        if _block_holding(ctx, blocks, evaluation.loop) is not None:
            continue  # on the main process alone: `_read_where_written` keeps its loader whole
        rows = ctx.facts.flow.row_loaders_unknown(evaluation.loop)
        # a row the conversion cannot follow may hand this loop the loader a training loop
        # reads too: prepared, either could be evaluated by its shard here
        for name in sorted(set(rows) or _loader_origins(ctx, evaluation.loop) - trained):
            if chosen.get(name) is Kind.DATALOADER:
                found.setdefault(name, evaluation)
    return found


def _dict_evaluated_unsure(ctx: Context, binding: Binding) -> bool:
    """``loaders = {"val": DataLoader(...), "test": ...}`` read (``for name, loader in
    loaders.items()``) by an evaluation the conversion leaves as it is, and by no training loop:
    as `_evaluated_unsure` keeps such a loader whole, each loader of the dict stays unprepared
    (which one a loop reads is not known, so none is sharded), with a review line; prepared, the
    loop would print one rank's shard's numbers. True when it is left so."""
    found = _evaluated_unsure(ctx, {binding.name: Kind.DATALOADER}).get(binding.name)
    if found is None:
        return False
    for evaluation in ctx.facts.evaluations:
        if evaluation.unsure is not None and binding.name in _loader_origins(ctx, evaluation.loop):
            ctx.left_whole.add(id(evaluation.loop.node))
    advice = _sharding_advice(ctx, found)
    ctx.plan.review(
        ctx.line(found.line_node),
        f"evaluation left as is: {found.unsure}; each loader of {binding.name} is left "
        "unprepared, so every rank evaluates all of it (correct, not sharded); to shard it, "
        f"{advice}",
    )
    return True


def _evaluated_beside_a_whole_loader(
    ctx: Context, scope: Scope, chosen: dict[str, Kind]
) -> dict[str, tuple[Loop, cst.Call]]:
    """Loaders ``scope`` receives and would prepare (``distill(cfg, teacher, student,
    train_loader, val_loader)``) that reach an evaluation loop in a helper
    (``evaluate(student, val_loader)``) which a caller of ``scope`` also runs on the loader it
    hands ``scope``, unprepared there (``evaluate(teacher, val_loader)`` in ``main``). That
    loop cannot gather (the whole loader would be counted once per rank), so the prepared
    shard would be evaluated alone: its metrics one rank's. By name, with the loop and the
    caller's call that hands the whole loader."""
    if not isinstance(scope, cst.FunctionDef):
        return {}
    flow = ctx.facts.flow
    prepared = set(ctx.plan.prepared) | ctx.model.prepared_names | ctx.prepared_arguments
    found: dict[str, tuple[Loop, cst.Call]] = {}
    for loop in ctx.model.loops:
        if loop.trains or loop.iterable is None or not flow.reads_loader(loop):
            continue
        helper = ctx.facts.placement.enclosing_function(loop.node)
        iterated = loop.iterable.split(".")[0]
        if helper is None or helper is scope or not has_parameter(helper, iterated):
            continue
        for inner, implicit in flow.calls_of(helper):
            if ctx.facts.placement.enclosing_function(inner) is not scope:
                continue
            handed = [dotted(a.value) for p, a in bound_arguments(helper, inner, implicit)]
            passed = [n for n in handed if n is not None and chosen.get(n) is Kind.DATALOADER]
            for name in passed:
                if not has_parameter(scope, name) or name in found:
                    continue
                whole = _whole_beside(ctx, scope, helper, name, iterated, prepared)
                if whole is not None:
                    found[name] = (loop, whole)
    return found


def _evaluated_beside_an_inline_loader(
    ctx: Context, chosen: dict[str, Kind]
) -> dict[str, tuple[Loop, cst.CSTNode]]:
    """Loaders of ``chosen`` read by an evaluation loop (``for x, y in loader`` in
    ``evaluate(loader)``) that a call also runs on a loader made in its arguments
    (``evaluate(DataLoader(test_set))`` beside ``evaluate(val_loader)``). No prepare takes that
    one, so the loop cannot gather (its samples would be counted once per rank), and the
    prepared loader's totals there would cover one rank's shard while it divides by the whole
    set's size (its AverageMeters the same): 1/N of the value, silently. By name, with the
    loop and the place the inline loader is handed over. A loader some training loop reads is
    not among them: its shard is what that rank trains on."""
    flow = ctx.facts.flow
    prepared = set(ctx.plan.prepared) | ctx.model.prepared_names | ctx.prepared_arguments
    trained = _trained_loaders(ctx)
    found: dict[str, tuple[Loop, cst.CSTNode]] = {}
    for loop in ctx.model.loops:
        if loop.trains or loop.iterable is None or not flow.reads_loader(loop):
            continue
        sites = flow.origin_sites(loop.iterable, loop.node, stop=prepared)
        inline = sorted((place for origin, place in sites if origin is None), key=ctx.model.order)
        if not inline:
            continue
        for origin, _ in sites:
            if origin is None or origin in trained or origin in found:
                continue
            if chosen.get(origin) is Kind.DATALOADER:
                found[origin] = (loop, inline[0])
    return found


def _whole_beside(
    ctx: Context,
    scope: cst.FunctionDef,
    helper: cst.FunctionDef,
    name: str,
    iterated: str,
    prepared: set[str],
) -> cst.Call | None:
    """A call of ``helper``, in a function that calls ``scope``, handing for ``iterated`` the
    very name it hands ``scope`` for ``name``, which that function does not prepare."""
    flow = ctx.facts.flow
    for outer, implicit in flow.calls_of(scope):
        caller = ctx.facts.placement.enclosing_function(outer)
        given = [dotted(a.value) for p, a in bound_arguments(scope, outer, implicit) if p == name]
        if caller is None or not given or given[0] is None or given[0] in prepared:
            continue
        for call, bound in flow.calls_of(helper):
            if ctx.facts.placement.enclosing_function(call) is not caller:
                continue
            if any(
                p == iterated and dotted(a.value) == given[0]
                for p, a in bound_arguments(helper, call, bound)
            ):
                return call
    return None


def _read_where_written(ctx: Context, chosen: dict[str, Kind]) -> dict[str, Loop]:
    """Loaders of ``chosen`` read by a loop inside a ``with open(path, "w")`` block that runs
    on the main process alone (`file_write_blocks`), and by no training loop: prepared, that
    process would write its own shard's predictions, and the other ranks' would be lost. One an
    evaluation elsewhere also reads (``evaluate(model, test_loader)`` before
    ``write_predictions(model, test_loader, path)``) stays prepared where every loop of the
    block that reads it gathers its rows in place (`_gathers_in_place`): the block then runs on
    every rank and the main process writes the gathered rows, and the other evaluations stay
    sharded and gathered. Otherwise they run on it whole, as every rank does."""
    inside: dict[str, Loop] = {}
    stuck: dict[str, Loop] = {}
    outside: set[str] = set()
    trained: set[str] = set()
    blocks = _main_only_write_blocks(ctx)
    for loop in ctx.model.loops:
        origins = _loader_origins(ctx, loop)
        if loop.trains:
            trained |= origins
            continue
        block = _block_holding(ctx, blocks, loop)
        if block is None:
            outside |= origins
            continue
        gathers = _gathers_in_place(ctx, loop, block)
        for name in sorted(origins):
            inside.setdefault(name, loop)
            if not gathers:
                stuck.setdefault(name, loop)
    return {
        name: stuck.get(name, loop)
        for name, loop in inside.items()
        if name not in trained
        and (name in stuck or name not in outside)
        and chosen.get(name) is Kind.DATALOADER
    }


def _main_only_write_blocks(ctx: Context) -> list[cst.With]:
    """The `file_write_blocks` the saving step may guard whole (none computes a value read
    after it)."""
    return [b for b in file_write_blocks(ctx) if result_read_after(ctx, b) is None]


def _block_holding(ctx: Context, blocks: list[cst.With], loop: Loop) -> cst.With | None:
    return next((b for b in blocks if ctx.facts.placement.inside(loop.node, b)), None)


def _gathers_in_place(ctx: Context, loop: Loop, block: cst.With) -> bool:
    """``loop``, in the file-writing ``block``, is an evaluation the evaluation step gathers
    (``outputs = model(x)`` bound in its body, its rows written after), and ``block`` can run
    on every rank with the file opened on the main process only: prepared, its loader's shards
    are gathered before the rows are made. A forward in a loop's header, a helper's or a
    comprehension's, is not: under ``if accelerator.is_main_process:`` a gather would hang."""
    evaluation = next((e for e in ctx.facts.evaluations if e.loop.node is loop.node), None)
    return (
        evaluation is not None
        and bool(evaluation.sinks)
        and evaluation.unsure is None
        and evaluation.forward is not None
        and not evaluation.already_gathered
        and not evaluation.combined_by
        and id(loop.node) not in ctx.facts.helper_evaluations
        and can_open_on_main_only(ctx, block)
    )


def _evaluated_in_another_module(ctx: Context, chosen: dict[str, Kind]) -> dict[str, cst.Call]:
    """Loaders of ``chosen`` (by the names they were made under) that no loop of this file
    reads, and that are handed to a function imported from another module with no optimizer
    beside them (``val_loss, val_acc = evaluate(model, val_loader, criterion, device)`` from
    the project's ``src.evaluate``), with that call: the function evaluates whatever it is
    handed, and a prepared loader would be one rank's shard, its metric that shard's. A loader
    handed on with an optimizer is trained there: its shard is what the rank trains on, unless
    the function is one of the project's the conversion has read and it runs no backward
    (`project.imported_evaluators`). A dict made here and handed whole (``test(kwargs)`` of
    ``kwargs = {"model": model, "test_batcher": test_batcher, ...}``) hands on its values."""
    flow, model = ctx.facts.flow, ctx.model
    read = {name for loop in model.loops for name in _loader_origins(ctx, loop)}
    read |= set(_iterated_by_hand(ctx)) | set(_comprehension_evaluations(ctx))
    found: dict[str, cst.Call] = {}
    for call in model.calls:
        if ctx.facts.calls.targets(call) or not _imported_from_elsewhere(ctx, call):
            continue
        names = [dotted(a.value) for a in call.args]
        names += [n for a in call.args for n in _dict_values_handed(ctx, a.value, call)]
        kinds = {flow.kind_of(n, call) for n in names if n is not None}
        evaluates = (dotted(call.func) or "") in ctx.imported_evaluators
        if (Kind.OPTIMIZER in kinds and not evaluates) or Kind.DATALOADER not in kinds:
            continue
        for name in names:
            if name is None or flow.kind_of(name, call) is not Kind.DATALOADER:
                continue
            for origin in flow.origins(name, call):
                if (
                    origin is not None
                    and origin not in read
                    and chosen.get(origin) is Kind.DATALOADER
                ):
                    found.setdefault(origin, call)
    return found


#: Builtins and functools helpers that call a function they are handed on what they hold, later.
_INDIRECT_CALLERS = {"map", "filter", "partial", "starmap", "partialmethod", "reduce"}


def _handed_where_not_followed(
    ctx: Context, chosen: dict[str, Kind]
) -> dict[str, tuple[cst.CSTNode, str]]:
    """Loaders of ``chosen`` that no loop the conversion follows reads and no training loop
    reads, handed on through an indirection the analysis cannot follow to its consumer:
    ``map(functools.partial(evaluate, model), [val_loader])``, a lambda that closes over it
    (``{"val": lambda: evaluate(model, val_loader)}``), an argument of ``partial``/``map``.
    The loop that reads it (``evaluate``'s) has no known origin, so it is never gathered: a
    prepared loader would be evaluated on one rank's shard, its metric that shard's, silently.
    By name, with the place it is handed on and how."""
    model, flow = ctx.model, ctx.facts.flow
    read = {name for loop in model.loops for name in _loader_origins(ctx, loop)}
    read |= set(_iterated_by_hand(ctx)) | set(_comprehension_evaluations(ctx))
    candidates = {
        n for n, kind in chosen.items() if kind is Kind.DATALOADER and n not in read
    } - _trained_loaders(ctx)
    found: dict[str, tuple[cst.CSTNode, str]] = {}
    if not candidates:
        return found
    for node in ctx.facts.placement.all_nodes():
        if not isinstance(node, cst.Name) or not is_name_read(model, node, node.value):
            continue
        if flow.kind_of(node.value, node) is not Kind.DATALOADER:
            continue
        origins = {o for o in flow.origins(node.value, node) if o in candidates} - set(found)
        if not origins:
            continue
        escape = _indirection_around(ctx, node)
        if escape is not None:
            found.update(dict.fromkeys(sorted(origins), escape))
    return found


def _leave_loops_handed_whole(
    ctx: Context, chosen: dict[str, Kind], created: dict[str, int], site: cst.CSTNode, name: str
) -> None:
    """The functions of the file ``site`` hands on or calls (``evaluate`` of
    ``partial(evaluate, model)``) run their evaluation loops on ``name``, which stays whole: no
    gather may be written in those loops (the whole set would be counted once per rank), so
    every other loader that reaches them stays whole too, with a review line at its loop."""
    functions: list[cst.FunctionDef] = []
    held = _held_values(ctx, site) if isinstance(site, cst.Call) else []
    for node in [n for part in (site, *held) for n in walk(part)]:
        if isinstance(node, cst.Call):
            functions += ctx.facts.calls.targets(node)
        elif isinstance(node, (cst.Name, cst.Attribute)):
            found = _function_named(ctx, node, site)
            if found is not None:
                functions.append(found)
    trained = _trained_loaders(ctx)
    placement = ctx.facts.placement
    for loop in ctx.model.loops:
        if loop.trains or not any(placement.inside(loop.node, f) for f in functions):
            continue
        ctx.left_whole.add(id(loop.node))
        for other in sorted(_loader_origins(ctx, loop) - trained):
            if chosen.get(other) is not Kind.DATALOADER:
                continue
            _leave_whole(ctx, chosen, created, other, loop.node)
            ctx.plan.review(
                ctx.line(loop.node),
                f"{other} is evaluated by this loop, which also runs on {name}, a loader left "
                f"unprepared (line {ctx.line(site)}): no gather fits a loop that reads a whole "
                f"loader, so {other} is left unprepared too and every rank evaluates all of it "
                "(correct, not sharded)",
            )


def _indirection_around(ctx: Context, node: cst.CSTNode) -> tuple[cst.CSTNode, str] | None:
    """The lambda or ``partial``/``map``-like call ``node`` is read inside (its nearest, within
    the statement), with how to name it; None when there is none."""
    current: cst.CSTNode | None = ctx.model.parent(node)
    while current is not None and not isinstance(current, cst.BaseStatement):
        if isinstance(current, cst.Lambda):
            return current, "a lambda"
        if isinstance(current, cst.Call):
            names = ctx.model.qualified(current.func) | {dotted(current.func) or ""}
            short = {n.rsplit(".", 1)[-1] for n in names}
            if short & _INDIRECT_CALLERS:
                return current, f"{ctx.code(current.func)}()"
            if _held_values(ctx, current):
                return current, f"{ctx.code(current.func)}(), a function held in a variable"
        current = ctx.model.parent(current)
    return None


def _held_values(ctx: Context, call: cst.Call) -> list[cst.BaseExpression]:
    """What the variable ``call`` runs is bound to, when it is one no analysis resolves:
    ``check`` of ``check = functools.partial(evaluate, model)`` then ``check(val_loader)``, or
    of ``for name, check in checks.items()`` (its iterable). Empty for a function of the file,
    an alias of one, a parameter or any other name."""
    func = call.func
    if not isinstance(func, cst.Name) or ctx.facts.calls.targets(call):
        return []
    function = ctx.facts.placement.enclosing_function(call)
    if function is None or has_parameter(function, func.value):
        return []
    values: list[cst.BaseExpression] = []
    for node in walk(function.body):
        if ctx.facts.placement.enclosing_function(node) is not function:
            continue
        if isinstance(node, cst.Assign) and any(
            func.value in target_names(t.target) for t in node.targets
        ):
            values.append(node.value)
        elif isinstance(node, cst.For) and func.value in target_names(node.target):
            values.append(node.iter)
    return values


def _stored_into_a_dict_entry(ctx: Context, chosen: dict[str, Kind]) -> dict[str, cst.Assign]:
    """Loaders of ``chosen`` no training loop reads that are stored into a dict entry after the
    dict was made (``kwargs["test_batcher"] = test_batcher`` before ``test(kwargs)``), by name,
    with the statement: the flow analysis reads only the entries a dict is made with
    (`flow.dict_entries`), so the loop that takes the entry out is not known to read a prepared
    loader and would sum one rank's shard with no gather, silently."""
    trained = _trained_loaders(ctx)
    found: dict[str, cst.Assign] = {}
    for node in ctx.facts.placement.all_nodes():
        if not isinstance(node, cst.Assign):
            continue
        if not any(isinstance(t.target, cst.Subscript) for t in node.targets):
            continue
        name = dotted(node.value)
        if name is None or name in trained or chosen.get(name) is not Kind.DATALOADER:
            continue
        if ctx.facts.flow.kind_of(name, node) is Kind.DATALOADER:
            found.setdefault(name, node)
    return found


def _dict_values_handed(
    ctx: Context, argument: cst.BaseExpression, call: cst.Call
) -> list[str | None]:
    """The names a dict handed whole holds (`flow.dict_display`, the one reading of a handed
    dict); none for anything else."""
    held = ctx.facts.flow.dict_display(argument, call) or {}
    return [dotted(value) for value in held.values()]


def _imported_from_elsewhere(ctx: Context, call: cst.Call) -> bool:
    """``evaluate(...)`` or ``engine.evaluate(...)`` where the name comes from an import of a
    module that is neither torch nor the standard library's builtins: code of the project the
    conversion cannot read."""
    name = dotted(call.func)
    if name is None:
        return False
    root = name.split(".")[0]
    imported = ctx.model.imports.bound.get(root)
    if imported is None:
        return "." not in name and star_imported_from_the_project(ctx, name)
    return imported.split(".")[0] not in _LIBRARIES


#: Modules whose functions read a loader without evaluating a model over it.
_LIBRARIES = {
    "torch",
    "builtins",
    "functools",
    "itertools",
    "tqdm",
    "numpy",
    "accelerate",
    "accelify",
}


def _iterated_by_hand(ctx: Context) -> dict[str, cst.Call]:
    """Loaders (by the names they were made under) that are read only through ``iter(loader)``
    where no training step is seen (``dl_iter = iter(dl)`` then ``next(dl_iter)`` in a ``for i
    in range(num_batches)`` loop), with that call: no loop the analysis follows reads them, so
    an evaluation there is never gathered. A function handed a step that trains beside the
    loader (``self._foreach_batch(dl_train, self.train_batch)``) trains that loader: it is not
    among them, its shard is what the rank trains on."""
    flow, placement = ctx.facts.flow, ctx.facts.placement
    read = {name for loop in ctx.model.loops for name in _loader_origins(ctx, loop)}
    found: dict[str, cst.Call] = {}
    for node in placement.all_nodes():
        if not isinstance(node, cst.Call) or dotted(node.func) != "iter" or len(node.args) != 1:
            continue
        name = dotted(node.args[0].value)
        if name is None or flow.kind_of(name, node) is not Kind.DATALOADER:
            continue
        function = placement.enclosing_function(node)
        scope = function if function is not None else ctx.model.module
        if any(placement.inside(call, scope) for call in ctx.model.backward_calls):
            continue  # ``batch = next(train_iter)`` in a training loop: its shard is trained
        trained = _handed_a_training_step(ctx, function, name) if function is not None else set()
        for origin in flow.origins(name, node) - trained:
            if origin is not None and origin not in read:
                found.setdefault(origin, node)
    return found


def _handed_a_training_step(ctx: Context, function: cst.FunctionDef, loader: str) -> set[str]:
    """The origins of ``loader`` (a parameter of ``function``) at the calls that also hand
    ``function`` a function of this file that runs a backward (``self.train_batch``)."""
    flow = ctx.facts.flow
    found: set[str] = set()
    for call, implicit in flow.calls_of(function):
        bound = dict(bound_arguments(function, call, implicit))
        if loader not in bound:
            continue
        for parameter, argument in bound.items():
            if parameter == loader:
                continue
            step = _function_named(ctx, argument.value, call)
            if step is not None and any(
                ctx.facts.placement.inside(b, step) for b in ctx.model.backward_calls
            ):
                value = dotted(bound[loader].value)
                found |= {o for o in flow.origins(value, call) if o is not None}
    return found


def _function_named(
    ctx: Context, value: cst.BaseExpression, at: cst.CSTNode
) -> cst.FunctionDef | None:
    """The function of this file ``value`` names: ``train_step``, or ``self.train_batch`` of
    the class around ``at``."""
    name = dotted(value)
    if name is None:
        return None
    if name.startswith("self.") and name.count(".") == 1:
        owner = ctx.facts.placement.class_of(at)
        return ctx.model.call_graph.lookup(owner, name[5:]) if owner is not None else None
    return ctx.model.functions.get(name)


def _trained_loaders(ctx: Context) -> set[str]:
    """The names of the loaders some training loop reads: their shards are what the ranks
    train on, so no evaluation's need leaves them unprepared."""
    return {name for loop in ctx.model.loops if loop.trains for name in _loader_origins(ctx, loop)}


def _loader_origins(ctx: Context, loop: Loop) -> set[str]:
    """The names ``loop``'s loader was made or received under: through the helpers'
    parameters (`origins`) and the attributes a constructor received (their callers' names)."""
    if loop.iterable is None:
        return set()
    flow = ctx.facts.flow
    rows = flow.row_loaders_unknown(loop)
    if rows:  # ``loader, opt = rest.pop(0), rest.pop(0)``: any loader a row holds
        return set(rows)
    # ``for x, y in state["val_loader"]``: the loader the dict was built with, not the dict
    name, place = flow.returned_entry_read(loop) or (loop.iterable, loop.node)
    return ctx.facts.held_origins(name, place)


def _sharding_advice(ctx: Context, evaluation: Evaluation) -> str:
    """What to write so that an evaluation left whole could be sharded: its own advice, or
    the gather of predictions and labels."""
    return evaluation.advice or (
        f"gather predictions and labels together with {ctx.a('gather_for_metrics')} before the "
        "metrics"
    )
