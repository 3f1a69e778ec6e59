"""A conversion is the ordered list of its steps, each a function of the script's analysis and
a small `Context`; every step records its edits (and the places it would not touch, as review
notes) in the context's `Plan`. The Accelerator is placed last: by then every edit that needs
it, and every constructor argument, is known."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.facts import Facts, facts_of
from accelify.analysis.idle_members import OutputMembers
from accelify.analysis.loss_sources import made_for
from accelify.analysis.objects import bound_arguments, callee
from accelify.analysis.optimizer_models import parameter_owners
from accelify.analysis.script_model import Kind, Scope, ScriptModel
from accelify.analysis.syntax import dotted, walk
from accelify.convert.steps import (
    accelerator,
    accumulation,
    amp,
    backward,
    buffer_banks,
    clipping,
    collective_stops,
    data_notes,
    dead_branches,
    devices,
    evaluation,
    handwritten_ddp,
    host_copies,
    host_inputs,
    host_loads,
    logging_once,
    loop_host_inputs,
    loop_tensors,
    metric_schedulers,
    output,
    pack_lengths,
    prepare,
    project_prints,
    saving,
    scheduler_pace,
    seeding,
    self_training,
    shard_lengths,
    shared_files,
    side_effects,
    through_forward,
    tracker_runs,
    training_means,
    unused_outputs,
    unwrap,
)
from accelify.convert.steps.context import Context, Options, import_lines
from accelify.edits.plan import Plan

if TYPE_CHECKING:
    from accelify.convert.project import ObjectSaver, StateSaver

__all__ = ["STEPS", "Options", "plan_conversion"]

#: In order. No step reads another's edits: how they compose (nested, stacked, giving way, in
#: conflict) is the plan's (`accelify.edits.plan`).
STEPS: tuple[Callable[[Context], None], ...] = (
    backward.run,
    self_training.run,
    handwritten_ddp.run,
    devices.run_model_moves,
    devices.run_batch_moves,
    host_inputs.run,
    loop_host_inputs.run,
    host_loads.run,
    loop_tensors.run,
    host_copies.run,
    pack_lengths.run,
    devices.run_devices,
    amp.run,
    clipping.run,
    through_forward.run,
    unwrap.run,
    unused_outputs.run,
    saving.run,
    side_effects.run,
    shared_files.run,
    output.run,
    project_prints.run,
    logging_once.run,
    tracker_runs.run,
    evaluation.run,
    training_means.run,
    metric_schedulers.run,
    scheduler_pace.run,
    accumulation.run,
    collective_stops.run,
    data_notes.run,
    buffer_banks.run,
    seeding.run,
    dead_branches.run,
)


def plan_conversion(
    model: ScriptModel,
    options: Options,
    imported_writers: dict[str, str] | None = None,
    imported_evaluators: set[str] | None = None,
    imported_model_methods: dict[str, str] | None = None,
    imported_state_savers: dict[str, StateSaver] | None = None,
    imported_loggers: set[str] | None = None,
    imported_object_savers: dict[str, ObjectSaver] | None = None,
    imported_layer_members: dict[str, str] | None = None,
    imported_printers: dict[str, str] | None = None,
    imported_file_writers: dict[str, str] | None = None,
    imported_output_members: dict[str, OutputMembers] | None = None,
    imported_meters: dict[str, cst.ClassDef] | None = None,
) -> Plan:
    """``imported_writers``: names the script calls of functions of its project's other modules
    that only write files, with where they are (`project.imported_writers`);
    ``imported_evaluators``: those that train nothing (`project.imported_evaluators`);
    ``imported_model_methods``: those of them that call a model's own method
    (`project.imported_model_methods`); ``imported_state_savers``: those that save the state
    dict of a model they are handed (`project.imported_state_savers`); ``imported_loggers``:
    those that return a ``logging`` logger (`project.imported_loggers`);
    ``imported_object_savers``: classes whose methods save a handed model's state dict
    (`project.imported_object_savers`);
    ``imported_layer_members``: members that run layers of the model classes the script builds
    from those modules (`project.imported_layer_members`); ``imported_printers``: those that
    only show text on the terminal, with where they are (`project.imported_printers`);
    ``imported_file_writers``: those whose body writes a file, with where
    (`project.imported_file_writers`); ``imported_output_members``: what each returned output
    of the forward of the model classes the script builds from those modules is computed with
    (`project.imported_output_members`); ``imported_meters``: meter classes of those modules the
    script makes instances of (`project.imported_meters`)."""
    withheld: dict[str, str] = {}
    left_whole: dict[str, str] = {}
    while True:
        ctx = Context(
            model, options, withheld=dict(withheld), left_whole_schedulers=dict(left_whole)
        )
        plan = _planned(
            ctx,
            imported_writers,
            imported_evaluators,
            imported_model_methods,
            imported_state_savers,
            imported_loggers,
            imported_object_savers,
            imported_layer_members,
            imported_printers,
            imported_file_writers,
            imported_output_members,
            imported_meters,
        )
        # An argument the Accelerator cannot read where it is made (``use_amp`` set only after
        # the first use of the accelerator): planned again with that argument's construct kept
        # as written (`accelerator._late_arguments`). Each round withholds one key more.
        # A scheduler prepared while every loop that steps it reads a loader left whole
        # (`prepare.stepped_over_unprepared_loaders`): planned again with it left unprepared.
        new = {k: v for k, v in ctx.to_withhold.items() if k not in withheld}
        whole = {k: v for k, v in ctx.to_leave_whole.items() if k not in left_whole}
        if not new and not whole:
            return plan
        withheld.update(new)
        left_whole.update(whole)


def _planned(
    ctx: Context,
    imported_writers: dict[str, str] | None,
    imported_evaluators: set[str] | None,
    imported_model_methods: dict[str, str] | None,
    imported_state_savers: dict[str, StateSaver] | None,
    imported_loggers: set[str] | None,
    imported_object_savers: dict[str, ObjectSaver] | None,
    imported_layer_members: dict[str, str] | None,
    imported_printers: dict[str, str] | None,
    imported_file_writers: dict[str, str] | None,
    imported_output_members: dict[str, OutputMembers] | None,
    imported_meters: dict[str, cst.ClassDef] | None,
) -> Plan:
    """One round of `plan_conversion`, with ``ctx.withheld`` kept out of the constructor."""
    model, options = ctx.model, ctx.options
    ctx.imported_writers = imported_writers or {}
    ctx.imported_evaluators = imported_evaluators or set()
    ctx.imported_model_methods = imported_model_methods or {}
    ctx.imported_state_savers = imported_state_savers or {}
    ctx.imported_loggers = imported_loggers or set()
    ctx.imported_object_savers = imported_object_savers or {}
    ctx.imported_layer_members = imported_layer_members or {}
    ctx.imported_printers = imported_printers or {}
    ctx.imported_file_writers = imported_file_writers or {}
    ctx.imported_output_members = imported_output_members or {}
    ctx.imported_meters = imported_meters or {}
    if _trains_itself(ctx) or handwritten_ddp.replaces_the_inner_model(ctx):
        return ctx.plan
    prepare_scope = facts_of(model).placement.prepare_scope()
    if prepare_scope is None:
        ctx.plan.review(
            model.line(model.backward_calls[0]), "no model or optimizer found: nothing to prepare"
        )
        return ctx.plan
    placement = facts_of(model).placement
    renormed = _renormalised_embedding(model)
    if renormed is not None:
        ctx.plan.review(model.line(renormed), _RENORM)
        return ctx.plan
    library = _trains_only_for_other_files(ctx)
    if library is not None:
        ctx.plan.review(model.line(model.backward_calls[0]), library)
        return ctx.plan
    if placement.is_method(prepare_scope) and _without_instance(model, prepare_scope):
        ctx.plan.review(
            model.line(prepare_scope),
            f"{prepare_scope.name.value}() makes the model and optimizer and is a "  # type: ignore[union-attr]
            "static or class method: no instance there can hold the accelerator, and the "
            "methods that train cannot reach one made there; left as it is: hand what it makes "
            "to the constructor (cls(model, optimizer, ...)), or create the Accelerator where "
            "the training runs",
        )
        return ctx.plan
    shared = _handed_to_several_instances(ctx, prepare_scope)
    if shared is not None:
        ctx.plan.review(model.line(prepare_scope), shared)
        return ctx.plan
    twice = _wrapped_more_than_once(ctx, prepare_scope)
    if twice is not None:
        ctx.plan.review(model.line(prepare_scope), twice)
        return ctx.plan
    if placement.is_method(prepare_scope) and not _instanceless(model, prepare_scope):
        ctx.acc = "self.accelerator"
        ctx.confine_to_class(model.parent(model.parent(prepare_scope)))  # type: ignore[arg-type]
    ctx.plan.accelerator = ctx.acc
    ctx.scope = prepare_scope
    prepare.run(ctx, prepare_scope)
    _prepare_other_training_functions(ctx, prepare_scope)
    _review_training_outside_the_class(ctx, prepare_scope)
    _review_factories_never_called(ctx, prepare_scope)
    prepare.prepare_loaders_made_where_trained(ctx, prepare_scope)
    shard_lengths.run(ctx)
    ctx.through_forward = through_forward.routed_calls(ctx)
    outside = unwrap.forwards_outside_the_wrapper(ctx)
    if outside:  # the script is left as it is: a plan of these review lines only
        return _left_as_is(model, options, outside)
    for step in STEPS:
        step(ctx)
    ctx.to_leave_whole = prepare.stepped_over_unprepared_loaders(ctx)
    if options.mixed_precision:
        ctx.constructor.setdefault("mixed_precision", repr(options.mixed_precision))
    accelerator.run(ctx, prepare_scope)
    if ctx.left_as_is is not None:  # a plan of this review line only: the script unchanged
        return _left_as_is(model, options, [ctx.left_as_is])
    ctx.plan.imports = import_lines(options.target, ["Accelerator", *ctx.uses])
    ctx.plan.imports += [i for i in ctx.extra_imports if i not in ctx.plan.imports]
    return ctx.plan


def _left_as_is(model: ScriptModel, options: Options, reviews: list[tuple[int, str]]) -> Plan:
    """A plan of these review lines only: the script unchanged, and why."""
    left = Context(model, options).plan
    for line, text in reviews:
        left.review(line, text)
    return left


_RENORM = (
    "an embedding with max_norm renormalises, in place during the forward pass, the rows "
    "its batch looks up: under DDP each rank renormalises the rows of its own shard's batch, "
    "and DDP averages gradients only, so the ranks' weights drift apart from the first step "
    "(measured on 2 ranks); left as it is: drop max_norm (clip the rows after the optimizer "
    "step, on the whole table, identically on every rank), then convert"
)


def _renormalised_embedding(model: ScriptModel) -> cst.Call | None:
    """``nn.Embedding(vocab, dim, max_norm=1)`` (word2vec's skip-gram), or ``F.embedding(...,
    max_norm=...)``: the first such call, else None."""
    for call in model.calls:
        name = dotted(call.func) or ""
        if name.rsplit(".", 1)[-1] not in {
            "Embedding",
            "EmbeddingBag",
            "embedding",
            "embedding_bag",
        }:
            continue
        for argument in call.args:
            if argument.keyword is not None and argument.keyword.value == "max_norm":
                value = argument.value
                if not (isinstance(value, cst.Name) and value.value == "None"):
                    return call
    return None


def _trains_only_for_other_files(ctx: Context) -> str | None:
    """A module of training helpers (``utils.py`` with ``train_one_epoch(model, optimizer,
    data_loader, device, epoch)`` and ``evaluate(...)``, imported by the script that makes the
    model, optimizer and loaders): every function that runs a backward is a top-level function
    that nothing in this file calls or hands on, and every model and optimizer it trains is a
    parameter. The Accelerator belongs where they are made, in the other file; made here it
    would be a new one per call with nothing prepared, and a parameter added for it would
    break the other file's calls. The same for a trainer class of such a module (``class
    ModelTrainerVAE`` handed its model by ``__init__`` and its loader and optimizer by setters,
    built by the script that imports it) that nothing in this file builds, names or derives
    from, and in which the analysis sees no model or optimizer (one handed to ``__init__`` is
    prepared there, and the other file's calls run as they are). Left as it is, with why; None
    when the file trains anything of its own."""
    model, placement, graph = ctx.model, ctx.facts.placement, ctx.facts.calls
    trainers: list[cst.FunctionDef] = []
    classes: list[cst.ClassDef] = []
    for call in model.backward_calls:
        function = placement.top_function(call)
        if function is None:
            return None
        if placement.is_method(function):
            owner = model.parent(model.parent(function))
            if not isinstance(owner, cst.ClassDef) or model.parent(owner) is not model.module:
                return None
            if owner not in classes:
                classes.append(owner)
        elif function not in trainers:
            trainers.append(function)
    if any(graph.callers(f) or graph.references(f) or graph.uncertain_callers(f) for f in trainers):
        return None
    if any(not f.params.params or not _called_as_written(f) for f in trainers):
        return None  # ``@app.command()``: run by what decorates it
    if any(c.decorators or _named_in_the_file(model, c) for c in classes):
        return None
    trained = (Kind.MODEL, Kind.OPTIMIZER)
    if classes and any(  # a constructor handed both prepares them: the caller's file runs as is
        any(owner in classes for owner in model.ancestors(binding.statement))
        for binding in model.of_kind(*trained)
    ):
        return None
    if any(not binding.received for binding in model.of_kind(*trained)):
        return None
    # A loader the trainer makes for itself from a dataset it is handed (``DataLoader(
    # self.train_dataset, ...)`` in ``train_one_epoch``) is not what the Accelerator belongs
    # to: nothing that trains is made here, and sharding it alone would train unsynchronised
    # copies. A loader made anywhere else in the file (the module level) keeps the file.
    owners = [*trainers, *classes]
    made = [b for b in model.of_kind(Kind.DATALOADER) if not b.received]
    if any(
        not any(owner in model.ancestors(binding.statement) for owner in owners) for binding in made
    ):
        return None
    own_loaders = ""
    if made:
        lines = ", ".join(str(b.line) for b in made)
        plural = "s" if len(made) > 1 else ""
        own_loaders = (
            f", and accelerator.prepare(DataLoader(...)) for the loader{plural} made here "
            f"(line{plural} {lines})"
        )
    if not classes:
        names = " and ".join(f"{f.name.value}()" for f in trainers)
        return (
            f"{names} {'trains' if len(trainers) == 1 else 'train'} a model and optimizer "
            "handed in, and nothing in this file makes them or calls it: the Accelerator "
            "belongs where they are made, in the file that calls it; left as it is: there, "
            "create the Accelerator, prepare the model, optimizer and loaders, and hand it in "
            "as a parameter here (accelerator.backward(loss), accelerator.gather_for_metrics "
            f"in the evaluation, accelerator.print{own_loaders})"
        )
    names = " and ".join([f"{f.name.value}()" for f in trainers] + [c.name.value for c in classes])
    return (
        f"{names} {'trains' if len(trainers) + len(classes) == 1 else 'train'} a model and "
        "optimizer made elsewhere and handed in, and nothing in this file makes them or builds "
        "the class: the Accelerator belongs where they are made, in the file that builds it "
        "(made here, nothing it trains would be prepared and each rank would train its own "
        "copy); left as it is: there, create the Accelerator, prepare the model, optimizer and "
        "loaders before handing them in, and hand the accelerator in too (here: "
        "accelerator.backward(loss), accelerator.gather_for_metrics in the evaluation, "
        f"accelerator.print, accelerator.save of the unwrapped model{own_loaders})"
    )


def _named_in_the_file(model: ScriptModel, owner: cst.ClassDef) -> bool:
    """The class's name is read anywhere in the file but its own ``class`` line and its
    ``super(Class, self)`` calls: built, derived from, handed on or checked with
    ``isinstance``."""
    name = owner.name.value
    supers = {
        id(node.args[0].value)
        for node in walk(owner)
        if isinstance(node, cst.Call) and dotted(node.func) == "super" and node.args
    }
    return any(
        isinstance(node, cst.Name)
        and node.value == name
        and node is not owner.name
        and id(node) not in supers
        for node in walk(model.module)
    )


def _called_as_written(function: cst.FunctionDef) -> bool:
    """No decorator but gradient switches (``@torch.no_grad()``): a decorator may run it."""
    for decorator in function.decorators:
        node = decorator.decorator
        name = dotted(node.func if isinstance(node, cst.Call) else node) or ""
        if name.rsplit(".", 1)[-1] not in {"no_grad", "inference_mode", "enable_grad"}:
            return False
    return True


def _without_instance(model: ScriptModel, scope: cst.CSTNode) -> bool:
    """A static or class method makes what trains, and training also runs outside it: no
    ``self`` there to hold the accelerator for the methods that train. One that trains all by
    itself gets a local ``accelerator``, as a function would."""
    if not _instanceless(model, scope):
        return False
    facts = facts_of(model)
    placement = facts.placement
    if _called_as_a_factory(facts, scope):  # type: ignore[arg-type]
        return False
    return any(not placement.inside(call, scope) for call in model.backward_calls)


def _called_as_a_factory(facts: Facts, scope: cst.FunctionDef) -> bool:
    """``model, optimizer, loader = Trainer.make_state(cfg)`` in ``main()``: a static or class
    method called only from outside its class (a function, the module) is a factory like any
    function: the accelerator reaches it as a parameter from the caller that trains, and none
    of its class's methods needs one on the instance."""
    owner = facts.placement.class_of(scope)
    calls = facts.calls.calls_of(scope)
    return (
        bool(calls)
        and all(facts.placement.class_of(call) is not owner for call, _ in calls)
        and not any(
            facts.placement.class_of(backward) is owner for backward in facts.model.backward_calls
        )
    )


def _handed_to_several_instances(ctx: Context, scope: Scope) -> str | None:
    """Why a constructor that would prepare what it receives cannot: two of its calls hand it
    the same model (ArjanCodes' ``Runner(test_loader, model)`` beside ``Runner(train_loader,
    model, optimizer)``). Preparing in each instance wraps that model once per instance (DDP
    fails at the first backward: two allreduce hooks on each parameter), makes one Accelerator
    per instance, and shards the test instance's loader with no gather. None when no model is
    handed twice: two models made by different statements (an encoder, then the classifier
    built around it) are two objects, and a call in a function nothing calls never runs."""
    if not isinstance(scope, cst.FunctionDef) or scope.name.value != "__init__":
        return None
    flow = ctx.facts.flow
    models = {n for n, kind in flow.params.get(scope, {}).items() if kind is Kind.MODEL}
    handed: list[tuple[_Handed, cst.Call]] = []
    for call, implicit in flow.calls_of(scope):
        for parameter, argument in bound_arguments(scope, call, implicit):
            name = dotted(argument.value)
            if parameter in models and name is not None:
                handed += [(e, call) for e in _seen_by_callers(ctx, name, call, scope)]
    twice = next(
        (
            [entry for entry, _ in handed if entry.same_object(first)]
            for index, (first, built) in enumerate(handed)
            if any(
                entry.same_object(first) and not _one_per_run(ctx, entry, other, first, built)
                for entry, other in handed[index + 1 :]
            )
        ),
        None,
    )
    if twice is None:
        return None
    name, lines = twice[0].name, sorted({ctx.line(entry.call) for entry in twice})
    owner = ctx.facts.placement.class_of(scope)
    cls = owner.name.value if owner is not None else "the class"
    return (
        f"{cls}() is built {len(lines)} times with the same {name} (lines "
        f"{', '.join(map(str, lines))}), and its constructor is where the conversion would "
        f"prepare what it receives: {name} would be wrapped once per instance (DDP fails at "
        "the first backward) and each instance would make its own Accelerator; left as it is: "
        "create one Accelerator where the model, optimizer and loaders are made, prepare them "
        "there once, and hand the prepared objects (and the accelerator) to the instances"
    )


def _seen_by_callers(
    ctx: Context, name: str, call: cst.Call, function: cst.FunctionDef
) -> list[_Handed]:
    """The model ``call`` hands as ``name``, where it was made: none from a function nothing
    calls; from a function (not a method) that hands on its own parameter (``build_trainer(
    kind, model)``), what each of its callers hands it, at that caller's call."""
    placement = ctx.facts.placement
    factory = placement.enclosing_function(call)
    if factory is not None and placement.never_called(factory):
        return []
    params = set() if factory is None or placement.is_method(factory) else _parameters(factory)
    if name not in params:
        return [_Handed(name, made_for(ctx.model, name, call), call, function)]
    handed = []
    for outer, implicit in ctx.facts.flow.calls_of(factory):  # type: ignore[arg-type]
        for parameter, argument in bound_arguments(factory, outer, implicit):  # type: ignore[arg-type]
            given = dotted(argument.value)
            if parameter == name and given is not None:
                handed.append(_Handed(given, made_for(ctx.model, given, outer), outer, function))
    return handed


def _parameters(function: cst.FunctionDef) -> set[str]:
    return {p.name.value for p in (*function.params.params, *function.params.kwonly_params)}


def _one_per_run(
    ctx: Context, one: _Handed, built: cst.Call, other: _Handed, other_built: cst.Call
) -> bool:
    """Two constructions seen at the same call of a factory that runs at most one of them:
    each returns what it builds (``if kind == "pretrain": return Trainer(model, ...)`` then
    ``return Trainer(model, ...)``), or they sit in different arms of one ``if``."""
    if one.call is not other.call:
        return False
    returned = all(
        any(isinstance(a, cst.Return) for a in ctx.model.ancestors(c)) for c in (built, other_built)
    )
    return returned or ctx.facts.placement.exclusive(built, other_built)


@dataclass(frozen=True)
class _Handed:
    """A model one call hands to a function's parameter: the caller's name for it, the
    statement that made it there (None: not known), the call and the function it runs."""

    name: str
    made: cst.CSTNode | None
    call: cst.Call
    function: cst.FunctionDef

    def same_object(self, other: _Handed) -> bool:
        """The same name, and not two models made by different statements (unknown: the
        same)."""
        return self.name == other.name and (
            self.made is None or other.made is None or self.made is other.made
        )


def _handed_models(ctx: Context, scope: cst.FunctionDef, trained: set[str]) -> list[_Handed]:
    """What each call of ``scope`` in the file hands to its parameters in ``trained``."""
    handed = []
    for call, implicit in ctx.facts.flow.calls_of(scope):
        for parameter, argument in bound_arguments(scope, call, implicit):
            name = dotted(argument.value)
            if parameter in trained and name is not None:
                handed.append(_Handed(name, made_for(ctx.model, name, call), call, scope))
    return handed


def _received_models(ctx: Context, scope: Scope) -> set[str]:
    """The parameters of ``scope`` that hold a model its callers made, when ``scope`` is a
    function (not a method) that builds an optimizer over it."""
    if not isinstance(scope, cst.FunctionDef) or ctx.facts.placement.is_method(scope):
        return set()
    trained: set[str] = set()
    for binding in ctx.model.of_kind(Kind.OPTIMIZER):
        if binding.scope is scope and not binding.received:
            trained |= parameter_owners(binding)
    parameters = {p.name.value for p in (*scope.params.params, *scope.params.kwonly_params)}
    return trained & parameters


def _wrapped_more_than_once(ctx: Context, scope: Scope) -> str | None:
    """Why the function that builds the optimizer, where the conversion would prepare, cannot
    prepare the model it is handed: two calls hand it the same model (``train(model, dl1)``
    then ``train(model, dl2)``), or a call in a loop hands it one made before the loop. Each
    call would wrap that model again, with an Accelerator of its own: a model is prepared
    once. None when every call hands a model of its own."""
    trained = _received_models(ctx, scope)
    if not trained:
        return None
    handed = _handed_models(ctx, scope, trained)  # type: ignore[arg-type]
    name = scope.name.value  # type: ignore[union-attr]
    why = None
    for index, entry in enumerate(handed):
        loop = _loop_around(ctx, entry.call)
        if loop is not None and (
            entry.made is None or not ctx.facts.placement.inside(entry.made, loop)
        ):
            why = (
                f"line {ctx.line(entry.call)} calls it in a loop with {entry.name}, made before "
                "the loop"
            )
            break
        earlier = next((e for e in handed[:index] if e.same_object(entry)), None)
        if earlier is not None:
            why = (
                f"lines {ctx.line(earlier.call)} and {ctx.line(entry.call)} both hand it "
                f"{entry.name}"
            )
            break
    if why is None:
        return None
    return (
        f"{name}() builds the optimizer over the model it is handed, so the conversion would "
        f"prepare it there, but {why}: each call would wrap that model again (a model is "
        "prepared once); left as it is: create one Accelerator where the model is made, "
        f"prepare the model there once, and hand the prepared model and the accelerator to "
        f"{name}()"
    )


def _loop_around(ctx: Context, call: cst.Call) -> cst.CSTNode | None:
    """The innermost loop of the calling function that holds ``call``."""
    caller = ctx.facts.placement.enclosing_function(call)
    return next(
        (a for a in _ancestors_within(ctx, call, caller) if isinstance(a, (cst.For, cst.While))),
        None,
    )


def _static(scope: cst.CSTNode) -> bool:
    decorators = {dotted(d.decorator) for d in getattr(scope, "decorators", ())}
    return bool(decorators & {"staticmethod", "classmethod"})


def _instanceless(model: ScriptModel, scope: cst.CSTNode) -> bool:
    """A static or class method, or a function of a class the file calls only through the
    class (``Trainer.train_model(model=model, ...)``): no ``self`` there to hold the
    accelerator."""
    return _static(scope) or (
        isinstance(scope, cst.FunctionDef) and facts_of(model).calls.without_instance(scope)
    )


def _prepare_other_training_functions(ctx: Context, prepare_scope: Scope) -> None:
    """A script with several training functions, each building its own optimizer for the model
    it receives (``train(model, ...)``, then ``train_knowledge_distillation(teacher, student,
    ...)``): each prepares what it trains with, as the first does. Left alone, the others'
    models would train unsynchronised on every rank while their device moves are removed."""
    if ctx.acc.startswith("self."):
        return
    placement = ctx.facts.placement
    first_anchor = ctx.prepare_anchor
    done: list[Scope] = [prepare_scope]
    received = _received_models(ctx, prepare_scope)
    handed = _handed_models(ctx, prepare_scope, received) if received else []  # type: ignore[arg-type]
    for binding in ctx.model.of_kind(Kind.OPTIMIZER):
        scope = binding.scope
        if binding.received or not isinstance(scope, cst.FunctionDef) or scope in done:
            continue
        if _returned_by(ctx, binding.value, done):
            continue  # ``model, opt, ... = setup(cfg)``: prepared in setup(), where it is made
        if placement.is_method(scope) or any(placement.inside(scope, d) for d in done):
            continue
        if not any(placement.inside(call, scope) for call in ctx.model.backward_calls):
            continue
        done.append(scope)
        trained = parameter_owners(binding)
        reason = _why_not_prepare_in(ctx, scope, trained)
        reason = reason or _prepared_elsewhere(ctx, scope, trained, handed)
        if reason is None:
            handed += _handed_models(ctx, scope, trained)
            prepare.run(ctx, scope)
            continue
        ctx.plan.review(
            binding.line,
            f"{scope.name.value}() builds {binding.name} and trains with it, but nothing is "
            f"prepared there: {reason}; it trains what it is handed as it is, on every rank "
            "(not data-parallel); prepare its model, optimizer and loader once, where they "
            "are made, and hand the prepared ones in",
        )
    ctx.prepare_anchor = first_anchor


def _review_factories_never_called(ctx: Context, prepare_scope: Scope) -> None:
    """An old ``make_trainer(cfg)`` that builds an optimizer, beside the ``main()`` that builds
    the objects that run (`Placement.never_called`): prepare goes where those are, and the
    factory's stay as made. Said there, so that a caller in another file knows to prepare what
    it returns."""
    placement = ctx.facts.placement
    said: set[int] = set()
    for binding in ctx.model.of_kind(Kind.OPTIMIZER):
        scope = binding.scope
        if binding.received or scope is prepare_scope or id(scope) in said:
            continue
        if not placement.never_called(scope) or any(
            placement.inside(call, scope) for call in ctx.model.backward_calls
        ):
            continue
        said.add(id(scope))
        ctx.plan.review(
            binding.line,
            f"{scope.name.value}() builds {binding.name} but nothing in this file calls it: "  # type: ignore[union-attr]
            f"what it builds is not prepared ({_scope_name(prepare_scope)} builds and prepares "
            "the objects that run); a caller in another file must prepare what it returns",
        )


def _scope_name(scope: Scope) -> str:
    return f"{scope.name.value}()" if isinstance(scope, cst.FunctionDef) else "the module"


def _review_training_outside_the_class(ctx: Context, prepare_scope: Scope) -> None:
    """``topt.step()`` of ``main()`` training a teacher before the ``Distiller`` whose
    constructor holds ``self.accelerator`` is made: that optimizer and its model stay as they
    are (no accelerator is reachable there), so every rank trains its own copy on all the data.
    Said at each step of such an optimizer, where lint finds it unprepared."""
    if not ctx.acc.startswith("self."):
        return
    placement = ctx.facts.placement
    owner = placement.class_of(prepare_scope)
    if owner is None:
        return
    for binding in ctx.model.of_kind(Kind.OPTIMIZER):
        scope = binding.scope
        if binding.name in ctx.plan.prepared or binding.received:
            continue
        if not isinstance(scope, cst.FunctionDef) or placement.inside(scope, owner):
            continue
        if not any(placement.inside(call, scope) for call in ctx.model.backward_calls):
            continue
        trained = ", ".join(sorted(parameter_owners(binding))) or "its parameters"
        for call in ctx.model.calls:
            if dotted(call.func) != f"{binding.name}.step" or ctx.model.scope_of(call) is not scope:
                continue
            ctx.plan.review(
                ctx.line(call),
                f"{ctx.code(call)} left as is: {binding.name} and {trained} are not prepared "
                f"({ctx.acc} of {owner.name.value} is not reachable in "
                f"{scope.name.value}()); every rank trains them on all the data this loop reads, "
                "unsynchronised (not data-parallel)",
            )


def _prepared_elsewhere(
    ctx: Context,
    scope: cst.FunctionDef,
    trained: set[str],
    handed: list[_Handed],
) -> str | None:
    """A call of ``scope`` hands it a model that a call of a function already preparing hands
    too (``finetune(model, dl2)`` after ``train(model, dl1)``): preparing it here would wrap
    it a second time."""
    placement = ctx.facts.placement
    for entry in _handed_models(ctx, scope, trained):
        for earlier in handed:
            caller = placement.enclosing_function(earlier.call)
            if earlier.same_object(entry) and caller is placement.enclosing_function(entry.call):
                return (
                    f"line {ctx.line(entry.call)} hands it {entry.name}, which line "
                    f"{ctx.line(earlier.call)} hands to {earlier.function.name.value}(), where "
                    "it is prepared (it would be wrapped twice)"
                )
    return None


def _returned_by(ctx: Context, value: cst.BaseExpression | None, done: list[Scope]) -> bool:
    """``value`` is what a call of a function that already prepares returns (directly or
    through factories that return its call): the objects it hands back are the prepared ones,
    and preparing them again would wrap the model twice."""
    seen: list[cst.FunctionDef] = []
    while isinstance(value, cst.Call):
        made = callee(ctx.model, value)
        if made is None or made[0] in seen:
            return False
        if made[0] in done:
            return True
        seen.append(made[0])
        # ``def get_all(cfg): return build(cfg)``: what build() returns
        returns = ctx.model.index.own_returns(made[0])
        value = returns[0].value if len(returns) == 1 else None
    return False


def _why_not_prepare_in(ctx: Context, scope: cst.FunctionDef, trained: set[str]) -> str | None:
    """None when ``scope`` may prepare what it trains: every call of it in the file is reached
    by every rank (``prepare`` is a collective), none runs in a loop, and each hands it a model
    nobody prepared yet and no other call hands (a model prepared twice is wrapped twice);
    else why not."""
    placement, flow = ctx.facts.placement, ctx.facts.flow
    calls = [call for call, _ in flow.calls_of(scope)]
    if not calls:
        return "nothing in this file calls it"
    handed: list[tuple[str | None, int]] = []
    for call in calls:
        caller = placement.enclosing_function(call)
        if ctx.facts.ranks.divergent_branch(call, caller) is not None:
            return f"line {ctx.line(call)} calls it under a condition the ranks may disagree on"
        if any(isinstance(a, (cst.For, cst.While)) for a in _ancestors_within(ctx, call, caller)):
            return f"line {ctx.line(call)} calls it in a loop (its model would be wrapped again)"
        for parameter, argument in bound_arguments(scope, call):
            if parameter not in trained:
                continue
            name = dotted(argument.value)
            made = made_for(ctx.model, name, call) if name is not None else None
            if any(
                seen == name and (made is None or made_at in (0, id(made)))
                for seen, made_at in handed
            ):
                return f"{name} is handed to it more than once (it would be wrapped twice)"
            handed.append((name, id(made) if made is not None else 0))
            anchor = ctx.prepared_after.get(name) if name in ctx.plan.prepared else None
            where = placement.enclosing_function(anchor) if anchor is not None else None
            if name in ctx.plan.prepared and (anchor is None or where is caller):
                return f"line {ctx.line(call)} hands it {name}, prepared already"
    return None


def _ancestors_within(
    ctx: Context, node: cst.CSTNode, scope: cst.CSTNode | None
) -> list[cst.CSTNode]:
    found: list[cst.CSTNode] = []
    for ancestor in ctx.model.ancestors(node):
        if ancestor is scope:
            break
        found.append(ancestor)
    return found


def _trains_itself(ctx: Context) -> bool:
    """A model whose own method runs the backward (``layer.train(x_pos, x_neg)`` of a
    forward-forward layer) and whose gradients cannot be averaged by hand
    (`accelify.analysis.self_training`): wrapped by ``prepare`` it loses that method, and
    unwrapped its gradients are never synchronised. Left as it is, with the reason."""
    blocked = [entry for entry in ctx.facts.self_training if entry.blocker is not None]
    for entry in blocked:
        ctx.plan.review(
            ctx.line(entry.backward_calls[0]),
            f"{entry.name} trains itself in its own method, and its gradients cannot be "
            f"averaged by hand here: {entry.blocker}. Left as it is: once prepared, the DDP "
            "wrapper has no such method, and called unwrapped its gradients are never "
            "synchronised across ranks; move the training step out of the model class "
            "(forward through the prepared model), then convert",
        )
    return bool(blocked)
