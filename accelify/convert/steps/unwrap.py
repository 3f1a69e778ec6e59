"""11. After prepare a model may be a DDP wrapper: ``model.module``, its state dict, its own
attributes and methods (``model.fc1``, ``model.generate()``) are reached through
``unwrap_model``. A prepared optimizer or LR scheduler is a wrapper too: a type check of it
(``isinstance(scheduler, ReduceLROnPlateau)``) asks the object it wraps."""

from __future__ import annotations

import libcst as cst

from accelify.analysis import names
from accelify.analysis.objects import bound_arguments, callee, methods_of, property_alias
from accelify.analysis.outside_forward import (
    defined_by_a_module_class,
    in_training_step,
)
from accelify.analysis.script_model import Kind, value_classifier
from accelify.analysis.syntax import dotted, walk
from accelify.convert.steps.context import Context, unwrap
from accelify.convert.steps.devices import never_prepared
from accelify.convert.steps.saved_states import gather_or_review, saved_state
from accelify.convert.steps.through_forward import outside_the_wrapper
from accelify.edits import rewrites
from accelify.edits.node_rewrites import Swap

#: Calls that trace or export a model: a DDP wrapper's forward does not trace
#: (``SummaryWriter.add_graph``, ``torch.jit.trace``, ``torch.onnx.export``).
TRACERS = {"add_graph"}
TRACE_FUNCTIONS = {"torch.jit.trace", "torch.jit.script", "torch.onnx.export"}


def run(ctx: Context) -> None:
    _attributes(ctx)
    _layers_by_index(ctx)
    _traced(ctx)
    _handed_out_of_reach(ctx)
    _handed_to_read_the_wrapper(ctx)
    _handed_to_another_module(ctx)
    _handed_to_be_copied(ctx)
    _copied(ctx)
    _type_checked(ctx)
    _model_types(ctx)


#: What a prepared object of each kind keeps the script's own object in, on accelify's runtime
#: and on Hugging Face Accelerate alike (``AcceleratedScheduler.scheduler``).
WRAPPED_IN = {Kind.SCHEDULER: "scheduler", Kind.OPTIMIZER: "optimizer"}


def _type_checked(ctx: Context) -> None:
    """``isinstance(self.scheduler, CosineAnnealingWarmRestarts)`` after prepare: the prepared
    scheduler is a wrapper, so the check is False on every rank and the script takes its other
    branch (``scheduler.step()`` instead of ``step(epoch)``; for ReduceLROnPlateau a step
    without its metric, a TypeError). The check asks the wrapped object instead."""
    for call in ctx.model.calls:
        if ctx.model.call_names(call) != {"builtins.isinstance"} or len(call.args) != 2:
            continue
        checked = call.args[0].value
        if not isinstance(checked, (cst.Name, cst.Attribute)):
            continue
        name = dotted(checked)
        member = WRAPPED_IN.get(ctx.facts.flow.kind_of(name, call))  # type: ignore[arg-type]
        if member is None or name not in ctx.plan.prepared or not ctx.after_prepare(call, name):
            continue
        ctx.plan.replace(
            checked,
            Swap(f"{name}.{member}"),
            ctx.line(call),
            f"isinstance({name}, ...) -> isinstance({name}.{member}, ...): the prepared "
            f"{member} wraps the script's own",
        )


def _model_types(ctx: Context) -> None:
    """``type(model).__name__``, ``model.__class__`` or ``isinstance(model, Student)`` of a
    prepared model: on several ranks it is the DDP wrapper, so a printed name reads
    "DistributedDataParallel" and a check of the script's own class is False (the script
    takes its other branch), while one process gives the model's own. Asked of
    ``unwrap_model(model)``, every run gives the original's answer."""
    for node in ctx.facts.placement.all_nodes():
        model = _typed_model(ctx, node)
        if model is None:
            continue
        text = f"the type of {ctx.a('unwrap_model')}({dotted(model)}), not of the DDP wrapper"
        _unwrap_prepared(ctx, model, node, text)


def _unwrap_prepared(
    ctx: Context, model: cst.Name | cst.Attribute, at: cst.CSTNode, text: str
) -> None:
    """``model`` -> ``unwrap_model(model)`` at ``at`` when it names a model prepare wrapped
    by then."""
    name = dotted(model)
    if (
        _never_wrapped(ctx, name, at)
        or not ctx.facts.flow.is_model_name(name, at)
        or not ctx.after_prepare(at, name)
    ):
        return
    unwrap(ctx, model, at, text, gives_way_to=[model])


def _typed_model(ctx: Context, node: cst.CSTNode) -> cst.Name | cst.Attribute | None:
    """The name whose type ``node`` reads: ``type(x)``, ``isinstance(x, C)``, ``x.__class__``."""
    if isinstance(node, cst.Attribute) and node.attr.value == "__class__":
        owner = node.value
    elif isinstance(node, cst.Call) and node.args:
        called = ctx.model.call_names(node)
        one = called == {"builtins.type"} and len(node.args) == 1
        if not (one or (called == {"builtins.isinstance"} and len(node.args) == 2)):
            return None
        owner = node.args[0].value
    else:
        return None
    return owner if isinstance(owner, (cst.Name, cst.Attribute)) else None


def _handed_out_of_reach(ctx: Context) -> None:
    """``self.early_stopping(val_loss, self.model)`` where the callee (a class without the
    accelerator) only reads the model's state (``torch.save({"model": model.state_dict()})``):
    the prepared model is unwrapped at the call, inside the class, so the checkpoint holds the
    model's own keys (not DDP's ``module.`` ones) and loads back into the unwrapped model."""
    for function, received in ctx.facts.flow.params.items():
        if ctx.plan.reaches(function):
            continue
        for parameter, kind in received.items():
            if kind is not Kind.MODEL or not _reads_state_only(ctx, function, parameter, set()):
                continue
            _unwrap_where_handed(
                ctx,
                function,
                parameter,
                "which reads its state_dict() where the accelerator is not reachable",
            )


def _handed_to_read_the_wrapper(ctx: Context) -> None:
    """``count_children(trainer.model)`` where the helper, out of the accelerator's reach,
    reads what the DDP wrapper answers for itself: ``list(m.children())`` (the wrapper's one
    child, the whole model), ``m.named_parameters()`` (``module.`` names), ``m.fc`` (no such
    attribute: AttributeError), ``m[0]``. On one process the helper sees the model; on two it
    saw the wrapper (review10a: a printed count went from 3 to 1). A helper that only reads
    the model is handed ``unwrap_model(model)`` at each call after the prepare; one that also
    runs the model (its forward through the wrapper is what DDP synchronises) or hands it on is
    left as it is, with a review line at the call that says what to change in the helper."""
    for function, received in ctx.facts.flow.params.items():
        if ctx.plan.reaches(function):
            continue
        for parameter, kind in received.items():
            if kind is not Kind.MODEL or _reads_state_only(ctx, function, parameter, set()):
                continue
            reads, other = _wrapper_reads(ctx, function, parameter)
            if not reads:
                continue
            if not other:
                _unwrap_where_handed(
                    ctx,
                    function,
                    parameter,
                    f"which reads {_shown_reads(reads)} of it: of the model, not of its DDP "
                    "wrapper",
                    surely=True,
                )
            _review_where_handed(ctx, function, parameter, reads, other)


def _wrapper_reads(
    ctx: Context, function: cst.FunctionDef, parameter: str
) -> tuple[list[cst.CSTNode], list[str]]:
    """The uses of ``parameter`` in ``function`` that the DDP wrapper answers other than the
    model (`NAMED_MEMBERS`, the model's own attributes, an index), and what else the function
    does with it that unwrapping would change (runs it, hands it on, keeps it)."""
    reads: list[cst.CSTNode] = []
    other: list[str] = []
    for use in walk(function.body):
        if not (isinstance(use, cst.Name) and use.value == parameter):
            continue
        parent = ctx.model.parent(use)
        if isinstance(parent, cst.Attribute) and parent.value is use:
            member = parent.attr.value
            if member == "module" or member.startswith("__"):
                other.append(f"{parameter}.{member}")
            elif member in NAMED_MEMBERS or member not in names.MODULE_API:
                reads.append(parent)
            continue
        if isinstance(parent, cst.Subscript) and parent.value is use:
            reads.append(parent)
        elif isinstance(parent, cst.Call) and parent.func is use:
            other.append(f"runs {parameter}(...)")
        else:
            other.append(f"hands {parameter} on at line {ctx.line(use)}")
    return reads, other


def _shown_reads(reads: list[cst.CSTNode]) -> str:
    """``m.children(), m.fc``: each read once, as the helper writes it."""
    shown: list[str] = []
    for read in reads:
        if isinstance(read, cst.Subscript):
            text = f"{dotted(read.value)}[...]"
        elif isinstance(read, cst.Attribute) and read.attr.value in names.MODULE_API:
            text = f"{dotted(read)}()"
        else:
            text = dotted(read) or ""
        if text not in shown:
            shown.append(text)
    return ", ".join(shown)


def _wrapper_answer(read: cst.CSTNode) -> str:
    """What the DDP wrapper gives for ``read`` where the model gave its own."""
    member = read.attr.value if isinstance(read, cst.Attribute) else None
    if member is None:
        return "which cannot be indexed: TypeError"
    if member in ("children", "named_children"):
        return "its one child is the whole model"
    if member in ("modules", "named_modules"):
        return "the wrapper is counted too"
    if member in NAMED_MEMBERS:
        return "every name gains a module. prefix"
    return f"which has no attribute {member}: AttributeError"


def _review_where_handed(
    ctx: Context,
    function: cst.FunctionDef,
    parameter: str,
    reads: list[cst.CSTNode],
    other: list[str],
) -> None:
    """A review line at the helper's first read of the wrapper (where the change is made, and
    where lint's finding sits), naming the calls that hand ``function`` a prepared model after
    the prepare, where ``function`` also does what unwrapping at the call would change
    (``other``); with nothing else (``other`` empty), the calls where no accelerator is reached
    to unwrap it (`_unwrap_where_handed` took the others)."""
    handed: list[tuple[cst.Call, str]] = []
    for call, implicit in ctx.facts.flow.calls_of(function):
        if not other and (ctx.plan.reaches(call) or ctx.instance_outside_class(call)):
            continue
        for name, argument in bound_arguments(function, call, implicit):
            model = argument.value
            shown = dotted(model) if isinstance(model, (cst.Name, cst.Attribute)) else None
            if (
                name == parameter
                and shown is not None
                and shown not in ctx.frozen
                and ctx.facts.flow.is_model_name(shown, call)
                and _surely_after_prepare(ctx, call, shown)
            ):
                handed.append((call, shown))
    if not handed:
        return
    call, shown = handed[0]
    acc = ctx.reachable_accelerator(call) or "accelerator"
    helper = function.name.value
    lines = ", ".join(str(ctx.line(c)) for c, _ in handed)
    why = (
        f"it also {other[0]}, which must stay the wrapper"
        if other
        else "no accelerator is reachable there to unwrap it"
    )
    ctx.plan.review(
        ctx.line(reads[0]),
        f"{helper}() is handed the prepared {shown} (line {lines}) and reads "
        f"{_shown_reads(reads)} of it: on more than one process it reads the DDP wrapper "
        f"({_wrapper_answer(reads[0])}), and {why}; left as it is: in {helper}(), read those "
        f"through {acc}.unwrap_model({parameter}) (handing it the accelerator), or hand it "
        f"{acc}.unwrap_model({shown}) at the call if it never trains it",
    )


def _handed_to_another_module(ctx: Context) -> None:
    """``test(kwargs)`` of the project's test.py, handed the prepared model (or a dict that
    holds it), which calls ``model.loss(...)`` there: on more than one process the model is the
    DDP wrapper, which has no such attribute. That module is not converted with this file, so
    the call is said, with what to write there."""
    flow = ctx.facts.flow
    for call in ctx.model.calls:
        function = dotted(call.func)
        where = ctx.imported_model_methods.get(function or "")
        if where is None:
            continue
        handed = []
        for argument in call.args:
            handed.append(dotted(argument.value))
            held = flow.dict_display(argument.value, call) or {}
            handed += [dotted(value) for value in held.values()]
        models = [
            n
            for n in handed
            if n is not None and n in ctx.plan.prepared and flow.is_model_name(n, call)
        ]
        if not models:
            continue
        method = where.split(" at ")[0]
        ctx.plan.review(
            ctx.line(call),
            f"{function}() is handed the prepared {models[0]} and calls {where}, a method of "
            f"the model besides its forward: on more than one process {models[0]} is the DDP "
            f"wrapper, which has no such attribute (AttributeError); that module is not "
            f"converted with this file: call it there through the unwrapped model "
            f"({ctx.a('unwrap_model')}({method.split('.')[0]}).{method.split('.', 1)[1]}, "
            f"handing {function}() the accelerator)",
        )


def _handed_to_be_copied(ctx: Context) -> None:
    """``ema = EMA(model)`` after prepare, whose constructor keeps ``copy.deepcopy(model)``:
    the copy would be of the DDP wrapper (a second wrapper, whose state dict prefixes every key
    with ``module.``: a checkpoint of it no longer loads into the script's model). Where the
    callee only copies the model or reads its state, it is handed the unwrapped model at the
    call; the other uses of the prepared model (``ema.update(model)``) stay as they are."""
    for function, received in ctx.facts.flow.params.items():
        for parameter, kind in received.items():
            if kind is not Kind.MODEL or not _copies_only(ctx, function, parameter):
                continue
            _unwrap_where_handed(
                ctx,
                function,
                parameter,
                "which keeps a copy of it (copy.deepcopy): a copy of the model, not of its DDP "
                "wrapper",
            )


def _copied(ctx: Context) -> None:
    """``fast = copy.deepcopy(self.model)`` after prepare (MAML's fast weights, an EMA or a
    target network made late): the copy would be of the DDP wrapper, a second wrapper whose
    backward all-reduces with the other ranks on its own (a hang where the ranks adapt a
    different number of copies) and whose state dict prefixes every key with ``module.``.
    The model itself is copied: ``copy.deepcopy(accelerator.unwrap_model(self.model))``, on the
    device, trained or averaged by this rank alone as in the original."""
    for call in ctx.model.calls:
        if not call.args or "copy.deepcopy" not in ctx.model.call_names(call):
            continue
        model = call.args[0].value
        if not isinstance(model, (cst.Name, cst.Attribute)):
            continue
        shown = dotted(model)
        if (
            shown is None
            or shown in ctx.frozen
            or shown not in ctx.plan.prepared
            or not ctx.facts.flow.is_model_name(shown, call)
            or not _same_object(ctx, shown, call)
            or not ctx.after_prepare(call, shown)
            or not ctx.plan.reaches(call)
        ):
            continue
        unwrap(
            ctx,
            model,
            call,
            f"copy.deepcopy({shown}) -> copy.deepcopy({ctx.a('unwrap_model')}({shown})): a copy "
            "of the model, not of its DDP wrapper",
            gives_way_to=[model],
        )


def _same_object(ctx: Context, shown: str, at: cst.CSTNode) -> bool:
    """``shown`` at ``at`` is the name prepare rebinds: a local of the preparing scope, or
    ``self.x`` in the preparing class or a subclass of it (its instances are prepared by the
    inherited method). A parameter of another function that happens to share the
    name (``EMA.__init__(self, model)``) is unwrapped at its call sites (`_handed_to_be_copied`)."""
    anchor = ctx.prepared_after.get(shown)
    if anchor is None:
        return False
    placement = ctx.facts.placement
    if shown.startswith("self."):  # the preparing class's methods, or a subclass's
        owner, here = placement.class_of(anchor), placement.class_of(at)
        return (
            owner is not None
            and here is not None
            and ctx.model.call_graph.is_or_derives(here, owner)
        )
    return ctx.model.scope_of(at) is ctx.model.scope_of(anchor)


def _unwrap_where_handed(
    ctx: Context, function: cst.FunctionDef, parameter: str, why: str, surely: bool = False
) -> None:
    """Each reached call of ``function`` that hands it the prepared model as ``parameter`` hands
    ``accelerator.unwrap_model(model)`` instead; ``why`` says what the callee does with it.
    ``surely``: only a call that surely runs after the prepare (`_surely_after_prepare`), where
    what the callee reads of a model not yet prepared could differ (a list of its layers)."""
    for call, implicit in ctx.facts.flow.calls_of(function):
        outside = surely and ctx.instance_outside_class(call) is not None
        if not ctx.plan.reaches(call) and not outside:
            continue  # ``trainer.accelerator`` beside the instance, or the scope's own
        for name, argument in bound_arguments(function, call, implicit):
            model = argument.value
            if name != parameter or not isinstance(model, (cst.Name, cst.Attribute)):
                continue
            shown = dotted(model)
            if (
                shown in ctx.frozen
                or not ctx.facts.flow.is_model_name(shown, call)
                or not ctx.after_prepare(call, shown)
                or (surely and not _surely_after_prepare(ctx, call, shown))
            ):
                continue
            unwrap(
                ctx,
                model,
                call,
                f"hands {ctx.a('unwrap_model')}({shown}) to {ctx.code(call.func)}(), {why}",
                gives_way_to=[model],
            )


#: What reading a model's state does: nothing of it runs the model.
_STATE_READS = {"state_dict", "parameters", "named_parameters", "buffers", "named_buffers"}


def _copies_only(ctx: Context, function: cst.FunctionDef, parameter: str) -> bool:
    """``function`` deep-copies ``parameter`` and otherwise only reads its state."""
    copied = False
    for use in walk(function.body):
        if not (isinstance(use, cst.Name) and use.value == parameter):
            continue
        parent = ctx.model.parent(use)
        if isinstance(parent, cst.Attribute) and parent.value is use:
            call = ctx.model.parent(parent)
            if not (
                parent.attr.value in _STATE_READS
                and isinstance(call, cst.Call)
                and call.func is parent
            ):
                return False
            continue
        call = ctx.model.parent(parent) if isinstance(parent, cst.Arg) else None
        if not isinstance(call, cst.Call) or "copy.deepcopy" not in ctx.model.call_names(call):
            return False
        copied = True
    return copied


def _reads_state_only(
    ctx: Context, function: cst.FunctionDef, parameter: str, seen: set[tuple[int, str]]
) -> bool:
    """Every use of ``parameter`` in ``function`` reads the model's state: ``.state_dict()``,
    or hands it on to a function of this file whose parameter does the same."""
    seen.add((id(function), parameter))
    uses = [n for n in walk(function.body) if isinstance(n, cst.Name) and n.value == parameter]
    for use in uses:
        parent = ctx.model.parent(use)
        if isinstance(parent, cst.Attribute) and parent.value is use:
            call = ctx.model.parent(parent)
            if not (
                parent.attr.value == "state_dict"
                and isinstance(call, cst.Call)
                and call.func is parent
            ):
                return False
            continue
        if not isinstance(parent, cst.Arg) or parent.value is not use:
            return False
        call = ctx.model.parent(parent)
        target = callee(ctx.model, call) if isinstance(call, cst.Call) else None
        if target is None:
            return False
        handed = [n for n, a in bound_arguments(target[0], call, target[1]) if a is parent]
        if len(handed) != 1:
            return False
        if (id(target[0]), handed[0]) not in seen and not _reads_state_only(
            ctx, target[0], handed[0], seen
        ):
            return False
    return bool(uses)


def _traced(ctx: Context) -> None:
    """``writer.add_graph(model, x)`` of a prepared model -> ``add_graph(unwrap_model(model),
    x)``: the graph of the model, not of its wrapper."""
    for call in ctx.model.calls:
        func = call.func
        traces = (isinstance(func, cst.Attribute) and func.attr.value in TRACERS) or bool(
            ctx.model.call_names(call) & TRACE_FUNCTIONS
        )
        if not traces or not call.args:
            continue
        model = call.args[0].value
        if not isinstance(model, (cst.Name, cst.Attribute)):
            continue
        text = f"traces {ctx.a('unwrap_model')}({dotted(model)}), not the DDP wrapper"
        _unwrap_prepared(ctx, model, call, text)


def _layers_by_index(ctx: Context) -> None:
    """``model[0]`` of an ``nn.Sequential``: the wrapper cannot be indexed."""
    for node in ctx.facts.placement.all_nodes():
        if not isinstance(node, cst.Subscript):
            continue
        owner = node.value
        if not isinstance(owner, (cst.Name, cst.Attribute)):
            continue
        if _never_wrapped(ctx, dotted(owner), node):
            continue
        if not ctx.facts.flow.is_model_name(dotted(owner), node) or not ctx.after_prepare(
            node, dotted(owner)
        ):
            continue
        if isinstance(ctx.model.parent(node), cst.AssignTarget):
            continue
        name = dotted(owner)
        text = f"{name}[...] -> {ctx.a('unwrap_model')}({name})[...]"
        unwrap(ctx, owner, node, text, gives_way_to=[owner])


#: nn.Module methods' own parameters: a model class of the file that overrides one with others
#: (``def train(self, x_pos, x_neg)``) is called through ``unwrap_model``.
MODULE_SIGNATURES = {"train": ["mode"], "eval": [], "to": None, "cuda": ["device"]}


def _overridden_apart(ctx: Context, member: str) -> bool:
    """A model class of this file defines ``member`` with parameters nn.Module's has not: the
    DDP wrapper's own ``member`` would take the call."""
    expected = MODULE_SIGNATURES.get(member)
    for name in ctx.model.module_classes:
        method = methods_of(ctx.model, name).get(member)
        if method is None or expected is None:
            continue
        own = [p.name.value for p in method.params.params][1:]
        starred = isinstance(method.params.star_arg, cst.Param)  # ``*args`` (a bare ``*`` is not)
        if own != expected or starred or method.params.kwonly_params:
            return True
    return False


#: ``nn.Module`` methods whose result names the model's own members: on a DDP wrapper each name
#: starts with ``module.`` (``module.fc.weight``), so a printed list of parameter names, a
#: weight-decay split or a freeze matched by name after prepare reads other names than on one
#: process. Read through ``unwrap_model`` they are the model's own (on one process it returns
#: the model itself: what is printed is unchanged). ``children()``/``named_children()`` of the
#: wrapper are its one child, the whole model (``("module", model)``), not the model's layers;
#: ``modules()`` of the wrapper counts the wrapper too (review10a: a printed count grew by one).
NAMED_MEMBERS = frozenset(
    {
        "state_dict",
        "named_parameters",
        "named_buffers",
        "named_modules",
        "modules",
        "children",
        "named_children",
    }
)


def _attributes(ctx: Context) -> None:
    for attribute in ctx.facts.placement.attributes():
        member = attribute.attr.value
        if (
            member in names.MODULE_API
            and member not in NAMED_MEMBERS | {"load_state_dict"}
            and not _overridden_apart(ctx, member)
        ):
            continue
        if member == "module" or member.startswith("__"):
            continue
        owner = attribute.value
        if not isinstance(owner, (cst.Name, cst.Attribute)):
            continue
        if any(call.func is attribute for call in ctx.through_forward):
            continue  # the method runs as the wrapper's forward (`through_forward`)
        if not _is_binding_target(ctx, attribute) and _unwrap_through_instance(
            ctx, owner, attribute
        ):
            continue
        if _saved_whole(ctx, attribute) and ctx.instance_outside_class(attribute) is not None:
            continue  # ``torch.save(trainer.model.state_dict(), p)``: the save unwraps it
        # ``self.model`` of a ``@property`` that returns ``self._model``: that attribute's
        held = property_alias(ctx.model, dotted(owner), attribute) or dotted(owner)
        if _never_wrapped(ctx, held, attribute) or not ctx.facts.flow.is_model_name(
            held, attribute
        ):
            continue
        if not ctx.after_prepare(attribute, held):
            continue
        if member in NAMED_MEMBERS - {"state_dict"} and not _surely_after_prepare(
            ctx, attribute, held
        ):
            continue  # a list of names read before prepare (an optimizer's groups): as it is
        if _is_binding_target(ctx, attribute):
            if not _set_on_the_wrapper(owner):
                continue
            _review_new_module(ctx, owner, attribute)
        state = saved_state(ctx, attribute) if member == "state_dict" else None
        if state is not None and gather_or_review(ctx, owner, state):
            continue  # ``accelerator.get_state_dict(model)``
        unwrap(
            ctx,
            owner,
            attribute,
            f"{dotted(owner)}.{member} -> {ctx.a('unwrap_model')}({dotted(owner)}).{member}",
            gives_way_to=[owner],  # ``model.module`` already unwrapped
        )
        _unread_method_in_training(ctx, owner, attribute)


def _surely_after_prepare(ctx: Context, node: cst.CSTNode, name: str | None) -> bool:
    """``node`` runs after the prepare of ``name`` as far as the file shows: below it in the
    prepare's own scope, or in a function every call of which is (`Context.after_prepare` also
    takes any other function for after: right for a state dict, which unwrapping leaves the
    same on an unprepared model, but a weight-decay split a factory builds before prepare
    would gain an accelerator parameter for nothing)."""
    anchor = ctx.prepared_after.get(name or "", ctx.prepare_anchor)
    if anchor is None:
        return False
    scope = ctx.model.scope_of(anchor)
    if ctx.model.scope_of(node) is scope:
        return ctx.model.line(node) > ctx.model.line(anchor)
    instance = ctx.instance_outside_class(node)
    if (
        instance is not None
        and name is not None
        and name.startswith(f"{instance}.")
        and isinstance(scope, cst.FunctionDef)
        and scope.name.value == "__init__"
    ):  # ``trainer.model`` read below ``trainer = Trainer(...)``, whose __init__ prepares it
        # (review10a: ``list(trainer.model.children())[-1]`` was the DDP wrapper's one child)
        return True
    function = ctx.facts.placement.enclosing_function(node)
    if function is None:
        return False
    graph = ctx.facts.calls
    if (
        isinstance(scope, cst.FunctionDef)
        and scope.name.value == "__init__"
        and graph.owner(scope) is not None
        and graph.owner(function) is graph.owner(scope)
    ):  # another method of the class that prepares in __init__: run on a made instance,
        # unless __init__ itself reaches it
        return function not in _reached_from(ctx, scope)
    if graph.uncertain_callers(function):
        return False
    callers = graph.callers(function)
    return bool(callers) and all(
        ctx.model.scope_of(call) is scope and ctx.model.line(call) > ctx.model.line(anchor)
        for call in callers
    )


def _reached_from(ctx: Context, function: cst.FunctionDef) -> set[cst.FunctionDef]:
    """The functions of the file a call in ``function`` runs, directly or through others."""
    found: set[cst.FunctionDef] = set()
    todo = [function]
    while todo:
        current = todo.pop()
        for node in walk(current):
            if isinstance(node, cst.Call):
                for target in ctx.facts.calls.targets(node):
                    if target not in found:
                        found.add(target)
                        todo.append(target)
    return found


def _unread_method_in_training(
    ctx: Context, owner: cst.BaseExpression, attribute: cst.Attribute
) -> None:
    """``module.training_step(batch, i)`` through ``unwrap_model`` in a training loop that never
    calls the prepared model itself, where no class the conversion reads defines the method
    (the model's class is in a file it cannot find, or a library's): if the method runs the
    model's forward, DDP's forward never runs and the gradients are never averaged. Kept, with
    a review line that says so."""
    call = ctx.model.parent(attribute)
    member = attribute.attr.value
    if not isinstance(call, cst.Call) or call.func is not attribute:
        return
    if defined_by_a_module_class(ctx.model, member) or member in ctx.imported_layer_members:
        return
    loop = next(
        (
            loop
            for loop in ctx.model.loops
            if loop.trains and ctx.facts.placement.inside(call, loop.node)
        ),
        None,
    )
    if loop is None or not in_training_step(ctx.model, ctx.facts.placement, call):
        return
    if any(
        isinstance(node, cst.Call) and ctx.facts.flow.is_forward(node)
        for node in walk(loop.node.body)
    ):
        return  # the prepared model's own forward runs in this step
    name = dotted(owner)
    ctx.plan.review(
        ctx.line(call),
        f"{name}.{member}() is a method of a model class this conversion cannot read, and this "
        f"training loop never calls the prepared {name}(...) itself: if {member}() runs the "
        f"model's forward (self(x)), through {ctx.a('unwrap_model')} DDP's forward never runs "
        "and the gradients are never averaged across ranks; compute the loss from "
        f"{name}(...) in the loop, or convert with the file that defines the class beside "
        "this one",
    )


def _unwrap_through_instance(ctx: Context, owner: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """``trainer.model.state_dict()`` outside the class that owns ``self.accelerator`` (a
    callback handed the trainer builds ``{"model": trainer.model.state_dict(), ...}`` and saves
    it): the trainer's prepared model is the DDP wrapper, whose ``module.`` keys would not load
    back into the model, so its state is read through ``trainer.accelerator.unwrap_model``;
    ``trainer.model.load_state_dict(torch.load(trainer.ckpt))`` in ``main()`` loads the plain
    keys the save wrote into the unwrapped model the same way; ``fitter.module.weight`` is read
    from the model too (the wrapper has no ``weight``)."""
    owned = dotted(owner)
    if _saved_whole(ctx, at):
        return False  # ``torch.save(trainer.model.state_dict(), p)``: the save unwraps it
    instance = ctx.instance_outside_class(at)
    if instance is None or owned is None or not owned.startswith(f"{instance}."):
        return False
    attribute = "self." + owned.split(".", 1)[1]
    if owned.count(".") != 1 or attribute not in ctx.plan.prepared:
        return False
    if not ctx.facts.flow.is_model_name(attribute, ctx.scope):
        return False
    acc = f"{instance}.accelerator"
    member = at.attr.value  # type: ignore[attr-defined]
    state = saved_state(ctx, at) if member == "state_dict" else None  # type: ignore[arg-type]
    if state is not None and gather_or_review(ctx, owner, state, through=acc):  # type: ignore[arg-type]
        return True
    ctx.plan.add(
        rewrites.unwrap(owner, acc),
        line=ctx.line(at),
        text=f"{owned}.{member} -> {acc}.unwrap_model({owned}).{member}",
        anywhere=True,
    )
    return True


def _saved_whole(ctx: Context, attribute: cst.Attribute) -> bool:
    """``attribute`` (``x.state_dict``) is called as the object ``torch.save`` saves."""
    call = ctx.model.parent(attribute)
    argument = ctx.model.parent(call) if isinstance(call, cst.Call) else None
    save = ctx.model.parent(argument) if isinstance(argument, cst.Arg) else None
    return (
        isinstance(save, cst.Call)
        and bool(save.args)
        and save.args[0] is argument
        and bool(ctx.model.call_names(save) & names.TORCH_SAVE)
    )


def _never_wrapped(ctx: Context, name: str | None, node: cst.CSTNode) -> bool:
    """``name`` at ``node`` is not what ``prepare`` wrapped: a model left unprepared, a model
    class's own submodule, or a plain module outside the class that holds the accelerator."""
    return (
        name in ctx.frozen
        or never_prepared(ctx, name or "", ctx.model.scope_of(node))
        or _submodule(ctx, name, node)
        or _module_outside_the_class(ctx, name or "", node)
    )


def _submodule(ctx: Context, name: str | None, node: cst.CSTNode) -> bool:
    """``self.decoder`` inside a model class (``Seq2Seq(encoder, decoder)`` keeps the decoder it
    is handed): a submodule, never what ``prepare`` wrapped, which is the whole model."""
    owner = ctx.facts.placement.class_of(node)
    return (
        name is not None
        and name.startswith("self.")
        and owner is not None
        and owner.name.value in ctx.model.module_classes
    )


def _module_outside_the_class(ctx: Context, name: str, node: cst.CSTNode) -> bool:
    """``model.state_dict()`` in ``main`` after ``Trainer(model, ...).fit()``: outside the
    class that owns ``self.accelerator``, a plain name the class did not hand back (no
    assignment from one of its methods) is the module itself; the class's own attribute is
    what ``prepare`` wrapped."""
    if ctx.plan.reaches(node) or "." in name:
        return False
    scope = ctx.model.scope_of(node)
    for assign in ctx.model.index.assignments_to(name):
        if ctx.model.scope_of(assign) is not scope or not isinstance(assign.value, cst.Call):
            continue
        if any(ctx.plan.reaches(f) for f in ctx.facts.calls.targets(assign.value)):
            return False
    return True


def forwards_outside_the_wrapper(ctx: Context) -> list[tuple[int, str]]:
    """A training step that runs a prepared model's layers outside its forward
    (`accelify.analysis.outside_forward`): prepared, the DDP wrapper has no such attribute (the
    first call on 2 ranks raises AttributeError), and called through ``unwrap_model`` its
    gradients are never synchronised. Either way the conversion would be wrong, so the script
    is left as it is: the review lines that say why, one at each such call. Asked after
    ``prepare`` chose what it wraps: a frozen model is not wrapped, and may run its layers
    anywhere."""
    found = outside_the_wrapper(ctx)
    reviews = []
    for entry in found:
        if entry.call in ctx.through_forward:
            continue  # run as the wrapper's forward (`through_forward`)
        if entry.through is None:
            ran = f"{entry.what} runs the model's layers outside its forward during training"
        else:
            ran = (
                f"{entry.what} is handed the model and runs its layers outside the model's "
                f"forward during training: {entry.through}"
            )
        reviews.append(
            (
                ctx.line(entry.call),
                f"{ran}: a prepared (DDP-wrapped) model has no such attribute, and called "
                "through unwrap_model its gradients would never be synchronised across ranks; "
                "left as it is: compute it in the model's forward() (call the model itself), "
                "then convert",
            )
        )
    return reviews


def _set_on_the_wrapper(owner: cst.BaseExpression) -> bool:
    """``model.batch_size = len(y)`` / ``model.hidden = ...`` / ``self.model.fc = nn.Linear(...)``
    after prepare: set on the DDP wrapper, the attribute never reaches the model its forward
    runs (an LSTM's hidden state kept from the last batch, a head that is never used), so the
    write goes through ``unwrap_model`` as a read does. Not ``self.x = ...`` in the model's own
    class (``self`` there is the model, never the wrapper)."""
    return dotted(owner) != "self"


def _review_new_module(ctx: Context, owner: cst.BaseExpression, attribute: cst.Attribute) -> None:
    """``model.fc = nn.Linear(8, 2)`` after ``model`` is prepared (a head swapped for
    fine-tuning): set through ``unwrap_model`` it reaches the model, but DDP registered the
    parameters at prepare, so the new part's gradients are never averaged across ranks, and
    the part it replaced, still registered, gets none: on 2 ranks the next backward stopped
    with 'Expected to have finished reduction in the prior iteration'. Said in a review line
    (the conversion does not move the prepare)."""
    target = ctx.model.parent(attribute)
    assign = ctx.model.parent(target) if isinstance(target, cst.AssignTarget) else None
    if not isinstance(assign, cst.Assign) or not isinstance(assign.value, cst.Call):
        return
    written = dotted(attribute)
    if value_classifier(ctx.model)(assign.value, written or "") is not Kind.MODEL:
        return
    ctx.plan.review(
        ctx.line(assign),
        f"{written} is given a new module after {dotted(owner)} is prepared: the wrapper "
        "registered the parameters at prepare, so the new module's gradients are never "
        "averaged across ranks (and a replaced part that still needs a gradient stops DDP at "
        "the next step: 'Expected to have finished reduction'); build it before the prepare, "
        f"or prepare {dotted(owner)} (and its optimizer) again after it",
    )


def _is_binding_target(ctx: Context, attribute: cst.Attribute) -> bool:
    """``ctx.model = ...`` binds a name; it is not a use of the model."""
    parent = ctx.model.parent(attribute)
    return isinstance(parent, cst.AssignTarget) or (
        isinstance(parent, cst.Attribute) and isinstance(ctx.model.parent(parent), cst.AssignTarget)
    )
