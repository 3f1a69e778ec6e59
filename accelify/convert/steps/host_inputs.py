"""5b. A CPU-only script's model called on tensors no prepared loader hands over: the whole
test set after training (``model(X_test)``), a batch of noise to sample from, a fixed tensor
kept on ``self``. The original keeps everything on the CPU; converted, ``prepare`` places the
model on ``accelerator.device`` while these tensors stay where they were made, so on a GPU the
call fails on mixed devices (on the CPU nothing shows it). Each such call sends its inputs to
the model's device and its output back to the host, where the rest of the original code
expects it: ``send_to_device(model(send_to_device(X_test, accelerator.device)), "cpu")``.

Only inputs known to be made on the host are sent: a tensor made by a torch factory
(``torch.randn``, ``torch.tensor``, ``torch.from_numpy`` ...), a slice, view or arithmetic of
one, a name (``X_test``, ``self.noise``) every assignment of which is such a tensor, or a
helper's parameter every caller passes such a tensor for (``evaluate(model, X_test, y_test)``).
A loop's item, anything a function returned, a parameter some caller passes a batch for may
already be on the device, whose output the caller compares with labels that are there too:
those calls stay as written. Calls inside a loop over a prepared loader stay too (their output
meets the batches on the device; `loop_tensors` moves the factories made there, and
`loop_host_inputs` what the loop builds from them on the host).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from accelify.analysis.batch_values import comprehension_source
from accelify.analysis.dataflow import is_binding
from accelify.analysis.device_moves import moved_to, strip_moves
from accelify.analysis.objects import bound_arguments, returned_entry, unpacked_arguments_for
from accelify.analysis.outside_forward import defined_by_a_module_class
from accelify.analysis.partial_calls import partial_arguments
from accelify.analysis.script_model import Kind, Loop
from accelify.analysis.syntax import dotted, has_parameter, target_names, unpacked_pairs, walk
from accelify.convert.steps.context import Context
from accelify.convert.steps.devices import handed_on_before_prepare
from accelify.edits import rewrites
from accelify.edits.plan import statement


def run(ctx: Context) -> None:
    only_cpu = cpu_only(ctx)
    if only_cpu:
        _batches_moved_where_phases_mix(ctx)
    kept = set() if only_cpu else models_kept_on_host(ctx)
    if not (only_cpu or kept):
        return
    handed = _handed_to_constructors(ctx) if only_cpu else {}
    all_on_host = only_cpu and _no_batch_on_the_device(ctx)
    models: dict[int, str] = {}
    for call in ctx.model.calls:
        name = (
            prepared_model_called(ctx, call)
            or _handed_model_called(ctx, call, handed)
            or _handed_model_parameter(ctx, call, handed)
        )
        if name is None or in_a_prepared_loop(ctx, call):
            continue
        if only_cpu or name in kept:
            models[id(call)] = name
    moved: dict[int, bool] = {}  # by call: whether its inputs go to the device
    for call in reversed(ctx.model.calls):  # the inner call of ``head(encoder(x))`` first
        name = models.get(id(call))
        if name is None:
            continue
        values = [argument.value for argument in call.args]
        # ``encoder(x)`` handed to ``head``: already on the device, where head takes it
        chained = [i for i, value in enumerate(values) if moved.get(id(value))]
        inputs = [i for i, value in enumerate(values) if not _stays(value) and i not in chained]
        if not inputs and not chained:
            continue
        unknown = [values[i] for i in inputs if not _made_on_host(ctx, values[i], call)]
        if unknown and not all_on_host:
            _review_returned_inputs(ctx, call, name, unknown)
            _review_inputs_through_partial(ctx, call, name, unknown)
            continue
        moved[id(call)] = True
        back = not _feeds_a_model(ctx, call, models)
        acc = ctx.accelerator_at(call)
        # a method run as the wrapper's forward: its call is replaced by `through_forward`
        device = f"{acc}.device"
        edits = (
            rewrites.on_model_device_in_parts(call, device, inputs, back=back)
            if any(routed is call for routed in ctx.through_forward)
            else (rewrites.on_model_device(call, device, inputs, back=back),)
        )
        ctx.plan.add(
            *edits,
            line=ctx.line(call),
            text=_moved_text(ctx, call, name, acc, inputs, back),
            anywhere=acc != ctx.acc,
        )
        ctx.host_calls.add(id(call))
        if acc == ctx.acc:
            ctx.need(call)
        if "send_to_device" not in ctx.uses:
            ctx.uses.append("send_to_device")


def _batches_moved_where_phases_mix(ctx: Context) -> None:
    """A loop that trains on a prepared loader and evaluates one left whole (``run_epoch(model,
    loader, optimizer=None)`` handed both, a ``loaders[phase]`` loop whose "val" is kept whole):
    in the evaluated phase its batches are on the host while prepare put the model on the
    device (a crash on a GPU; on the CPU nothing shows it), and no call-by-call move fits both
    phases. Its batch is sent to the device at the loop's head, for every phase (a batch
    already there is handed back as it is), so the model, labels and metrics meet there."""
    for loop in ctx.model.loops:
        if not phases_mix(ctx, loop):
            continue
        target = loop.node.target
        acc = ctx.accelerator_at(loop.node)
        first = loop.node.body.body[0]
        if not _plain_target(target):
            ctx.plan.review(
                ctx.line(loop.node),
                "this loop reads a prepared loader in one phase and one left whole in the other: "
                "in the whole one its batches stay on the host while the model is on the device "
                f"(a crash on a GPU); send each batch there first ({acc}.device)",
            )
            continue
        batch = ctx.code(target).strip()
        packed = f"({batch})" if isinstance(target, cst.Tuple) else batch
        ctx.plan.insert_before(
            first, statement(f"{batch} = send_to_device({packed}, {acc}.device)")
        )
        ctx.plan.change(
            ctx.line(loop.node),
            f"{batch} sent to {acc}.device at the head of the loop: it reads a prepared loader "
            "and one left whole, whose batches stay on the host while the model is on the device",
        )
        if acc == ctx.acc:
            ctx.need(first)
        if "send_to_device" not in ctx.uses:
            ctx.uses.append("send_to_device")


def phases_mix(ctx: Context, loop: Loop) -> bool:
    """``loop`` trains on a prepared loader and evaluates one left whole: its batches are sent
    to the device at its head (or, where its target cannot be bound again, a review asks to)."""
    if not loop.trains or id(loop.node) not in ctx.left_whole:
        return False
    if not ctx.facts.flow.reads_loader(loop) or _reads_only_whole_loaders(ctx, loop):
        return False  # all on the host: each model call is moved (`run`)
    phased = any(p.decided and p.loop is loop for p in ctx.facts.phase_loaders.values())
    if not (phased or ctx.unprepared_loaders(loop)):
        return False
    return isinstance(loop.node.body, cst.IndentedBlock)


def batches_sent_at_the_head(ctx: Context, loop: Loop) -> bool:
    """`phases_mix` with a target the move binds again: every batch is on the device."""
    return phases_mix(ctx, loop) and _plain_target(loop.node.target)


def _plain_target(target: cst.BaseExpression) -> bool:
    """``batch`` or ``x, y``: a loop target that can be bound again as it is written."""
    if isinstance(target, cst.Name):
        return True
    return isinstance(target, cst.Tuple) and all(
        isinstance(e, cst.Element) and isinstance(e.value, cst.Name) for e in target.elements
    )


def _feeds_a_model(ctx: Context, call: cst.Call, models: dict[int, str]) -> bool:
    """``encoder(x)`` of ``head(encoder(x))``, both prepared: an argument of another model's
    call the conversion sends to the device, so its output stays there for that model."""
    argument = ctx.model.parent(call)
    outer = ctx.model.parent(argument) if isinstance(argument, cst.Arg) else None
    return (
        isinstance(outer, cst.Call)
        and id(outer) in models
        and argument.keyword is None  # type: ignore[union-attr]
        and not argument.star  # type: ignore[union-attr]
    )


def _moved_text(
    ctx: Context, call: cst.Call, name: str, acc: str, inputs: list[int], back: bool
) -> str:
    """The summary line of one model call sent to the device."""
    where = f"prepare places {name} on the device"
    if not back:
        return (
            f"{ctx.code(call)}: inputs sent to {acc}.device ({where}); its output stays there "
            "for the model it is handed to"
        )
    if not inputs:
        return (
            f"{ctx.code(call)}: the output back to the CPU ({where}; its input comes from "
            "a model already there)"
        )
    return (
        f"{ctx.code(call)}: inputs sent to {acc}.device and the output back to the CPU "
        f"({where}; these tensors stay where they are made)"
    )


def models_kept_on_host(ctx: Context) -> set[str]:
    """In a script that uses another device, the models it never moves there: a linear probe
    trained on ``feats = encoder(x).cpu()`` after the encoder, made by a constructor and never
    ``.to(device)``-ed, ``.cuda()``-ed or handed to any call (a helper might move it). The
    original runs them on the CPU, on CPU tensors; ``prepare`` places them on the device."""
    bindings: dict[str, list[cst.BaseExpression | None]] = {}
    for binding in ctx.model.of_kind(Kind.MODEL):
        # ``self.probe`` or a model handed in: where it lives is decided elsewhere
        known = "." not in binding.name and not binding.received
        bindings.setdefault(binding.name, []).append(binding.value if known else None)
    return {
        name
        for name, values in bindings.items()
        if all(v is not None and _a_constructor_kept_where_made(ctx, v) for v in values)
        and not any(_moved_or_handed_on(call, name) for call in ctx.model.calls)
    }


def _a_constructor_kept_where_made(ctx: Context, value: cst.BaseExpression) -> bool:
    """``nn.Linear(16, 3)``: a module made here (not by a function of the file, which may move
    it), with no move chained to it."""
    return (
        isinstance(value, cst.Call)
        and strip_moves(value) is value
        and (dotted(value.func) or "") not in ctx.model.functions
        and dotted(value.func) is not None
    )


def _moved_or_handed_on(call: cst.Call, name: str) -> bool:
    """``call`` moves ``name`` (``probe.to(device)``, ``probe.cuda()``) or takes it as an
    argument (``nn.DataParallel(probe)``, ``setup(probe)``)."""
    func = call.func
    if isinstance(func, cst.Attribute) and dotted(func.value) == name and names_a_device(call):
        return True
    return any(dotted(argument.value) == name for argument in call.args)


def _no_batch_on_the_device(ctx: Context) -> bool:
    """The file has no DataLoader, and prepares nothing but models, optimizers and schedulers:
    its batches come from elsewhere (a replay buffer's ``sample()``, an environment, the random
    generator), made on the host like every tensor of a CPU-only script. What a prepared model
    is called on is then on the CPU, whatever the analysis can follow of it (``batch.s`` of a
    namedtuple a buffer returns): nothing else the conversion does puts a tensor on the device,
    as every such call sends its output back to the CPU."""
    if ctx.model.of_kind(Kind.DATALOADER) or ctx.prepared_arguments:
        return False
    held = {
        binding.name
        for kind in (Kind.MODEL, Kind.OPTIMIZER, Kind.SCHEDULER)
        for binding in ctx.model.of_kind(kind)
    }
    return all(name in held for name in ctx.plan.prepared)


def _loader_loops_around(ctx: Context, node: cst.CSTNode) -> list[Loop]:
    """The loops over a DataLoader that ``node`` is in, innermost first."""
    loops = [
        loop
        for loop in ctx.model.loops
        if ctx.facts.flow.reads_loader(loop) and ctx.facts.placement.inside(node, loop.node)
    ]
    return sorted(loops, key=lambda loop: -ctx.model.order(loop.node))


def in_a_prepared_loop(ctx: Context, call: cst.Call, depth: int = 3) -> bool:
    """The innermost loop over a DataLoader around ``call`` reads a prepared one: its batches
    are on the device (an evaluation over a loader left whole, nested in the training loop, is
    not). So is a call in a helper every call of which is in such a loop (a GAN trainer's
    ``step(real)`` run per batch: the generator's output there meets the discriminator and
    the batches on the device, and sent back to the CPU it would not)."""
    loops = _loader_loops_around(ctx, call)
    if loops:
        return not ctx.unprepared_loaders(loops[0]) and not _over_a_whole_loader_inside(
            ctx, call, loops[0].node
        )
    function = ctx.facts.placement.enclosing_function(call)
    if function is None or depth == 0:
        return False
    callers = [c for c, _ in ctx.facts.calls.calls_of(function)]
    return bool(callers) and all(in_a_prepared_loop(ctx, c, depth - 1) for c in callers)


def _over_a_whole_loader_inside(ctx: Context, call: cst.Call, loop: cst.CSTNode) -> bool:
    """``call`` reads an item of a comprehension over a loader left whole, written inside the
    prepared ``loop`` (``sum(model(xv) ... for xv, yv in val_loader)`` per training step): the
    comprehension's batches, not the loop's, are what it runs on."""
    for ancestor in ctx.model.ancestors(call):
        if ancestor is loop:
            return False
        if isinstance(ancestor, cst.BaseComp):
            clause: cst.CompFor | None = ancestor.for_in
            while clause is not None:
                names = target_names(clause.target)
                if any(_item_of_a_whole_loader(ctx, n, call) for n in names if _reads(call, n)):
                    return True
                clause = clause.inner_for_in
    return False


def _reads(call: cst.Call, name: str) -> bool:
    """``call`` takes ``name`` in (an argument, not the function it runs)."""
    return any(
        isinstance(n, cst.Name) and n.value == name for n in walk(call) if n is not call.func
    )


def _batch_of_a_whole_loader(ctx: Context, name: str, at: cst.CSTNode) -> bool:
    """``feats`` of ``for ids, feats, labels in test_loader:`` when the conversion leaves
    ``test_loader`` whole (an evaluation it cannot gather): a DataLoader no prepare took hands
    out what its dataset made, on the host in a CPU-only script."""
    root = name.split(".")[0]
    for loop in _loader_loops_around(ctx, at):
        if root in loop.batch_names:
            return _reads_only_whole_loaders(ctx, loop)
    return False


def _item_of_a_whole_loader(ctx: Context, name: str, at: cst.CSTNode) -> bool:
    """``x`` of ``sum(model(x) for x, y in val_loader)`` (also ``data[1]``, ``loaders["val"]``)
    when the conversion leaves that loader whole (no gather fits inside a comprehension:
    `inline_evaluations`): its batches are made on the host, as a ``for`` loop's are
    (`_batch_of_a_whole_loader`)."""
    iterated = comprehension_source(ctx.model, name.split(".")[0], at)
    if iterated is None:
        return False
    entry = returned_entry(ctx.model, iterated, at)
    if entry is not None:  # ``loaders["val"]`` of ``loaders = {"val": vl, ...}``: ``vl``
        return _a_whole_loader(ctx, cst.Name(entry[0]), entry[1])
    if isinstance(iterated, cst.Subscript):  # ``data[1]`` of a tuple of loaders left whole
        container = dotted(iterated.value)
        prepared = set(ctx.plan.prepared) | ctx.model.prepared_names | ctx.prepared_arguments
        return not _holds_a_prepared_entry(container, prepared) and _a_whole_loader(
            ctx, iterated.value, at
        )
    return _a_whole_loader(ctx, iterated, at)


def _trains(ctx: Context, node: cst.For) -> bool:
    return any(loop.node is node and loop.trains for loop in ctx.model.loops)


#: Calls that run the function they are handed on each item of what follows it: ``map``
#: hands the item, ``starmap`` its elements (``starmap(lambda x, y: ..., loader)``).
_MAPPING_CALLS = frozenset({"builtins.map", "map", "itertools.starmap"})


def _mapped_over_whole_loaders(ctx: Context, name: str, at: cst.CSTNode) -> bool:
    """``b`` of ``map(lambda b: score_batch(model, b), val_loader)`` when the conversion leaves
    ``val_loader`` whole (no gather fits inside ``map()``): the lambda's parameter takes each
    batch of loaders no prepare took (``x`` of ``starmap(lambda x, y: ..., val_loader)`` an
    element of one), made on the host like every tensor of a CPU-only script, so the model
    call it reaches needs them sent to the device."""
    lam = next((a for a in ctx.model.ancestors(at) if isinstance(a, cst.Lambda)), None)
    if lam is None or name not in {p.name.value for p in lam.params.params}:
        return False
    argument = ctx.model.parent(lam)
    call = ctx.model.parent(argument) if isinstance(argument, cst.Arg) else None
    if not isinstance(call, cst.Call) or call.args[0] is not argument:
        return False
    called = ctx.model.qualified(call.func) | {dotted(call.func) or ""}
    if not called & _MAPPING_CALLS:
        return False
    iterables = call.args[1:]
    return bool(iterables) and all(
        not a.star and a.keyword is None and _a_whole_loader(ctx, a.value, call) for a in iterables
    )


def _a_whole_loader(ctx: Context, value: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """``value`` names a DataLoader every origin of which the conversion leaves unprepared."""
    name = dotted(value)
    if name is None or ctx.facts.flow.kind_of(name, at) is not Kind.DATALOADER:
        return False
    prepared = set(ctx.plan.prepared) | ctx.model.prepared_names | ctx.prepared_arguments
    origins = ctx.origins_past_namesakes(name, at, prepared)
    return bool(origins) and all(
        origin is not None and origin not in prepared for origin, _ in origins
    )


def _reads_only_whole_loaders(ctx: Context, loop: Loop) -> bool:
    """``loop`` reads a loader named as such (not a dict's entry picked by phase), every
    origin of which the conversion leaves unprepared: a loop that reads a prepared loader too
    (``run_epoch(loader)`` called with the training loader and the validation one) gets
    batches on the device from it. A training loop counts as an evaluation does (``finetune(
    model, loader)`` over a loader no prepare took, after ``train()`` prepared that model):
    its batches are on the host, and the loss of the output sent back there still reaches
    the model's parameters through the move's gradient."""
    rows = ctx.facts.flow.row_loaders_unknown(loop)
    if rows:  # ``loader, opt = rest.pop(0), rest.pop(0)``: any loader a row holds
        return set(rows) <= set(ctx.unprepared_loaders(loop))
    name, place = ctx.facts.flow.loader_read(loop)
    if name is None or not _plain_name(name):
        return False
    prepared = set(ctx.plan.prepared) | ctx.model.prepared_names | ctx.prepared_arguments
    origins = ctx.origins_past_namesakes(name, place, prepared)
    unprepared = set(ctx.unprepared_loaders(loop))
    return bool(origins) and all(
        origin in unprepared
        and not any(  # ``self.loaders``: the dict a factory made and prepared an entry of
            _holds_a_prepared_entry(name, prepared)
            for name in {origin} | (ctx.facts.held_origins(origin, place) if origin else set())
        )
        for origin, place in origins
    )


def _holds_a_prepared_entry(container: str | None, prepared: set[str]) -> bool:
    """``dataloaders`` when ``dataloaders["train"]`` is prepared where the dict is made: a
    loop handed ``dataloaders[phase]`` reads that prepared loader in one phase."""
    return container is not None and any(
        name.startswith((f"{container}[", f"{container}.")) for name in prepared
    )


def _plain_name(text: str) -> bool:
    return all(part.isidentifier() for part in text.split("."))


def _review_returned_inputs(
    ctx: Context, call: cst.Call, name: str, unknown: list[cst.BaseExpression]
) -> None:
    """An input bound to what a function of this file returned that the analysis cannot follow
    to a torch factory (``X_test = load_split(path)``): in a CPU-only script it is most likely a CPU
    tensor, which the prepared model on the device cannot take; it could also be a batch of a
    prepared loader, already there. The call stays, and the line says what to do."""
    returned = [v for v in unknown if _bound_to_a_call(ctx, v, call)]
    if not returned or _in_a_training_step(ctx, call):
        return
    names = ", ".join(ctx.code(v) for v in returned)
    acc = ctx.accelerator_at(call)
    ctx.plan.review(
        ctx.line(call),
        f"{ctx.code(call)}: prepare places {name} on {acc}.device, and where {names} (returned "
        f"by a call) is made is not known here; left as it is: if it is a CPU tensor, as in "
        f"the original, send it there and the output back (send_to_device of "
        f"accelify.utils: send_to_device({name}(send_to_device({ctx.code(returned[0])}, "
        f'{acc}.device)), "cpu"))',
    )


def _review_inputs_through_partial(
    ctx: Context, call: cst.Call, name: str, unknown: list[cst.BaseExpression]
) -> None:
    """``model(x)`` in ``evaluate(model, loader)``, which only ``functools.partial(evaluate,
    model)`` reaches, kept where no call the conversion follows runs it (a dict of partials):
    ``model`` is the prepared model, on the device, and where ``x`` comes from is not known.
    In a CPU-only script it is most likely a CPU tensor: the call stays, and the line says so."""
    outer = _model_through_partial(ctx, name, call) if dotted(call.func) else None
    if outer is None:
        return
    if any(_bound_to_a_call(ctx, v, call) for v in unknown):
        return  # `_review_returned_inputs` wrote its line
    function = ctx.facts.placement.enclosing_function(call)
    helper = function.name.value if function is not None else "its function"
    acc = ctx.accelerator_at(call)
    ctx.plan.review(
        ctx.line(call),
        f"{ctx.code(call)}: {outer} is handed to {helper}() as {name} through "
        f"functools.partial after its prepare, which places it on {acc}.device, and where "
        f"{ctx.code(unknown[0])} is made is not followed there; left as it is: if it is a CPU "
        "tensor, as in the original, send it there and the output back (send_to_device of "
        f"accelify.utils: send_to_device({name}(send_to_device({ctx.code(unknown[0])}, "
        f'{acc}.device)), "cpu"))',
    )


def _in_a_training_step(ctx: Context, call: cst.Call) -> bool:
    """``call`` runs in a loop that also runs a backward pass (``x, y = self.next_batch()``
    in a ``while step < max_steps`` loop): its inputs are the step's batch."""
    loops = [a for a in ctx.model.ancestors(call) if isinstance(a, (cst.For, cst.While))]
    return any(
        ctx.facts.placement.inside(backward, loop)
        for loop in loops
        for backward in ctx.model.backward_calls
    )


def _bound_to_a_call(ctx: Context, value: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """``value`` names what a function of this file returned that draws no batch (a batch
    drawn with ``next``, by the file's helper or not, or a library's tensor is not the file's
    to follow, and says nothing here)."""
    name = dotted(value)
    return name is not None and any(
        not _draws_batches(ctx, function) for function in returned_by(ctx, name, at)
    )


def returned_by(ctx: Context, name: str, at: cst.CSTNode) -> list[cst.FunctionDef]:
    """The functions of this file whose results ``name`` is bound to where ``at`` reads it
    (``model`` of ``mse, lr, model = experiment.sweep(lrs)``: ``sweep``); none for a
    parameter."""
    if name == "self" or _passed_for_parameter(ctx, name, at) is not None:
        return []
    found = []
    for bound in assigned_values(ctx, name, at):
        if not isinstance(bound, (_Unpacked, cst.Call)):
            continue
        target = ctx.facts.calls.callee(bound.call if isinstance(bound, _Unpacked) else bound)
        if target is not None:
            found.append(target[0])
    return found


def _draws_batches(ctx: Context, function: cst.FunctionDef) -> bool:
    """``function`` calls ``next(...)`` or loops (``return next(self.iterator)``): what it
    returns may be a batch of a prepared loader, already on the device."""
    return any(
        isinstance(node, (cst.For, cst.While))
        or (isinstance(node, cst.Call) and dotted(node.func) == "next")
        for node in ctx.model.index.own_nodes(function)
    )


def _handed_to_constructors(ctx: Context) -> dict[str, list[cst.Call]]:
    """A model handed to a constructor that prepares it (``Trainer(model, loader)``, whose
    ``__init__`` prepares ``self.model``): prepare moves the very module the caller still
    holds, so after that call the caller's ``model`` is on the device too (unwrapped). By the
    caller's name, the constructor calls after which it is."""
    found: dict[str, list[cst.Call]] = {}
    for binding in ctx.model.of_kind(Kind.MODEL):
        anchor = ctx.prepared_after.get(binding.name)
        scope = binding.scope
        if not binding.received or anchor is None or binding.name in ctx.frozen:
            continue
        if not isinstance(scope, cst.FunctionDef) or not ctx.facts.placement.inside(anchor, scope):
            continue
        for call, _ in ctx.facts.calls.calls_of(scope):
            for source in binding.sources:
                found.setdefault(source, []).append(call)
    for function in ctx.model.functions.values():
        for parameter in _prepared_parameters(ctx, function):
            for call, implicit in ctx.facts.flow.calls_of(function):
                for name, argument in bound_arguments(function, call, implicit):
                    passed = dotted(argument.value)
                    if name == parameter and passed is not None and "." not in passed:
                        found.setdefault(passed, []).append(call)
    return found


def _prepared_parameters(ctx: Context, function: cst.FunctionDef) -> list[str]:
    """The model parameters ``function`` prepares (``train_model(model, ...)`` whose body
    prepares ``model``): prepare moves the very module the caller handed over, so after the
    call the caller's model is on the device too."""
    return [
        name
        for name, anchor in ctx.prepared_after.items()
        if "." not in name
        and name not in ctx.frozen
        and has_parameter(function, name)
        and ctx.facts.placement.inside(anchor, function)
        and ctx.facts.flow.kind_of(name, anchor) is Kind.MODEL
    ]


def _handed_model_called(
    ctx: Context, call: cst.Call, handed: dict[str, list[cst.Call]]
) -> str | None:
    name = dotted(call.func)
    if name is None or "." in name:
        return None
    scope = ctx.model.scope_of(call)
    for made in handed.get(name, ()):
        if ctx.model.scope_of(made) is scope and ctx.model.order(made) < ctx.model.order(call):
            return None if _rebound_between(ctx, name, made, call) else name
    return None


def _handed_model_parameter(
    ctx: Context, call: cst.Call, handed: dict[str, list[cst.Call]]
) -> str | None:
    """``model(inputs)`` in a helper whose ``model`` parameter every call of the helper fills
    with a model handed, before that call and in the same scope, to a constructor that
    prepares it (``perplexity(model, val_loader)`` after ``trainer = Trainer(model, ...)``):
    prepare moved that very module to the device, and the helper's inputs stay on the CPU."""
    name = dotted(call.func)
    if name is None or "." in name:
        return None
    passed = _passed_for_parameter(ctx, name, call)
    if not passed:
        return None
    moved = [argument for argument in passed if _handed_before(ctx, argument, handed)]
    if len(moved) == len(passed):
        return name
    if moved and not in_a_prepared_loop(ctx, call):
        ctx.plan.review(
            ctx.line(call),
            f"{ctx.code(call)}: the call at line {ctx.line(moved[0])} hands over "
            f"{ctx.code(moved[0].value)} after a constructor prepared it, which places it on "
            "the device, and other calls hand over a model still on the CPU: left as it is; "
            "on a GPU, send the inputs to the model's device there (send_to_device of "
            "accelify.utils), or call it with the prepared model only",
        )
    return None


def _handed_before(ctx: Context, argument: cst.Arg, handed: dict[str, list[cst.Call]]) -> bool:
    """``argument`` names a model handed, before it and in its scope, to a constructor that
    prepares it (`_handed_to_constructors`), and not bound again since."""
    outer = dotted(argument.value)
    if outer is None or "." in outer:
        return False
    scope = ctx.model.scope_of(argument)
    return any(
        ctx.model.scope_of(made) is scope
        and ctx.model.order(made) < ctx.model.order(argument)
        and not _rebound_between(ctx, outer, made, argument)
        for made in handed.get(outer, ())
    )


def cpu_only(ctx: Context) -> bool:
    """No device in the script but the CPU, and no model moved anywhere else: the original
    runs on the CPU, and every tensor it makes is there. A device variable that always holds
    the CPU (``device = device or torch.device("cpu")`` of a helper no caller passes a device,
    a forecasting ``train_model()``'s shape) is no other device: its moves stay on the CPU."""
    if not all(_always_cpu(ctx, b.value, b.assign) for b in ctx.model.of_kind(Kind.DEVICE)):
        return False
    for binding in ctx.model.of_kind(Kind.MODEL):
        if strip_moves(binding.value) is not binding.value and not _moves_to_cpu(
            ctx, binding.value
        ):
            return False
    return not any(
        names_a_device(call) and not _moves_to_cpu(ctx, call) for call in ctx.model.calls
    )


def _moves_to_cpu(ctx: Context, expression: cst.BaseExpression) -> bool:
    """Every move in ``expression`` (a ``.to(...)`` chain) goes to the CPU: a literal one, or
    a name each assignment of which is one."""
    for move in walk(expression):
        if not (isinstance(move, cst.Call) and names_a_device(move)):
            continue
        target = moved_to(move)
        if target is None:
            return False  # .cuda()
        if isinstance(target, cst.Name):
            values = assigned_values(ctx, target.value, move)
            known = [v for v in values if v is not None]
            if not known or not all(_always_cpu(ctx, v, move) for v in known):
                return False
            if len(known) < len(values) and not any(_defaults_to_cpu(v) for v in known):
                return False  # a parameter the caller may pass, not replaced by the CPU
        elif not _always_cpu(ctx, target, move):
            return False
    return True


def _defaults_to_cpu(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.BooleanOperation) and isinstance(value.operator, cst.Or)


def _always_cpu(ctx: Context, value: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """``"cpu"``, ``torch.device("cpu")``, or ``device or <one of those>`` where ``device`` is
    a parameter (default None) that no call of its function passes, none of them unpacking
    arguments it could come in (``**kwargs``)."""
    if isinstance(value, cst.SimpleString):
        return value.evaluated_value == "cpu"
    if isinstance(value, cst.Call) and dotted(value.func) == "torch.device":
        return len(value.args) == 1 and _always_cpu(ctx, value.args[0].value, at)
    if not (isinstance(value, cst.BooleanOperation) and isinstance(value.operator, cst.Or)):
        return False
    left = value.left
    function = ctx.facts.placement.enclosing_function(at)
    if not isinstance(left, cst.Name) or function is None:
        return False
    if not has_parameter(function, left.value) or ctx.facts.flow.call_site_arguments(
        left.value, at
    ):
        return False
    calls = ctx.facts.flow.calls_of(function)
    return (
        bool(calls)
        and not any(argument.star for call, _ in calls for argument in call.args)
        and _always_cpu(ctx, value.right, at)
    )


def names_a_device(call: cst.Call) -> bool:
    """``x.cuda()``, ``x.to("cuda")``, ``x.to(dev)``, ``x.to(torch.float, device=d)``: a move,
    as opposed to a dtype cast (``x.to(torch.float32)``)."""
    func = call.func
    if not isinstance(func, cst.Attribute):
        return False
    if func.attr.value == "cuda":
        return True
    target = moved_to(call)
    if target is None:
        return False
    text = dotted(target) or ""
    return not text.startswith("torch.") or text == "torch.device"


def prepared_model_called(ctx: Context, call: cst.Call) -> str | None:
    """The model ``call`` runs (``model(x)``, ``self.net(x)``), when it is prepared and the
    call comes after its prepare. A layer or method of it that a module class of this file
    defines (``model.encoder(data)``, ``self.transe.entity_embeddings(ids)``: run through
    ``unwrap_model``) runs on the model's device too: its name is returned as the model's."""
    name = dotted(call.func)
    if name is None:
        return None
    parent, _, member = name.rpartition(".")
    if (
        ctx.facts.flow.kind_of(name, call) is not Kind.MODEL
        and parent
        and defined_by_a_module_class(ctx.model, member)
        and _prepared_model_named(ctx, parent, call)
    ):
        return name
    return _prepared_model_named(ctx, name, call)


def _prepared_model_named(ctx: Context, name: str, call: cst.Call) -> str | None:
    through = _model_through_partial(ctx, name, call)
    if ctx.facts.flow.kind_of(name, call) is not Kind.MODEL and through is None:
        return None
    outer = through or (
        name if name in ctx.prepared_after else ctx.facts.flow.outer_name(name, call)
    )
    if outer not in ctx.prepared_after:
        outer = _held_by_the_instance(ctx, name, call) or outer
    if outer not in ctx.prepared_after or outer in ctx.frozen:
        return None
    if not ctx.after_prepare(call, outer) or _rebound_between(
        ctx, name, ctx.prepared_after[outer], call
    ):
        return None
    if _passed_for_parameter(ctx, name, call) is not None and not _on_device_at_every_call(
        ctx, name, outer, call
    ):
        return None
    return name


def _model_through_partial(ctx: Context, name: str, call: cst.Call) -> str | None:
    """``model`` for the parameter of ``evaluate(model, loader)`` that only ``partial(evaluate,
    model)`` fills (the flow follows no call there, so it knows nothing of the parameter): the
    one model name every such partial hands over."""
    function = ctx.facts.placement.enclosing_function(call)
    if function is None or "." in name or ctx.facts.flow.call_site_arguments(name, call):
        return None
    passed = partial_arguments(ctx.model, function, name) or []
    outer = {dotted(argument.value) for argument in passed}
    if len(outer) != 1 or None in outer:
        return None
    (found,) = outer
    return found if ctx.facts.flow.kind_of(found, passed[0]) is Kind.MODEL else None


def _held_by_the_instance(ctx: Context, name: str, call: cst.Call) -> str | None:
    """``self.model`` for ``obj.model(x)`` in ``main()`` after ``obj = Setup(...)``, where
    ``Setup`` prepares its ``self.model`` (`Context.instance_outside_class`, as the backward
    finds ``obj.accelerator``)."""
    base, _, attribute = name.partition(".")
    if not attribute or "." in attribute:
        return None
    return f"self.{attribute}" if ctx.instance_outside_class(call) == base else None


def _on_device_at_every_call(ctx: Context, parameter: str, outer: str, call: cst.Call) -> bool:
    """A helper's ``model`` parameter holds the model on the device at every call of the
    helper: each passes the prepared name itself, after its prepare or after the move the
    conversion puts before the model is first handed on (`devices`); a call made before that
    hands over the model still on the CPU."""
    binding = next((b for b in ctx.model.of_kind(Kind.MODEL) if b.name == outer), None)
    handed = handed_on_before_prepare(ctx, outer, binding.statement) if binding else None
    moved_at = ctx.model.order(handed) if handed is not None else None
    passed = _call_site_arguments(ctx, parameter, call)
    return bool(passed) and all(
        dotted(argument.value) == outer
        and (
            ctx.after_prepare(argument, outer)
            or (moved_at is not None and ctx.model.order(argument) >= moved_at)
        )
        for argument in passed
    )


def _rebound_between(ctx: Context, name: str, since: cst.CSTNode, call: cst.Call) -> bool:
    """``net = Net()`` again after training, to load the saved weights: the name no longer
    holds what prepare placed (the fresh model is on the CPU)."""
    start, end = ctx.model.order(since), ctx.model.order(call)
    scope = ctx.model.scope_of(call) if "." not in name else ctx.model.module
    return any(
        start < ctx.model.order(node) < end and _values_bound(node, name)
        for node in walk(scope)
        if isinstance(node, (cst.Assign, cst.AnnAssign))
    )


def _stays(value: cst.BaseExpression) -> bool:
    """A constant, or an input that already says where it goes (``x.to(...)``)."""
    if isinstance(value, (cst.BaseNumber, cst.BaseString, cst.Ellipsis)):
        return True
    if isinstance(value, cst.Name) and value.value in ("None", "True", "False"):
        return True
    return isinstance(value, cst.Call) and names_a_device(value)


#: torch functions that make a tensor on the CPU when no device is given.
FACTORIES = frozenset(
    {
        "randn", "rand", "randint", "randperm", "zeros", "ones", "full", "empty", "eye",
        "arange", "linspace", "tensor", "as_tensor", "from_numpy", "Tensor", "FloatTensor",
        "LongTensor", "DoubleTensor", "IntTensor", "BoolTensor",
    }
)  # fmt: skip

#: Tensor methods whose result stays on the device of the tensor they are called on.
SAME_DEVICE_METHODS = frozenset(
    {
        "float", "double", "long", "int", "half", "bool", "view", "reshape", "unsqueeze",
        "squeeze", "permute", "transpose", "contiguous", "clone", "detach", "flatten", "t",
        "type", "normal_", "uniform_",
    }
)  # fmt: skip


def torch_factory(call: cst.Call) -> str | None:
    """``randn`` of ``torch.randn(b, z)``: the `FACTORIES` member ``call`` runs, if any."""
    name = dotted(call.func) or ""
    made = name[len("torch.") :]
    return made if name.startswith("torch.") and made in FACTORIES else None


def device_given(call: cst.Call) -> bool:
    """``torch.zeros(n, device=d)``: the call says where its tensor goes."""
    return any(a.keyword is not None and a.keyword.value == "device" for a in call.args)


@dataclass(frozen=True)
class _Unpacked:
    """Element ``index`` of what ``call`` returns: ``X_test`` of ``X_test, y_test =
    make_data(200)``."""

    call: cst.Call
    index: int


@dataclass(frozen=True)
class _ElementOf:
    """An element of what ``value`` holds: ``inputs`` of ``inputs, targets = batch`` (a
    method's parameter a loop over a loader hands each batch)."""

    value: cst.BaseExpression


def _made_on_host(
    ctx: Context,
    value: cst.BaseExpression | _Unpacked | _ElementOf,
    at: cst.CSTNode,
    depth: int = 0,
) -> bool:
    """``value`` is a tensor the original made on the CPU (see the module's docstring)."""
    if depth > 8:
        return False
    if isinstance(value, _ElementOf):  # an element of a host value, as ``value[i]`` is
        return _made_on_host(ctx, value.value, at, depth + 1)
    if isinstance(value, _Unpacked):
        returned = _returns_of(ctx, value.call)
        return bool(returned) and all(
            (element := _element(r.value, value.index)) is not None
            and _made_on_host(ctx, element, r, depth + 1)
            for r in returned
        )
    if isinstance(value, (cst.BaseNumber, cst.BaseString)):
        return True
    if isinstance(value, (cst.List, cst.Tuple)):  # ``torch.stack([a, b])``'s list
        items = [e.value for e in value.elements if not isinstance(e, cst.StarredElement)]
        return (
            bool(items)
            and len(items) == len(value.elements)
            and all(_made_on_host(ctx, item, at, depth + 1) for item in items)
        )
    if isinstance(value, (cst.ListComp, cst.GeneratorExp)):
        # ``[dataset[i][0] for i in range(4)]``: each element as written (one that is the
        # comprehension's own variable is whatever it iterates: not followed)
        own = {
            n.value
            for f in _comprehension_fors(value)
            for n in walk(f.target)
            if isinstance(n, cst.Name)
        }
        return not (isinstance(value.elt, cst.Name) and value.elt.value in own) and _made_on_host(
            ctx, value.elt, at, depth + 1
        )
    if isinstance(value, cst.Call):
        func = value.func
        if torch_factory(value) is not None:
            return not device_given(value)
        if _sent_to_the_host(ctx, value, at):
            return True  # ``feats = encoder(x).cpu()``: whatever it was made from
        if (dotted(func) or "") in JOINED and value.args:  # a stack of host tensors
            return _made_on_host(ctx, value.args[0].value, at, depth + 1)
        if any(q.endswith("TensorDataset") for q in ctx.model.qualified(func)):
            return True  # its items, ``dataset[i][0]``: the tensors it was made of, never moved
        if isinstance(func, cst.Attribute) and func.attr.value in SAME_DEVICE_METHODS:
            return _made_on_host(ctx, func.value, at, depth + 1)
        returned = _returns_of(ctx, value)
        return bool(returned) and all(
            r.value is not None and _made_on_host(ctx, r.value, r, depth + 1) for r in returned
        )
    if isinstance(value, cst.Comparison):
        return _made_on_host(ctx, value.left, at, depth + 1) and all(
            _made_on_host(ctx, c.comparator, at, depth + 1) for c in value.comparisons
        )
    if isinstance(value, cst.Subscript):
        return _made_on_host(ctx, value.value, at, depth + 1)
    if isinstance(value, cst.BinaryOperation):
        return all(_made_on_host(ctx, side, at, depth + 1) for side in (value.left, value.right))
    if isinstance(value, cst.UnaryOperation):
        return _made_on_host(ctx, value.expression, at, depth + 1)
    name = dotted(value)
    if name is None or name == "self":
        return False
    if (
        _batch_of_a_whole_loader(ctx, name, at)
        or _item_of_a_whole_loader(ctx, name, at)
        or _mapped_over_whole_loaders(ctx, name, at)
        or _batch_of_handed_whole_loaders(ctx, name, at)
    ):
        return True
    passed = _passed_for_parameter(ctx, name, at)
    if passed is not None:
        return bool(passed) and all(_made_on_host(ctx, a.value, a, depth + 1) for a in passed)
    reaching = reaching_assignment(ctx, name, at) if "." not in name else None
    if reaching is not None:  # ``state = torch.tensor(state).float()`` above the call
        values = _values_bound(reaching, name)
        if values and all(_empty_list(v) for v in values):  # ``feats = []`` then appended
            appended = _appended(ctx, name, reaching)
            return bool(appended) and all(_made_on_host(ctx, v, a, depth + 1) for v, a in appended)
        return bool(values) and all(
            v is not None and _made_on_host(ctx, v, reaching, depth + 1) for v in values
        )
    assigned = assigned_values(ctx, name, at)
    return bool(assigned) and all(
        v is not None and _made_on_host(ctx, v, at, depth + 1) for v in assigned
    )


def _empty_list(value: object) -> bool:
    return isinstance(value, cst.List) and not value.elements


def _appended(
    ctx: Context, name: str, bound: cst.CSTNode
) -> list[tuple[cst.BaseExpression, cst.Call]]:
    """What ``name.append(v)`` adds to the list ``bound`` made empty, in the same function:
    ``feats.append(encoder(x).cpu())`` of a feature collector. Nothing (not known) when the
    list is also extended, inserted into or handed to a call."""
    function = ctx.facts.placement.enclosing_function(bound)
    found = []
    for call in ctx.model.calls:
        if ctx.facts.placement.enclosing_function(call) is not function:
            continue
        func = call.func
        if isinstance(func, cst.Attribute) and dotted(func.value) == name:
            if func.attr.value != "append":
                if func.attr.value in ("extend", "insert", "__setitem__", "__iadd__"):
                    return []
                continue
            if len(call.args) != 1:
                return []
            found.append((call.args[0].value, call))
        elif (
            any(dotted(argument.value) == name for argument in call.args)
            and (dotted(func) or "") not in JOINED
        ):
            return []
    return found


def _sent_to_the_host(ctx: Context, call: cst.Call, at: cst.CSTNode) -> bool:
    """``x.cpu()``, ``x.to("cpu")``: the original moves the value to the host itself (a linear
    probe trained on ``feats = encoder(x).cpu()``), wherever ``x`` was."""
    func = call.func
    if not isinstance(func, cst.Attribute):
        return False
    if func.attr.value == "cpu":
        return not call.args
    target = moved_to(call) if func.attr.value == "to" else None
    return target is not None and _always_cpu(ctx, target, at)


#: torch functions that join tensors into one on their device: ``torch.stack(samples)``
JOINED = frozenset(
    {"torch.stack", "torch.cat", "torch.concat", "torch.vstack", "torch.hstack", "torch.dstack"}
)


def _comprehension_fors(value: cst.ListComp | cst.GeneratorExp) -> list[cst.CompFor]:
    fors = []
    current: cst.CompFor | None = value.for_in
    while current is not None:
        fors.append(current)
        current = current.inner_for_in
    return fors


def _returns_of(ctx: Context, call: cst.Call) -> list[cst.Return]:
    """The ``return`` statements of the function of this file ``call`` runs (``make_data(200)``,
    ``self.sample_noise(8)``); nothing for a class, a generator, or a call the file does not
    define. Each returned value is judged where it is made, in that function."""
    target = ctx.facts.calls.callee(call)
    if target is None or target[0].name.value == "__init__":
        return []
    function = target[0]
    if any(isinstance(n, cst.Yield) for n in ctx.model.index.own_nodes(function)):
        return []
    return ctx.model.index.own_returns(function)


def _element(value: cst.BaseExpression | None, index: int) -> cst.BaseExpression | None:
    """Element ``index`` of a returned tuple or list written out (``return X, y``)."""
    if not isinstance(value, (cst.Tuple, cst.List)) or len(value.elements) <= index:
        return None
    element = value.elements[index]
    return None if isinstance(element, cst.StarredElement) else element.value


def _passed_for_parameter(ctx: Context, name: str, at: cst.CSTNode) -> list[cst.Arg] | None:
    """What the callers pass for ``name`` when it is a parameter of the function around ``at``
    that the function never rebinds (``evaluate(model, X_test, y_test)`` for ``X``); None when
    it is no such parameter."""
    function = ctx.facts.placement.enclosing_function(at)
    if function is None or "." in name or not has_parameter(function, name):
        return None
    if any(_values_bound(node, name) for node in walk(function.body)):
        # rebound inside: what it holds at ``at`` is the rebinding that reaches it for sure
        # (``state = torch.tensor(state).float()`` above ``model(state)``), else not known
        return None if reaching_assignment(ctx, name, at) is not None else []
    return _call_site_arguments(ctx, name, at)


def _call_site_arguments(ctx: Context, parameter: str, at: cst.CSTNode) -> list[cst.Arg]:
    """What the calls of the function around ``at`` pass for its ``parameter``, those made
    through ``functools.partial`` included (``check = partial(evaluate, model)`` then
    ``check(val_loader)``: ``model`` and ``val_loader``), and an unpacked argument that may
    fill it (``*batch`` of ``score(model, *batch)``: an element of ``batch`` is made where
    ``batch`` is)."""
    function = ctx.facts.placement.enclosing_function(at)
    if function is None:
        return []
    through = partial_arguments(ctx.model, function, parameter)
    if through is None:
        return []  # a partial may fill it with what is not known here
    unpacked = [
        argument
        for call, implicit in ctx.facts.flow.calls_of(function)
        for argument in unpacked_arguments_for(function, call, parameter, implicit)
    ]
    return ctx.facts.flow.call_site_arguments(parameter, at) + unpacked + through


def _batch_of_handed_whole_loaders(ctx: Context, name: str, at: cst.CSTNode) -> bool:
    """``x`` of ``for x, y in loader:`` in ``evaluate(model, loader)``, whose every call hands
    ``loader`` a DataLoader the conversion leaves whole, also through ``functools.partial``
    (``check(val_loader)`` after ``check = partial(evaluate, model)``, which the flow does not
    follow): its batches are made on the host."""
    root = name.split(".")[0]
    for loop in ctx.model.ancestors(at):
        if not isinstance(loop, cst.For) or root not in target_names(loop.target):
            continue
        iterated = dotted(loop.iter)
        if (
            iterated is None
            or _trains(ctx, loop)
            or ctx.facts.flow.call_site_arguments(iterated, loop)
        ):
            return False  # a call the flow follows: `_batch_of_a_whole_loader` judges it
        passed = _passed_for_parameter(ctx, iterated, loop)
        return bool(passed) and all(not a.star and _a_whole_loader(ctx, a.value, a) for a in passed)
    return False


def assigned_values(
    ctx: Context, name: str, at: cst.CSTNode
) -> list[cst.BaseExpression | _Unpacked | _ElementOf | None]:
    """What each assignment of ``name`` binds it to, in the scope it is read from (``self.x``:
    anywhere in the class); None for a binding whose value is not known (a parameter, a loop
    target, an unpacked call). Nothing when the name is never assigned."""
    owner = ctx.facts.placement.class_of(at) if name.startswith("self.") else None
    function = ctx.facts.placement.enclosing_function(at)
    if owner is not None:
        scopes: list[cst.CSTNode] = [owner]
    elif "." in name:
        return []
    else:
        scopes = (
            [function] if function is not None and _binds(function, name) else [ctx.model.module]
        )
    found: list[cst.BaseExpression | _Unpacked | _ElementOf | None] = []
    for scope in scopes:
        if isinstance(scope, cst.FunctionDef) and has_parameter(scope, name):
            found.append(None)
        for node in walk(scope):
            if (
                scope is ctx.model.module
                and node is not scope
                and isinstance(node, (cst.FunctionDef, cst.ClassDef))
            ):
                continue
            found.extend(_values_bound(node, name))
    return found


def _binds(function: cst.FunctionDef, name: str) -> bool:
    return has_parameter(function, name) or any(_values_bound(n, name) for n in walk(function))


def _values_bound(
    node: cst.CSTNode, name: str
) -> list[cst.BaseExpression | _Unpacked | _ElementOf | None]:
    """What ``node`` binds ``name`` to: ``x = v`` gives v, ``a, x = u, v`` gives v, ``a, x =
    f()`` gives element 1 of what ``f`` returns, ``a, x = batch`` an element of ``batch``; a
    loop, a ``with ... as``, a starred or nested unpacking or a walrus give None (not known)."""
    if isinstance(node, cst.Assign):
        return [v for t in node.targets for v in _matched(t.target, node.value, name)]
    if isinstance(node, (cst.AnnAssign, cst.AugAssign)) and node.value is not None:
        if dotted(node.target) != name:
            return []
        return [node.value] if isinstance(node, cst.AnnAssign) else [None]
    if isinstance(node, (cst.For, cst.CompFor)) and name in _names_of(node.target):
        return [None]
    if isinstance(node, cst.AsName) and name in _names_of(node.name):
        return [None]
    if isinstance(node, cst.NamedExpr) and dotted(node.target) == name:
        return [None]
    return []


def _matched(target: cst.BaseExpression, value: cst.BaseExpression, name: str) -> list:
    if dotted(target) == name:
        return [value]
    if isinstance(target, (cst.Tuple, cst.List)):
        elements = [e.value for e in target.elements]
        pairs = unpacked_pairs(target, value)
        if pairs is not None:
            return [v for t, paired in pairs for v in _matched(t, paired, name)]
        positions = [i for i, t in enumerate(elements) if dotted(t) == name]
        flat = not any(isinstance(e, cst.StarredElement) for e in target.elements)
        if isinstance(value, cst.Call) and flat and len(positions) == 1:
            return [_Unpacked(value, positions[0])]
        if dotted(value) is not None and flat and len(positions) == 1:
            return [_ElementOf(value)]
        if name in set().union(*(_names_of(t) for t in elements)):
            return [None]
    return []


def _names_of(target: cst.BaseExpression) -> set[str]:
    """Names and ``self.x`` attributes a target binds."""
    if isinstance(target, (cst.Tuple, cst.List)):
        return set().union(*(_names_of(e.value) for e in target.elements))
    if isinstance(target, cst.StarredElement):
        return _names_of(target.value)
    name = dotted(target)
    return {name} if name else set()


def reaching_value(ctx: Context, name: str, at: cst.CSTNode) -> cst.BaseExpression | None:
    """The value of the assignment of ``name`` that reaches ``at`` for sure (`reaching_assignment`;
    of an unpacking, its whole value)."""
    assign = reaching_assignment(ctx, name, at)
    return assign.value if assign is not None else None


def reaching_assignment(ctx: Context, name: str, at: cst.CSTNode) -> cst.Assign | None:
    """The assignment of ``name`` that reaches ``at`` for sure: the last binding
    of ``name`` before ``at`` in ``at``'s function (or module), an assignment (also an
    unpacking: its whole value) in a block around ``at``, with no binding of ``name`` in a
    loop around ``at`` that does not hold that assignment (a later iteration's value)."""
    function = ctx.model.index.enclosing_function(at)
    scope = function if function is not None else ctx.model.module
    here = ctx.model.order(at)
    bindings = [
        node
        for node in walk(scope)
        if isinstance(node, cst.Name)
        and node.value == name
        and is_binding(ctx.model, node)
        and ctx.model.index.enclosing_function(node) is function
    ]
    before = [node for node in bindings if ctx.model.order(node) < here]
    if not before:
        return None
    last = max(before, key=ctx.model.order)
    assign = next(
        (a for a in ctx.model.ancestors(last) if isinstance(a, (cst.Assign, cst.BaseStatement))),
        None,
    )
    if not isinstance(assign, cst.Assign) or not any(
        name in target_names(t.target) for t in assign.targets
    ):
        return None
    statement = ctx.model.parent(assign)
    block = ctx.model.parent(statement) if statement is not None else None
    if block is None or not ctx.model.inside(at, block):
        return None
    for loop in ctx.model.ancestors(at):
        if loop is scope:
            break
        if (
            isinstance(loop, (cst.For, cst.While))
            and not ctx.model.inside(assign, loop)
            and any(ctx.model.inside(node, loop) for node in bindings)
        ):
            return None
    return assign
