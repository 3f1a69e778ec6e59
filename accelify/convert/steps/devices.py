"""5. Device moves: models and batches arrive where prepare puts them, ``device`` becomes
``accelerator.device``, a kept ``.cuda()`` becomes ``.to(accelerator.device)``."""

from __future__ import annotations

import string

import libcst as cst

from accelify.analysis import names
from accelify.analysis.batch_values import holds_the_batch
from accelify.analysis.dataflow import sees_binding
from accelify.analysis.device_moves import (
    batch_moves_in,
    device_choosers,
    fixed_device,
    is_cuda_literal,
    is_identity_assignment,
    model_chain_moves,
    move_receiver,
    read_as_string,
    saved_whole,
    strip_moves,
)
from accelify.analysis.field_defaults import OverriddenField, overridden_field
from accelify.analysis.flow import string_key_of
from accelify.analysis.loss_sources import made_for
from accelify.analysis.objects import bound_arguments
from accelify.analysis.script_model import Binding, Kind, Loop, number_read
from accelify.analysis.side_effects import calls_for_effect
from accelify.analysis.syntax import (
    all_params,
    attributes_in_targets,
    dotted,
    has_parameter,
    root_name,
    self_parameter,
    target_names,
    walk,
)
from accelify.convert.steps.context import Context
from accelify.convert.steps.untrained_inputs import (
    fed_prepared_batches_in_a_loop,
    fed_prepared_batches_through_a_step,
)
from accelify.edits import rewrites
from accelify.edits.kinds import InsertAfter
from accelify.edits.node_rewrites import Swap
from accelify.edits.plan import statement


def run_model_moves(ctx: Context) -> None:
    model_names = ctx.model.names_of(Kind.MODEL) - ctx.frozen
    for binding in ctx.model.of_kind(Kind.MODEL):
        if binding.name in ctx.frozen or never_prepared(ctx, binding.name, binding.scope):
            continue
        if _made_after_its_prepare(ctx, binding):
            continue
        stripped = strip_moves(binding.value)
        if stripped is binding.value:
            continue
        handed = handed_on_before_prepare(ctx, binding.name, binding.statement)
        if handed is not None:
            ctx.plan.change(
                binding.line,
                f"kept the device move of {binding.name}: line {ctx.line(handed)} hands it on "
                "before prepare places it (a copy made there would stay on the CPU)",
            )
            continue
        # Another edit of the statement (a DataParallel(...) unwrapped, the line removed)
        # decides what becomes of it: these moves give way.
        gives_way_to = [binding.value, binding.statement]
        _review_move_chosen_by_flags(
            ctx,
            binding.statement,
            binding.value,
            binding.name,
            made_here=dotted(stripped) != binding.name,
        )
        if dotted(stripped) == binding.name:
            ctx.plan.remove(
                binding.statement,
                binding.line,
                f"removed {binding.name} device move (prepare places the model)",
                gives_way_to=[binding.value],
            )
            continue
        ctx.plan.replace(
            binding.value,
            lambda updated: strip_moves(updated),
            binding.line,
            f"removed .to(device) of {binding.name} (prepare places the model)",
            gives_way_to=gives_way_to,
        )
    for line_statement, call in ctx.facts.placement.expression_statements():
        target = move_receiver(call)
        if (
            target is not None
            and dotted(target)
            in (model_names | ctx.facts.flow.param_names(Kind.MODEL)) - ctx.frozen
            and not never_prepared(ctx, dotted(target) or "", ctx.model.scope_of(line_statement))
            and not made_after_prepare(ctx, dotted(target) or "", line_statement)
        ):
            handed = handed_on_before_prepare(ctx, dotted(target) or "", line_statement)
            if handed is not None:
                ctx.plan.change(
                    ctx.line(call),
                    f"kept the device move of {dotted(target)}: line {ctx.line(handed)} hands "
                    "it on before prepare places it (a copy made there would stay on the CPU)",
                )
                continue
            ctx.plan.remove(
                line_statement,
                ctx.line(call),
                f"removed {dotted(target)} device move (prepare places the model)",
            )
            _review_move_chosen_by_flags(ctx, line_statement, call, dotted(target) or "")
        elif target is None:
            _mode_and_device(ctx, line_statement, call)
    _copies_of_unmoved_models(ctx)
    _unmoved_untrained_models(ctx)
    _fixed_moves_of_prepared_models(ctx)


def _review_move_chosen_by_flags(
    ctx: Context, moved: cst.CSTNode, move: cst.BaseExpression, name: str, made_here: bool = False
) -> None:
    """``if args.cuda: model.cuda()`` (tkipf/pygcn's shape, with the inputs moved in the same
    block): the flag chose CPU or GPU for the model; prepare places it on this rank's device
    whatever the flag says, so with the flag off on a GPU machine the model is on the GPU and
    the inputs moved under the same test stay on the CPU. Said at the ``if``, as a device
    variable chosen by a flag is (once per line: that review already covers this ``if``).

    A model built and moved in one statement (``made_here``: ``self.model = GCN(...).to(device)``
    under ``if self.model_name == "GCN":``) exists only under its test: the test chooses the
    model, not its device, unless another branch of it builds the same name unmoved."""
    flags = device_choosers(ctx.model, moved, move)
    if not flags:
        return
    branch = next(a for a in ctx.model.ancestors(moved) if isinstance(a, cst.If))
    if made_here and not _bound_in_the_other_branch(branch, name):
        return
    line = ctx.line(branch)
    if any(note.line == line for note in ctx.plan.reviews):
        return
    read = ", ".join(flags)
    ctx.plan.review(
        line,
        f"{name} was moved to the GPU only when {read} allowed it: prepare places it on "
        f"{ctx.a('device')}, this rank's, whatever {read} says, so with it off on a GPU machine "
        f"{name} runs on the GPU and what is moved only under this test stays on the CPU; "
        "for a CPU run, launch with `accelify launch --cpu` or pass Accelerator(cpu=...)",
    )


def _bound_in_the_other_branch(branch: cst.If, name: str) -> bool:
    """``name`` is assigned in ``branch``'s ``else`` (or ``elif``): ``if args.cuda: model =
    Net().cuda()`` / ``else: model = Net()``, a choice of device for one model."""
    if branch.orelse is None:
        return False
    return any(
        isinstance(node, cst.AssignTarget) and dotted(node.target) == name
        for node in walk(branch.orelse)
    )


def made_after_prepare(ctx: Context, name: str, at: cst.CSTNode) -> bool:
    """``name`` holds, at ``at``, a model made after the prepare call (``net = ShallowNet(64)``
    to reload the saved weights for a last test, under the name the trained model had): no
    prepare call sees that object, so its device move (``net.to(device)``) is what puts it
    beside the batches of the prepared loaders, and it stays."""
    made = made_for(ctx.model, name, at)
    return made is not None and ctx.prepare_anchor is not None and ctx.after_prepare(made, name)


def _made_after_its_prepare(ctx: Context, binding: Binding) -> bool:
    """``teacher = Teacher().to(device)`` after the prepare call of the ``teacher`` trained
    above it, in the same function (a distillation script reloading the teacher's saved weights
    into a fresh model before freezing it): that new object is never prepared, so its device
    move is what puts it beside the prepared loaders' batches, and it stays."""
    anchor = ctx.prepared_after.get(binding.name)
    return (
        anchor is not None
        and ctx.model.scope_of(anchor) is binding.scope
        and ctx.after_prepare(binding.statement, binding.name)
    )


def never_prepared(ctx: Context, name: str, scope: cst.CSTNode | None) -> bool:
    """``model = Model(n).to(device)`` inside a function that prepares nothing and keeps the
    model to itself (an ensemble's inference over saved states): no prepare call ever sees that
    object, whatever a model of the same name elsewhere gets, so its device move is what puts it
    beside its inputs. A model the function returns, stores or hands to a call is not: the
    caller that receives it may prepare it."""
    if "." in name or not isinstance(scope, cst.FunctionDef):
        return False
    made_here = [b for b in ctx.model.of_kind(Kind.MODEL) if b.name == name and b.scope is scope]
    parameters = {p.name.value for p in scope.params.params + scope.params.kwonly_params}
    if any(b.received for b in made_here) or name in parameters:
        return False
    # A local of a function the analysis did not take for a model (``model = BPRMF(...)`` of a
    # project module, with no optimizer there): a model of the same name elsewhere is another
    # object. Every value it is bound to is checked as a model binding's would be.
    values = [b.value for b in made_here] or _local_values(ctx, scope, name)
    if not values:
        return False
    if any(_entry_of_a_parameter(v, parameters) for v in values):
        return False  # ``model = kwargs["model"]``: what the caller hands in, maybe prepared
    if _prepares_in(ctx, scope) or any(_made_by_preparing_call(ctx, v) for v in values):
        return False
    return not _leaves_its_function(ctx, scope, name)


def _entry_of_a_parameter(value: cst.BaseExpression | None, parameters: set[str]) -> bool:
    """``kwargs["model"]`` of a parameter ``kwargs``: an entry of a dict the caller hands in."""
    entry = string_key_of(value) if value is not None else None
    return entry is not None and entry[0] in parameters


def _local_values(ctx: Context, scope: cst.FunctionDef, name: str) -> list[cst.BaseExpression]:
    """What ``name = ...`` binds in ``scope`` itself (nested functions and classes apart); none
    when it is declared ``global`` or ``nonlocal`` there."""
    values: list[cst.BaseExpression] = []
    for node in walk(scope.body):
        if isinstance(node, (cst.Global, cst.Nonlocal)) and any(
            n.name.value == name for n in node.names
        ):
            return []
        if (
            isinstance(node, cst.Assign)
            and any(isinstance(t.target, cst.Name) and t.target.value == name for t in node.targets)
            and ctx.model.scope_of(node) is scope
        ):
            values.append(node.value)
    return values


def _prepares_in(ctx: Context, function: cst.FunctionDef) -> bool:
    placement = ctx.facts.placement
    anchors = [*ctx.prepared_after.values(), ctx.prepare_anchor]
    return any(a is not None and placement.inside(a, function) for a in anchors)


def _made_by_preparing_call(ctx: Context, value: cst.BaseExpression) -> bool:
    """``model = train_model()``: a function of the file that prepares what it returns."""
    value = strip_moves(value)
    if not isinstance(value, cst.Call):
        return False
    function = ctx.model.functions.get(dotted(value.func) or "")
    return function is not None and _prepares_in(ctx, function)


def _leaves_its_function(ctx: Context, scope: cst.FunctionDef, name: str) -> bool:
    """``name`` is returned or yielded, assigned to anything (``self.model = model``, ``m =
    model``), or handed to a call as an argument (``train(model)``, ``models.append(model)``).
    A call that cannot bring it to a ``prepare`` does not count (KGAT's ``predict()``: ``model
    = load_model(model, path)``, ``model = nn.DataParallel(model)``, ``evaluate(model, ...)``):
    a DataParallel wrapper, a function of another module (no prepare of this file is in
    there) or one of this file that reaches no prepare, whose result is dropped or bound to
    names that do not leave the function either."""
    for node in walk(scope.body):
        if isinstance(node, (cst.Return, cst.Yield)) and node.value is not None:
            if any(isinstance(n, cst.Name) and n.value == name for n in walk(node.value)):
                return True
        elif isinstance(node, (cst.Assign, cst.AnnAssign, cst.AugAssign)) and node.value:
            bare = node.value
            if isinstance(bare, (cst.Tuple, cst.List)):
                if any(dotted(e.value) == name for e in bare.elements):
                    return True
            elif dotted(bare) == name:
                return True
        elif (
            isinstance(node, cst.Call)
            and any(dotted(argument.value) == name for argument in node.args)
            and not _kept_by_the_call(ctx, scope, node, name)
        ):
            return True
    return False


def _result_leaves(ctx: Context, scope: cst.FunctionDef, name: str) -> bool:
    """What a call handed the model returned (``cf_scores, metrics = evaluate(model, ...)``)
    may be the model itself: it leaves when it is returned, stored, or handed to a call that
    may keep it (a method of a local object, a function of the file that reaches a prepare);
    a function of a module (``np.save(path, cf_scores)``) does not keep it."""
    for node in walk(scope.body):
        if isinstance(node, (cst.Return, cst.Yield)) and node.value is not None:
            if any(isinstance(n, cst.Name) and n.value == name for n in walk(node.value)):
                return True
        elif (
            isinstance(node, (cst.Assign, cst.AnnAssign, cst.AugAssign))
            and node.value
            and not isinstance(node.value, cst.Call)
            and any(isinstance(n, cst.Name) and n.value == name for n in walk(node.value))
        ):
            return True
        elif isinstance(node, cst.Call) and any(
            dotted(argument.value) == name for argument in node.args
        ):
            targets = ctx.facts.calls.targets(node)
            if targets:
                if any(_reaches_prepare(ctx, target, set()) for target in targets):
                    return True
            elif not _imported_function(ctx, node, scope) and not (
                isinstance(node.func, cst.Name) and node.func.value in _BUILTINS
            ):
                return True
    return False


_BUILTINS = frozenset(dir(__import__("builtins")))


def _kept_by_the_call(ctx: Context, scope: cst.FunctionDef, call: cst.Call, name: str) -> bool:
    """``call`` hands ``name`` to something that cannot prepare it, and what it returns stays
    in the function (dropped, bound back to ``name``, or to names that do not leave)."""
    if not isinstance(call.func, (cst.Name, cst.Attribute)):
        return False
    targets = ctx.facts.calls.targets(call)
    if targets:
        if any(_reaches_prepare(ctx, target, set()) for target in targets):
            return False
    elif ctx.model.call_names(call) & names.DDP_WRAPPERS:
        pass
    elif not _imported_function(ctx, call, scope):
        return False  # ``models.append(model)``, a class of the file: stored or unseen
    parent = ctx.model.parent(call)
    if isinstance(parent, cst.Expr):
        return True
    if not isinstance(parent, cst.Assign) or parent.value is not call:
        return False
    if not all(_plain_names(target.target) for target in parent.targets):
        return False  # ``self.model = load(model)``: stored
    bound = {n for target in parent.targets for n in target_names(target.target)}
    return all(n == name or not _result_leaves(ctx, scope, n) for n in bound)


def _plain_names(target: cst.BaseExpression) -> bool:
    if isinstance(target, (cst.Tuple, cst.List)):
        return all(_plain_names(element.value) for element in target.elements)
    return isinstance(target, cst.Name)


def _imported_function(ctx: Context, call: cst.Call, scope: cst.FunctionDef) -> bool:
    """``load_model(...)``, ``utils.load_model(...)``, ``np.save(...)``: a name an import binds
    (a star import of the project's module included), never a method of a local object nor a
    function or class of the file."""
    name = dotted(call.func)
    if name is None:
        return False
    root = name.split(".")[0]
    if root in ctx.model.imports.bound:
        return True
    parameters = {p.name.value for p in scope.params.params + scope.params.kwonly_params}
    return (
        _star_imported(ctx)
        and root not in ctx.model.functions
        and root not in ctx.facts.calls.classes
        and root not in parameters
        and not _local_values(ctx, scope, root)
    )


def _star_imported(ctx: Context) -> bool:
    return any(
        isinstance(node, cst.ImportFrom) and isinstance(node.names, cst.ImportStar)
        for node in walk(ctx.model.module)
    )


def _reaches_prepare(ctx: Context, function: cst.FunctionDef, seen: set[int]) -> bool:
    if id(function) in seen:
        return False
    seen.add(id(function))
    if _prepares_in(ctx, function):
        return True
    return any(
        _reaches_prepare(ctx, target, seen)
        for node in walk(function)
        if isinstance(node, cst.Call)
        for target in ctx.facts.calls.targets(node)
    )


def _copies_of_unmoved_models(ctx: Context) -> None:
    """A script with no device move of its model (it runs on the CPU) that hands it on before
    prepare (``ema = EMA(model)``, ``AveragedModel(model)``, a ``copy.deepcopy``): converted,
    prepare puts the model and the batches on this rank's device while the copy stays on the
    CPU (on a GPU, the copy's update or forward fails on mixed devices). The model is moved to
    this rank's device before it is handed on, as prepare would move it. A model made in a
    function nothing calls (an old ``make_trainer(cfg)`` beside the ``main()`` that builds
    what runs) is not the one prepared, whatever its name: moving it would give that dead
    function an ``accelerator`` parameter no caller passes."""
    placement = ctx.facts.placement
    for binding in ctx.model.of_kind(Kind.MODEL):
        name = binding.name
        if name in ctx.frozen or name not in ctx.plan.prepared:
            continue
        if placement.never_called(binding.scope):
            continue
        if strip_moves(binding.value) is not binding.value or _moved_anywhere(ctx, name):
            continue
        handed, held_as = handed_on_before_prepare(ctx, name, binding.statement), name
        if handed is None:
            # ``self.ema = copy.deepcopy(student)`` beside ``self.student = student``: the
            # copy is made of the same object under the parameter's name
            held_as = _received_parameter(ctx, binding) or name
            if held_as == name or _moved_anywhere(ctx, held_as):
                continue
            first = ctx.facts.placement.body_of(binding.scope)[0]  # held from the start
            handed = handed_on_before_prepare(ctx, name, first, held_as=held_as)
        if handed is None:
            continue
        top = placement.top_statement(handed, binding.scope)
        if top is None:
            continue
        ctx.plan.insert_before(top, statement(f"{held_as}.to({ctx.a('device')})"))
        ctx.need(top)
        ctx.plan.change(
            ctx.line(handed),
            f"{held_as} moved to {ctx.a('device')} before line {ctx.line(handed)} hands it on: "
            "the copy made there is on the device prepare puts the model on",
        )


def _received_parameter(ctx: Context, binding: Binding) -> str | None:
    """``student`` of ``self.student = student`` in a function that takes ``student`` and never
    rebinds it: the parameter and the attribute hold one object throughout that function."""
    function = binding.scope
    if not binding.received or not isinstance(function, cst.FunctionDef):
        return None
    if not isinstance(binding.value, cst.Name):
        return None
    parameter = binding.value.value
    if parameter not in {p.name.value for p in all_params(function.params)}:
        return None
    for node in walk(function.body):
        if isinstance(node, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For)):
            bound = target_names(node.target)
        elif isinstance(node, (cst.AsName, cst.NamedExpr)):
            bound = target_names(node.name if isinstance(node, cst.AsName) else node.target)
        elif isinstance(node, (cst.Global, cst.Nonlocal, cst.Del)):
            return None if parameter in {dotted(n) for n in walk(node)} else parameter
        else:
            continue
        if parameter in bound:
            return None
    return parameter


def _unmoved_untrained_models(ctx: Context) -> None:
    """A model no optimizer trains, left unprepared (a distillation teacher, the best weights
    reloaded into a fresh ``best = build_model()``), that the script moves nowhere (it ran on
    the CPU) and that meets the batches of a prepared loader: converted, those batches arrive
    on this rank's device while the model stays on the CPU (on a GPU its forward fails on
    mixed devices). It is moved to this rank's device where it is made, as prepare moves the
    models it takes. A model made in a function that prepares nothing (``main()`` reloading the
    best weights a ``Trainer`` saved, then testing on ``trainer.test_loader``) is such a model
    too: no prepare call ever sees it."""
    loaders = {b.name for b in ctx.model.of_kind(Kind.DATALOADER) if b.name in ctx.plan.prepared}
    for binding in ctx.model.of_kind(Kind.MODEL):
        name = binding.name
        if name in ctx.plan.prepared or not ctx.plan.prepared:
            continue
        if name not in ctx.frozen and not never_prepared(ctx, name, binding.scope):
            continue
        if strip_moves(binding.value) is not binding.value or _moved_anywhere(ctx, name):
            continue
        fed = (_fed_prepared_batches(ctx, name, binding.scope, loaders) if loaders else None) or (
            fed_prepared_batches_in_a_loop(ctx, binding)
            or fed_prepared_batches_through_a_step(ctx, binding)
        )
        if fed is None:
            continue
        # outside the class that owns ``self.accelerator``: through the instance the scope
        # made (``trainer.accelerator.device``) or the process state
        acc = ctx.accelerator_at(binding.statement)
        ctx.moved_untrained.add(name)
        ctx.plan.add(
            InsertAfter(binding.statement, statement(f"{name}.to({acc}.device)")),
            line=binding.line,
            text=f"{name} moved to {acc}.device where it is made (prepare does not place a "
            f"model it does not take): line {ctx.line(fed)} hands it the batches of a prepared "
            "loader, which arrive on that device",
            anywhere=acc != ctx.acc,
        )
        ctx.moved_models.add(name)
        if acc == ctx.acc:
            ctx.need(binding.statement)


def _fed_prepared_batches(
    ctx: Context, name: str, scope: cst.CSTNode, loaders: set[str]
) -> cst.Call | None:
    """The first call of ``scope`` that hands ``name`` on beside a prepared loader
    (``evaluate(best, test_loader)``) or calls it in a loop over one (``trainer.test_loader``
    too: the ``self.test_loader`` its class prepared)."""
    for call in ctx.model.calls:
        if ctx.model.scope_of(call) is not scope:
            continue
        handed = [argument.value for argument in call.args]
        if name in {dotted(value) for value in handed} and any(
            _prepared_loader(ctx, value, loaders) for value in handed
        ):
            return call
        if dotted(call.func) == name and any(
            isinstance(loop, cst.For) and _prepared_loader(ctx, loop.iter, loaders)
            for loop in ctx.model.ancestors(call)
        ):
            return call
    return None


def _prepared_loader(ctx: Context, value: cst.BaseExpression, loaders: set[str]) -> bool:
    """``value`` is a prepared loader: by its name, or ``trainer.test_loader`` of an instance
    of a class of the file whose own ``self.test_loader`` is prepared."""
    spelled = dotted(value)
    if spelled in loaders:
        return True
    if not isinstance(value, cst.Attribute) or not isinstance(value.value, cst.Name):
        return False
    attribute = f"self.{value.attr.value}"
    made = ctx.model.call_graph.instance_class(value.value.value, value)
    if made is None or attribute not in loaders:
        return False
    index = ctx.model.index
    return any(
        index.enclosing_class_name(write) == made
        and any(dotted(target) == attribute for target in attributes_in_targets(write))
        for write in ctx.agreed.attribute_writes().get(value.attr.value, [])
    )


def _moved_anywhere(ctx: Context, name: str) -> bool:
    """Some call moves ``name`` (``model.to(device)``, ``model.cuda()``)."""
    return any(
        isinstance(call.func, cst.Attribute)
        and call.func.attr.value in ("to", "cuda")
        and dotted(call.func.value) == name
        for call in ctx.model.calls
    )


def handed_on_before_prepare(
    ctx: Context, name: str, statement: cst.CSTNode, held_as: str | None = None
) -> cst.Call | None:
    """``ema = EMA(model)`` or ``copy.deepcopy(model)`` between the model's move and its
    prepare: what the call keeps is made from the model as it is there, and prepare moves only
    the model it is given. Without the move the copy stays on the CPU while the batches and the
    model go to the accelerator (a device mismatch on GPU); the move is kept, to this rank's
    device, which is what prepare would do. ``held_as``: another name of the same object
    there (the parameter a constructor keeps as ``self.student``), looked for instead."""
    anchor = ctx.prepared_after.get(name)
    if anchor is None:
        return None
    name = held_as or name
    scope = ctx.model.scope_of(statement)
    start, end = ctx.model.order(statement), ctx.model.order(anchor)
    # ``optimizer = build_optimizer(cfg, model)``: an optimizer keeps the model's parameters,
    # which prepare moves in place, not a copy of them
    optimizers = {id(b.value) for b in ctx.model.of_kind(Kind.OPTIMIZER, Kind.SCHEDULER)}
    for call in ctx.model.calls:
        if not start < ctx.model.order(call) < end or ctx.model.scope_of(call) is not scope:
            continue
        if id(call) in optimizers:
            continue
        if any(dotted(argument.value) == name for argument in call.args) and not _rebinds(
            ctx, call, name
        ):
            return call
        if name.startswith("self.") and _copies_in_a_method(ctx, call, name):
            return call
    return None


def _copies_in_a_method(ctx: Context, call: cst.Call, name: str) -> bool:
    """``self.ema = self.make_ema()`` whose body returns ``copy.deepcopy(self.model)``: a
    method of the class called there hands ``self.model`` to a call of its own, so the copy is
    made from the model as it is at that line (on the CPU, the EMA's update then mixes devices
    on a GPU). One level: the method's own calls, not those of what it calls."""
    func = call.func
    if not (isinstance(func, cst.Attribute) and dotted(func.value) == "self"):
        return False
    target = ctx.model.call_graph.callee(call)
    if target is None:
        return False
    return any(
        isinstance(inner, cst.Call) and any(dotted(a.value) == name for a in inner.args)
        for inner in walk(target[0].body)
    )


def _rebinds(ctx: Context, call: cst.Call, name: str) -> bool:
    """``model = DDP(model)``: the model wrapped under its own name is the model prepare
    gets, not a copy of it."""
    return any(
        isinstance(ancestor, cst.Assign) and any(dotted(t.target) == name for t in ancestor.targets)
        for ancestor in ctx.model.ancestors(call)
    )


def _fixed_moves_of_prepared_models(ctx: Context) -> None:
    """``model = model.to("cpu")`` after training, to predict on the CPU: the prepared model is
    the DDP wrapper, which stays where prepare put it (on GPUs its forward sends the inputs
    back to the rank's device, where the moved parameters no longer are). Whether the rest of
    the script wants the wrapper or the plain model there is the author's call: left as it is,
    with the way to write it."""
    for call in ctx.model.calls:
        func = call.func
        if not isinstance(func, cst.Attribute) or func.attr.value not in ("to", "cuda"):
            continue
        name = dotted(func.value)
        if name is None or not fixed_device(call) or name not in ctx.plan.prepared:
            continue
        if name in ctx.frozen or not ctx.after_prepare(call, name):
            continue
        if saved_whole(ctx.model, call):
            continue  # the save unwraps the model it moves (`saving`)
        ctx.plan.review(
            ctx.line(call),
            f"{ctx.code(call)} moves the prepared {name} (the DDP wrapper) to one fixed device "
            f"on every rank; left as it is: to use the plain model there, move "
            f"{ctx.a('unwrap_model')}({name}) instead",
        )


def _mode_and_device(ctx: Context, line: cst.SimpleStatementLine, call: cst.Call) -> None:
    """``model.eval().cpu()`` before a checkpoint and ``model.to(device).train()`` after it: a
    prepared model is not moved off its device and back (DDP's buckets stay where they were
    made); only its mode switches. The saved state dict is unwrapped and written by the main
    process, as ``accelerator.save`` does."""
    chain = model_chain_moves(call)
    if chain is None:
        return
    root, kept = chain
    name = dotted(root)
    if name not in ctx.plan.prepared or not ctx.after_prepare(call, name):
        return
    if kept is root:
        ctx.plan.remove(line, ctx.line(call), f"removed {name} device move (prepared model)")
        return
    ctx.plan.replace(
        call,
        lambda _: kept,
        ctx.line(call),
        f"{ctx.code(call)} -> {ctx.code(kept)} (a prepared model stays on its device)",
    )


def run_batch_moves(ctx: Context) -> None:
    for loop in ctx.model.loops:
        if not ctx.facts.flow.reads_loader(loop) or ctx.unprepared_loaders(loop):
            continue  # a loader left unprepared hands its batches over where they were
        batch = set(loop.batch_names) | ctx.facts.flow.derived_batch_names(loop)
        for node in walk(loop.node.body):
            if isinstance(node, cst.SimpleStatementLine):
                _batch_move_statement(ctx, loop, node, batch)


def _unpacked(binding: Binding) -> bool:
    """``binding`` is one name of a tuple its assignment unpacks."""
    assign = binding.assign
    targets = assign.targets if isinstance(assign, cst.Assign) else []
    return any(isinstance(t.target, (cst.Tuple, cst.List)) for t in targets)


def _makes_a_torch_device(value: cst.BaseExpression) -> bool:
    """``torch.device(...)``: a device object, not a string a callee may compare."""
    return isinstance(value, cst.Call) and (dotted(value.func) or "").split(".")[-1] == "device"


def _helper_with_effects(ctx: Context, value: cst.BaseExpression) -> bool:
    """``value`` calls a function of this file that does more than return the device."""
    return isinstance(value, cst.Call) and any(
        calls_for_effect(function) for function in ctx.facts.calls.targets(value)
    )


def _replaced_with_its_binding(ctx: Context, read: cst.CSTNode) -> bool:
    """``device = torch.device(cfg.device)`` outside the class that holds
    ``self.accelerator``: `run_devices` replaces the whole value with the process state's
    device, so the read inside it needs no accelerator of its own. Planned anyway, its edit
    would be refused there, with a review line that says it was left as it is (lit2 of
    trial24: "`cfg.device` left as is" beside "it is now PartialState().device")."""
    if ctx.plan.reaches(read):
        return False
    return any(
        _makes_a_torch_device(binding.value)
        and not _unpacked(binding)
        and ctx.facts.placement.inside(read, binding.value)
        for binding in ctx.model.of_kind(Kind.DEVICE)
    )


def _set_after(ctx: Context, binding: Binding, device: str, why: str) -> None:
    """``name = accelerator.device`` right after the binding's statement, noted only when it
    is made: outside the class that owns ``self.accelerator`` the insert is refused, and the
    summary must not claim it (the review line `Context.need` writes says why)."""
    ctx.plan.add(
        InsertAfter(binding.statement, statement(f"{binding.name} = {device}")),
        line=binding.line,
        text=f"{binding.name} = {device} {why}",
    )


def run_devices(ctx: Context) -> None:
    for binding in ctx.model.of_kind(Kind.DEVICE):
        overridden = overridden_field(ctx.model, binding)
        if overridden is not None:
            _review_overridden_field(ctx, binding, overridden)
            continue
        # a string the script reads as one stays one: a literal, or a parameter its callers
        # (and its default) hand only strings (``self.device = device`` of ``device="cpu"``,
        # read as ``self.device.split(":")`` in another method)
        as_string = read_as_string(ctx.model, binding.name) and (
            _is_string(binding.value)
            or (isinstance(binding.value, cst.Name) and _values_of(ctx, binding) == {"str"})
            # ``self.device = device`` of a parameter with no default that the file reads as a
            # string (``self.device.split(":")``): a string, or the original would fail there
            or (_parameter_without_default(ctx, binding) and _values_of(ctx, binding) <= {"str"})
        )
        device = f"str({ctx.a('device')})" if as_string else ctx.a("device")
        if _unpacked(binding):
            # ``device, device_ids = prepare_device(n_gpu)``: the call stays (it also makes the
            # rest of the tuple), the device is this rank's after it
            _set_after(ctx, binding, device, "after it is unpacked")
        elif _helper_with_effects(ctx, binding.value):
            # ``self.device = get_device()`` whose helper logs the device it picks: the call
            # stays, so what it prints is printed, and the device is this rank's after it
            _set_after(ctx, binding, device, "after the call (it also prints or logs)")
        else:
            # Outside the class that holds ``self.accelerator`` (``device = torch.device(...)``
            # in main, which moves the model before handing it to the trainer), the process
            # state names this rank's device: left as is, every rank would pick cuda:0, while
            # prepare puts the model on this rank's GPU.
            # a string may be compared where it is passed: reviewed, as is (and no process
            # state asked for, whose import would be left unused)
            acc = (
                ctx.accelerator_at(binding.statement)
                if _makes_a_torch_device(binding.value)
                else ctx.acc
            )
            shown = f"str({acc}.device)" if as_string else f"{acc}.device"
            ctx.plan.add(
                rewrites.use_device(binding.value, acc, as_string=as_string),
                line=binding.line,
                text=f"{binding.name} = {shown}",
                anywhere=acc != ctx.acc,
            )
            _review_chosen_by_flags(ctx, binding, acc)
            _review_handed_by_callers(ctx, binding, shown)
            if acc != ctx.acc:
                _device_types(ctx, binding, as_string, converted=True)
                if not as_string:
                    _index_reads(ctx, binding, acc)
                continue
        ctx.need(binding.statement)
        _device_types(ctx, binding, as_string, converted=ctx.plan.reaches(binding.statement))
        if not as_string:
            _index_reads(ctx, binding, ctx.acc)
        if not as_string:
            _other_reads_of_the_parameter(ctx, binding.value, binding.statement)
    stripped = {
        id(b.value) for b in ctx.model.of_kind(Kind.MODEL) if b.name in ctx.plan.prepared
    }  # ``model = Net().cuda()``: the move goes with the model's (prepare places it)
    for call in ctx.model.calls:
        if _calls_method(call, "cuda") and id(call) not in stripped:
            if not call.args or _to_a_device_binding(ctx, call):
                planned = ctx.plan.add(
                    rewrites.cuda_to_device(call, ctx.acc),
                    line=ctx.line(call),
                    text=f".cuda() -> .to({ctx.a('device')})",
                    # a move that another step rewrites, or a line it removes
                    gives_way_to=[call, ctx.statement_of(call)],
                )
                ctx.need(call, when=planned.in_effect)
        elif _calls_method(call, "to") and call.args and is_cuda_literal(call.args[0].value):
            planned = ctx.plan.add(
                rewrites.use_device(call.args[0].value, ctx.acc),
                line=ctx.line(call),
                text=f'.to("cuda") -> .to({ctx.a("device")})',
                gives_way_to=[call, ctx.statement_of(call)],
            )
            ctx.need(call, when=planned.in_effect)
        for argument in call.args:
            if (
                argument.keyword is not None
                and argument.keyword.value == "device"
                and is_cuda_literal(argument.value)
            ):
                ctx.plan.add(
                    rewrites.use_device(argument.value, ctx.acc),
                    line=ctx.line(call),
                    text=f'device="cuda" -> device={ctx.a("device")}',
                )
                ctx.need(call)


def _review_overridden_field(ctx: Context, binding: Binding, field: OverriddenField) -> None:
    """``device: str = "cpu"`` of a config class that every construction sets
    (``Config(device=args.device)``): the default is not what runs, so it stays, with a review
    line. The value passed is followed to its reads (the instance's attribute is that value):
    where one places a tensor (``torch.zeros(n, device=config.device)``, ``w.to(config.device)``,
    ``torch.device(config.device)``) it becomes this rank's device, as a device local does,
    since on N GPUs the passed ``"cuda"`` is the same GPU on every rank while prepare puts the
    model on each rank's own. A move another step drops (a batch's, a model's) gives way."""
    unpacked = {id(call) for call in field.unpacked}
    naming = [call for call in field.constructions if id(call) not in unpacked]
    made = naming[0] if naming else field.unpacked[0]  # the construction the review quotes
    passed = ctx.code(field.passed[0]) if field.passed else None
    models = [b.value for b in ctx.model.of_kind(Kind.MODEL) if b.name in ctx.plan.prepared]
    placing = [
        read
        for read in field.reads
        if _places(ctx, read)
        # ``model = Net().to(config.device)``: the move goes (prepare places it)
        and not any(ctx.facts.placement.inside(read, made) for made in models)
        and not _replaced_with_its_binding(ctx, read)
    ]
    for read in placing:
        call = _call_around(ctx, read)
        # outside the class that owns ``self.accelerator`` (a factory that builds the trainer):
        # the instance's accelerator, or the process state, whose device is the same
        acc = ctx.accelerator_at(read)
        planned = ctx.plan.add(
            rewrites.use_device(read, acc),
            line=ctx.line(read),
            text=f"{ctx.code(read)} -> {acc}.device (where it places a tensor)",
            gives_way_to=[call, ctx.statement_of(call)],
            anywhere=acc != ctx.acc,
        )
        if acc == ctx.acc:
            ctx.need(read, when=planned.in_effect)
    default = f"{field.owner.name.value}.{field.field} = {ctx.code(binding.value)}"
    if passed is None:
        said = (
            f"{default} is a default that {ctx.code(made.func)}(**...) (line {ctx.line(made)}) "
            "may override from a mapping the file does not show"
        )
        chooser = f"the {field.field} it is given"
    elif field.unpacked:  # ``Config(**yaml.safe_load(f))`` here, ``Config(device="cuda")`` there
        mapping = field.unpacked[0]
        said = (
            f"{default} is a default that {ctx.code(made.func)}(..., {field.field}={passed}) "
            f"(line {ctx.line(made)}) overrides and {ctx.code(mapping.func)}(**...) (line "
            f"{ctx.line(mapping)}) may override from a mapping the file does not show"
        )
        chooser = f"the {field.field} it is given"
    else:
        said = (
            f"{default} is a default every construction overrides ({ctx.code(made.func)}(..., "
            f"{field.field}={passed}), line {ctx.line(made)})"
        )
        chooser = passed
    ctx.plan.review(
        binding.line,
        f"{said}: left as it is; prepare puts the model on this rank's device and the tensors "
        f"its reads place follow it, so {chooser} no longer chooses where the script trains "
        "(for a CPU run launch with `accelify launch --cpu`)",
    )


def _call_around(ctx: Context, read: cst.Attribute) -> cst.Call:
    argument = ctx.model.parent(read)
    call = ctx.model.parent(argument)
    assert isinstance(call, cst.Call)
    return call


def _places(ctx: Context, read: cst.Attribute) -> bool:
    """``device=read``, ``x.to(read)``, ``torch.device(read)``: ``read`` says where a tensor
    goes."""
    argument = ctx.model.parent(read)
    call = ctx.model.parent(argument) if isinstance(argument, cst.Arg) else None
    if not isinstance(argument, cst.Arg) or not isinstance(call, cst.Call):
        return False
    if argument.keyword is not None:
        return argument.keyword.value == "device"
    if ctx.model.call_names(call) & {"torch.device"}:
        return True
    return _calls_method(call, "to") and call.args[0] is argument


def _to_a_device_binding(ctx: Context, call: cst.Call) -> bool:
    """``.cuda(gpu_id)`` where ``gpu_id`` is a device of the script (now this rank's): the same
    move as ``.to(accelerator.device)``, which also runs on a CPU."""
    if len(call.args) != 1 or call.args[0].keyword is not None:
        return False
    name = dotted(call.args[0].value)
    return name is not None and ctx.facts.flow.kind_of(name, call) is Kind.DEVICE


def _review_chosen_by_flags(ctx: Context, binding: Binding, acc: str) -> None:
    """``device = torch.device(args.device)``: the flag chose CPU or GPU; this rank's device
    takes no account of it. Said, with the two ways to keep a CPU run."""
    flags = device_choosers(ctx.model, binding.assign, binding.value)
    if not flags:
        return
    read = ", ".join(flags)
    # ``if use_cuda: device = ... else: device = ...``: one line, at the if, for both branches
    branches = [a for a in ctx.model.ancestors(binding.assign) if isinstance(a, cst.If)]
    ctx.plan.review(
        ctx.line(branches[-1]) if branches else binding.line,
        f"the device was chosen by {read}: it is now {acc}.device, this rank's, so {read} no "
        "longer chooses it (on a GPU machine every rank runs on its GPU); for a CPU run, "
        "launch with `accelify launch --cpu` or pass Accelerator(cpu=...)",
    )


def _parameter_without_default(ctx: Context, binding: Binding) -> cst.FunctionDef | None:
    """The function whose parameter (with no default) ``binding`` keeps: ``self.device =
    device`` of ``def __init__(self, model, device)``."""
    value = binding.value
    function = ctx.facts.placement.enclosing_function(value)
    if not isinstance(value, cst.Name) or function is None:
        return None
    for parameter in (*function.params.params, *function.params.kwonly_params):
        if parameter.name.value == value.value:
            return function if parameter.default is None else None
    return None


def _review_handed_by_callers(ctx: Context, binding: Binding, shown: str) -> None:
    """``self.device = device`` where the file's callers hand a flag (``Trainer(model, ...,
    args.device)`` of ``--device``, default ``"cpu"``): the flag chose the device the trainer
    moved everything to; it is now this rank's, whatever the flag says. Said at the binding,
    as `_review_chosen_by_flags` says it of ``device = torch.device(args.device)``; not where
    the caller hands a device the conversion already makes this rank's (that binding's own
    review says it)."""
    function = _parameter_without_default(ctx, binding)
    if function is None:
        return
    assert isinstance(binding.value, cst.Name)
    flags: list[str] = []
    placement = ctx.facts.placement
    for call, implicit in ctx.facts.calls.calls_of(function):
        caller = placement.enclosing_function(call)
        if caller is not None and placement.never_called(caller):
            continue  # an old factory left beside the code that runs: its call never runs
        for parameter, argument in bound_arguments(function, call, implicit):
            if parameter != binding.value.value:
                continue
            for passed in _forwarded(ctx, argument, call):
                handed = dotted(passed.value)
                if handed is not None and ctx.facts.flow.kind_of(handed, passed) is Kind.DEVICE:
                    continue
                for read in device_choosers(ctx.model, passed, passed.value):
                    if read not in flags:
                        flags.append(read)
    if not flags:
        return
    read = ", ".join(flags)
    ctx.plan.review(
        binding.line,
        f"{binding.name} was the device its callers hand in ({read}): it is now {shown}, this "
        f"rank's, so {read} no longer chooses it (on a GPU machine every rank runs on its "
        "GPU); for a CPU run, launch with `accelify launch --cpu` or pass Accelerator(cpu=...)",
    )


def _forwarded(ctx: Context, argument: cst.Arg, call: cst.Call) -> list[cst.Arg]:
    """What ``argument`` hands on: itself, or, where it is a parameter the function around
    ``call`` never rebinds (a factory's ``device`` of ``build_trainer(kind, model, device)``),
    what each call of that function passes for it (``args.device``): the choice is made there,
    not by an ``if kind == ...`` around the factory's return."""
    value = argument.value
    function = ctx.facts.placement.enclosing_function(call)
    if (
        not isinstance(value, cst.Name)
        or function is None
        or not has_parameter(function, value.value)
        or ctx.model.index.assigned_under(function).get(value.value)
    ):
        return [argument]
    passed = ctx.facts.flow.call_site_arguments(value.value, call)
    return passed or [argument]


def _other_reads_of_the_parameter(
    ctx: Context, value: cst.BaseExpression, kept: cst.CSTNode
) -> None:
    """``self.device = device`` of a ``device`` parameter becomes this rank's device; the
    parameter's other reads in that function (``torch.tensor(w).to(device)``) would still be
    the caller's device (``cuda`` is cuda:0 on every rank), so they read this rank's too. Not
    when the function assigns the parameter itself."""
    if not isinstance(value, cst.Name):
        return
    function = ctx.facts.placement.enclosing_function(value)
    if function is None or value.value not in {p.name.value for p in function.params.params}:
        return
    reads = []
    for node in walk(function.body):
        if isinstance(node, cst.AssignTarget | cst.AugAssign | cst.For) and (
            value.value in target_names(node.target)
        ):
            return
        if (
            isinstance(node, cst.Name)
            and node.value == value.value
            and node is not value
            and not ctx.facts.placement.inside(node, kept)
            and not _is_member_or_keyword(ctx, node)
            and not _is_compared(ctx, node)
        ):
            reads.append(node)
    models = [b.value for b in ctx.model.of_kind(Kind.MODEL) if b.name in ctx.plan.prepared]
    for node in reads:
        if any(ctx.facts.placement.inside(node, made) for made in models):
            continue  # ``self.model = model.to(gpu_id)``: the move goes (prepare places it)
        ctx.plan.add(
            rewrites.use_device(node, ctx.acc),
            line=ctx.line(node),
            text=f"{value.value} -> {ctx.a('device')} (the parameter is this rank's device now)",
        )
        ctx.need(node)


def _is_compared(ctx: Context, node: cst.Name) -> bool:
    """``device == "cuda"``: a test of what the caller passed, not a place anything moves to. As
    this rank's device it would change meaning (a torch.device never equals a string, so the
    branch the script took on CUDA would be skipped); the caller's value answers as before."""
    parent = ctx.model.parent(node)
    return (isinstance(parent, cst.Comparison) and parent.left is node) or (
        isinstance(parent, cst.ComparisonTarget) and parent.comparator is node
    )


def _is_member_or_keyword(ctx: Context, node: cst.Name) -> bool:
    parent = ctx.model.parent(node)
    if isinstance(parent, cst.Attribute) and parent.attr is node:
        return True
    return isinstance(parent, cst.Arg) and parent.keyword is node


_DEVICE_TYPES = ("cuda", "cpu", "mps", "xpu", "npu", "hpu")


def _device_types(ctx: Context, binding: Binding, as_string: bool, converted: bool) -> None:
    """Where the script reads the device as a device type's name (``device == "cuda"``,
    ``torch.autocast(device_type=device)``), it reads the type of this rank's device: ``.type``
    of the torch.device; of a device kept a string (``str(accelerator.device)``, ``"cuda:1"``
    on rank 1, because the script also reads it as one: ``"cuda" in device``),
    ``torch.device(device).type``, since ``"cuda:1" == "cuda"`` is false and autocast refuses
    ``"cuda:1"``. Left alone where the file has no ``torch`` to call. A device the conversion
    leaves as it is (``converted`` false: no accelerator reaches it) is not followed into the
    functions it is handed to as a parameter: there it is still the script's string."""
    if as_string and not _has_torch(ctx):
        return
    statement = binding.statement if converted else None
    _compare_device_types(ctx, binding.name, binding.scope, as_string, statement)
    _device_type_arguments(ctx, binding.name, binding.scope, as_string, statement)
    _device_type_keys(ctx, binding.name, binding.scope, as_string, statement)
    if statement is not None:
        _formatted_devices(ctx, binding, as_string, statement)
        if not as_string:
            _devices_in_format_calls(ctx, binding, statement)
        _devices_made_text(ctx, binding, as_string, statement)


def _keyed_by_device_types(ctx: Context, table: cst.BaseExpression) -> bool:
    """``SPEED`` of ``SPEED = {"cpu": 1, "cuda": 10}`` bound once in the module: a table keyed
    by device types' names (every key a string, one of them a type's name, none a device's
    index like ``"cuda:1"``)."""
    if not isinstance(table, cst.Name) or _sets(ctx.model.module, table.value) != 1:
        return False
    for node in ctx.model.module.body:
        if not (isinstance(node, cst.SimpleStatementLine) and isinstance(node.body[0], cst.Assign)):
            continue
        assign = node.body[0]
        if dotted(assign.targets[0].target) != table.value or len(assign.targets) != 1:
            continue
        if not isinstance(assign.value, cst.Dict) or not assign.value.elements:
            return False
        keys = [getattr(e, "key", None) for e in assign.value.elements]
        if not all(isinstance(k, cst.SimpleString) for k in keys):
            return False
        names = [k.evaluated_value for k in keys]  # type: ignore[union-attr]
        return any(n in _DEVICE_TYPES for n in names) and not any(":" in str(n) for n in names)
    return False


def _device_type_keys(
    ctx: Context,
    name: str,
    scope: cst.CSTNode,
    as_string: bool = False,
    binding: cst.CSTNode | None = None,
) -> None:
    """``SPEED[device]`` of a table keyed by device types (``{"cpu": 1, "cuda": 10}``): this
    rank's device is ``"cuda:1"`` (or a torch.device, an unhashable-as-string key), which no key
    matches, so the read raised KeyError on a GPU; the type's name is the key the script read."""
    for node in ctx.model.index.of_type(cst.Subscript):
        assert isinstance(node, cst.Subscript)
        if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
            continue
        key = node.slice[0].slice.value
        read = dotted(key)
        if read is None or not _keyed_by_device_types(ctx, node.value):
            continue
        seen = _reads_binding(ctx, node, read, name, scope, binding)
        if seen == _NOT or (seen == _EITHER and not _has_torch(ctx)):
            continue
        typed = _type_of(read, as_string or seen == _EITHER)
        ctx.plan.replace(
            key,
            Swap(typed),
            ctx.line(node),
            f"{ctx.code(node)} -> {ctx.code(node.value)}[{typed}]: the table is keyed by device "
            f'types, and {read} is this rank\'s device now ("cuda:1")',
            anywhere=True,
        )


def _has_torch(ctx: Context) -> bool:
    return ctx.model.imports.bound.get("torch") == "torch"


def _either(read: str) -> str:
    """Why ``torch.device(read).type``: the type of a string and of a torch.device alike."""
    return (
        f"{read} is a string at some of the calls that hand it (a literal, or a call above "
        "the device's line) and this rank's torch.device at the others"
    )


def _type_of(read: str, as_string: bool) -> str:
    return f"torch.device({read}).type" if as_string else f"{read}.type"


def _compare_device_types(
    ctx: Context,
    name: str,
    scope: cst.CSTNode,
    as_string: bool = False,
    binding: cst.CSTNode | None = None,
) -> None:
    """``device == "cuda"`` once ``device`` is a torch.device: a torch.device never equals a
    string, so the test would always be false (a CUDA-only branch silently skipped on GPUs);
    ``device.type == "cuda"`` keeps its meaning."""
    for node in ctx.model.index.of_type(cst.Comparison):
        assert isinstance(node, cst.Comparison)
        if len(node.comparisons) != 1:
            continue
        target = node.comparisons[0]
        if not isinstance(target.operator, (cst.Equal, cst.NotEqual)):
            continue
        pairs = ((node.left, target.comparator), (target.comparator, node.left))
        for side, other in pairs:
            read = dotted(side)
            if not (isinstance(other, cst.SimpleString) and other.evaluated_value in _DEVICE_TYPES):
                continue
            seen = _reads_binding(ctx, node, read, name, scope, binding)
            if seen == _NOT and binding is not None:
                seen = _may_read(ctx, node, read, name, scope)
            if seen == _UNSURE:
                _review_unsure(ctx, node, read, name, as_string, "the test")  # type: ignore[arg-type]
                continue
            if seen == _NOT or (seen == _EITHER and not _has_torch(ctx)):
                continue
            typed = _type_of(read, as_string or seen == _EITHER)  # type: ignore[arg-type]
            ctx.plan.replace(
                side,
                Swap(typed),
                ctx.line(node),
                f"{ctx.code(node)} -> {typed}: "
                + (
                    _either(read)  # type: ignore[arg-type]
                    if seen == _EITHER
                    else f'{read} is this rank\'s device ("cuda:1"), not its type'
                    if as_string
                    else "a torch.device never equals a string"
                ),
                anywhere=True,
            )


#: calls whose first positional argument is a device type's name (``"cuda"``), not a device
_TYPE_NAMED_FIRST = ("autocast", "GradScaler")


def _device_type_arguments(
    ctx: Context,
    name: str,
    scope: cst.CSTNode,
    as_string: bool = False,
    binding: cst.CSTNode | None = None,
) -> None:
    """``torch.autocast(device_type=device)`` (also ``torch.autocast(device)``,
    ``torch.amp.GradScaler(device)``) once ``device`` is a torch.device: these take a device
    type's name, a string, and raise ValueError on a torch.device at the first step;
    ``device.type`` is the name the script handed them. An edit that rewrites the call itself
    (autocast made the Accelerator's) goes first."""
    for call in ctx.model.calls:
        callee = (dotted(call.func) or "").rsplit(".", 1)[-1]
        for position, argument in enumerate(call.args):
            keyword = argument.keyword.value if argument.keyword is not None else None
            named = keyword == "device_type" or (
                keyword is None and position == 0 and callee in _TYPE_NAMED_FIRST
            )
            read = dotted(argument.value)
            seen = _reads_binding(ctx, call, read, name, scope, binding) if named else _NOT
            if seen == _NOT or (seen == _EITHER and not _has_torch(ctx)):
                continue
            typed = _type_of(read, as_string or seen == _EITHER)  # type: ignore[arg-type]
            ctx.plan.replace(
                argument.value,
                Swap(typed),
                ctx.line(call),
                f"{callee}({keyword + '=' if keyword else ''}{read}) -> {typed}: it "
                "takes a device type's name, and "
                + (
                    _either(read)  # type: ignore[arg-type]
                    if seen == _EITHER
                    else 'the device is this rank\'s now ("cuda:1")'
                    if as_string
                    else "the device is a torch.device now"
                ),
                anywhere=True,
                # the call rewritten, or its statement removed (a scaler the Accelerator's
                # replaces): the summary lists only edits that remain
                gives_way_to=[call, ctx.statement_of(call)],
            )


#: how a read sees the device binding: not at all, always as this rank's torch.device, or
#: handed it at some calls and the script's own string (a call above the binding) at others;
#: or maybe (`_may_read`: an alias the conversion cannot follow), said with a review line
_NOT, _DEVICE, _EITHER, _UNSURE = 0, 1, 2, 3


def _reads_binding(
    ctx: Context,
    node: cst.CSTNode,
    read: str | None,
    name: str,
    scope: cst.CSTNode,
    binding: cst.CSTNode | None = None,
) -> int:
    """``read`` (a name or attribute path, at ``node``) is the device ``name`` that ``scope``
    binds (at ``binding``): the same name it sees, or the same object under another name
    (``cfg.device`` in ``evaluate(model, loader, cfg)`` that ``main`` calls with its ``args``
    after ``args.device = accelerator.device``; ``device_name`` of ``def amp(device_name)``
    that ``main`` calls with its ``device``). ``_EITHER`` where a call hands it above the
    binding too, while it is still the script's string (``banner(args)`` before
    ``args.device = ...``). A local alias is the object it names (``cfg = args`` then
    ``cfg.device``; ``dev = device``): followed up to three names back."""
    seen = _reads_directly(ctx, node, read, name, scope, binding)
    for _ in range(3):
        if seen != _NOT or read is None:
            break
        read = _unaliased(ctx, node, read)
        seen = _reads_directly(ctx, node, read, name, scope, binding) if read else _NOT
    return seen


def _may_read(
    ctx: Context, node: cst.CSTNode, read: str | None, name: str, scope: cst.CSTNode
) -> int:
    """How ``read`` at ``node`` sees the device ``name`` where `_reads_binding` finds no
    alias: through a name the function sets more than once, ``_DEVICE`` where the assignment
    just above in the same block is the device (``dev = args.device``; ``dev = "cpu"`` only
    further down), ``_UNSURE`` where one of them may be (``dev = "cpu"`` in a branch); or
    ``_UNSURE`` through an attribute of ``self`` that keeps the object under its own name
    (``opts = self.args`` then ``opts.device``, of ``args.device``), not followed to the
    constructor's callers. Followed up to three aliases back."""
    function = ctx.model.scope_of(node)
    for _ in range(3):
        if read is None:
            return _NOT
        if "." in name and read == f"self.{name}":
            return _UNSURE
        root, dot, path = read.partition(".")
        assigns = [
            assign
            for assign in walk(function)
            if isinstance(assign, cst.Assign)
            and len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Name)
            and assign.targets[0].target.value == root
        ]
        if not assigns or _sets(function, root) != len(assigns):
            return _NOT  # also set by a loop, an unpacking or ``+=``: not an alias
        above = [a for a in assigns if ctx.line(a) < ctx.line(node)]
        if len(assigns) > 1 and above and _in_the_block_of(ctx, above[-1], node):
            assigns = above[-1:]  # ``dev = args.device`` just above, ``dev = "cpu"`` below
        elif len(assigns) > 1:
            return max(
                (
                    _UNSURE
                    for a in assigns
                    if (value := dotted(a.value)) is not None
                    and value != root
                    and (
                        _reads_binding(ctx, node, f"{value}{dot}{path}", name, scope) != _NOT
                        or _may_read(ctx, node, f"{value}{dot}{path}", name, scope) != _NOT
                    )
                ),
                default=_NOT,
            )
        if ctx.line(assigns[0]) >= ctx.line(node):
            return _NOT
        value = dotted(assigns[0].value)
        read = f"{value}{dot}{path}" if value is not None and value != root else None
        if read is not None and _reads_binding(ctx, node, read, name, scope) == _DEVICE:
            return _DEVICE
    return _NOT


def _in_the_block_of(ctx: Context, assign: cst.CSTNode, node: cst.CSTNode) -> bool:
    """``assign``'s statement and the one holding ``node`` are in one block: the assignment
    is what ``node`` reads, whatever other lines set the name."""
    return ctx.model.parent(ctx.statement_of(assign)) is ctx.model.parent(ctx.statement_of(node))


def _review_unsure(
    ctx: Context, node: cst.CSTNode, read: str, name: str, as_string: bool, what: str
) -> None:
    """Said at a read that may be this rank's device and is left as it is (`_may_read`)."""
    now = 'a string like "cuda:1"' if as_string else "a torch.device, which never equals a string"
    ctx.plan.review(
        ctx.line(node),
        f"{read} may be {name}, this rank's device now ({now}), or another value: the "
        f"conversion cannot tell which, so {what} is left as is; where it is that device, "
        f"read its type, torch.device({read}).type, as the script read the type's name",
    )


def _formatted_devices(
    ctx: Context, binding: Binding, as_string: bool, statement: cst.CSTNode
) -> None:
    """``f"runs/{device}"`` once ``device`` is this rank's: the text names ``cuda:1`` on rank 1
    where the script's named ``cuda``, so a path made of it differs on each rank (every rank
    writes a folder of its own). Where every value the script gave the device is a type's name
    (``"cuda" if ... else "cpu"``), its type is the same text: read there (a printed line then
    shows what the script's did). Otherwise (a flag that may say ``cuda:1``), or where the read
    only may be the device, a review line, but not of text a print or a log only shows.
    A format spec (``f"{device:>6}"``) of what is now a torch.device raises TypeError
    (torch.device has no ``__format__`` of its own), so there the text is always read:
    its type where that is the script's text, else ``str(device)``."""
    types_only = _types_only(binding)
    for node in ctx.model.index.of_type(cst.FormattedStringExpression):
        assert isinstance(node, cst.FormattedStringExpression)
        read = dotted(node.expression)
        if read is None:
            continue
        # a torch.device formatted with a spec raises TypeError: its text must be read there
        spec = node.format_spec is not None and node.conversion is None and not as_string
        shown = _shown_only(ctx, node)
        seen = _reads_binding(ctx, node, read, binding.name, binding.scope, statement)
        if seen == _NOT:
            seen = _may_read(ctx, node, read, binding.name, binding.scope)
        if seen == _UNSURE and not shown:
            _review_unsure(ctx, node, read, binding.name, as_string, "the formatted text")
        if seen in (_NOT, _UNSURE):
            continue
        if (not types_only or seen == _EITHER) and spec:
            ctx.plan.replace(
                node.expression,
                Swap(f"str({read})"),
                ctx.line(node),
                f"{{{read}}} -> {{str({read})}}: {read} is this rank's torch.device now, which "
                "a format spec cannot format (TypeError); its text names this rank's device "
                "(cuda:1 on rank 1)",
                anywhere=True,
            )
            if not shown:
                ctx.plan.review(
                    ctx.line(node),
                    f"{{str({read})}} formats this rank's device now (cuda:1 on rank 1), where "
                    f"the script formatted the device it chose; for the device's type, as on "
                    f"one GPU, write {{torch.device({read}).type}}",
                )
            continue
        if not types_only or seen == _EITHER:
            if shown:
                continue
            ctx.plan.review(
                ctx.line(node),
                f"{{{read}}} formats this rank's device now (cuda:1 on rank 1), where the script "
                f"formatted the device it chose: left as is; for the device's type, as on one "
                f"GPU, write {{torch.device({read}).type}}",
            )
            continue
        typed = _type_of(read, as_string)
        ctx.plan.replace(
            node.expression,
            Swap(typed),
            ctx.line(node),
            f"{{{read}}} -> {{{typed}}}: {read} is this rank's device now (cuda:1 on rank 1), "
            "and the script's was a type's name",
            anywhere=True,
        )


def _devices_in_format_calls(ctx: Context, binding: Binding, statement: cst.CSTNode) -> None:
    """``"{:<5}".format(device)`` once ``device`` is a torch.device: a field with a format
    spec raises TypeError there (a torch.device has no ``__format__`` of its own), where the
    script's string formatted. The argument is read as text: its type where every value the
    script gave the device is a type's name (the same text), else ``str(device)``. Without a
    spec, as `_formatted_devices` does of an f-string, its type where that is the script's
    text (``"runs/{}".format(device)``: ``runs/cuda:1`` on rank 1 otherwise)."""
    types_only = _types_only(binding)
    for call in ctx.model.index.of_type(cst.Call):
        assert isinstance(call, cst.Call)
        func = call.func
        if not (
            isinstance(func, cst.Attribute)
            and func.attr.value == "format"
            and isinstance(func.value, cst.SimpleString)
        ):
            continue
        fields = _format_fields(func.value.evaluated_value)
        position = 0
        for arg in call.args:
            if arg.star:
                break  # ``*values``: the fields after it are not known
            key: int | str = arg.keyword.value if arg.keyword is not None else position
            if arg.keyword is None:
                position += 1
            read = dotted(arg.value)
            if key not in fields or read is None:
                continue
            seen = _reads_binding(ctx, arg, read, binding.name, binding.scope, statement)
            if seen not in (_DEVICE, _EITHER):
                continue
            if types_only and seen == _DEVICE:
                text, why = _type_of(read, False), "and the script's was a type's name"
            elif fields[key]:
                text, why = f"str({read})", "which a format spec cannot format (TypeError)"
            else:
                continue
            ctx.plan.replace(
                arg.value,
                Swap(text),
                ctx.line(call),
                f"{read} -> {text} in .format(): {read} is this rank's torch.device now, {why}",
                anywhere=True,
            )


def _devices_made_text(
    ctx: Context, binding: Binding, as_string: bool, statement: cst.CSTNode
) -> None:
    """``str(device)`` and ``"%s" % device`` once ``device`` is this rank's: the text names
    ``cuda:1`` on rank 1 (``cuda:0`` on one GPU) where the script's named ``cuda``, so a path
    made of it (``os.path.join("runs", str(device))``) differs on each rank and a printed line
    from the original's. As `_formatted_devices` does of an f-string: where every value the
    script gave the device is a type's name, its type is the same text and is read there;
    otherwise a review line, but not of text a print or a log only shows."""
    types_only = _types_only(binding)
    for node, read_at in _device_texts(ctx):
        read = dotted(read_at)
        seen = _reads_binding(ctx, read_at, read, binding.name, binding.scope, statement)
        if seen not in (_DEVICE, _EITHER) or read is None:
            continue
        shown = _shown_text(ctx, node)
        if types_only and seen == _DEVICE:
            typed = _type_of(read, as_string)
            ctx.plan.replace(
                read_at,
                Swap(typed),
                ctx.line(node),
                f"{ctx.code(node)}: {read} -> {typed}: {read} is this rank's device now (cuda:1 "
                "on rank 1), and the script's was a type's name",
                anywhere=True,
            )
        elif not shown:
            ctx.plan.review(
                ctx.line(node),
                f"{ctx.code(node)} is the text of this rank's device now (cuda:1 on rank 1), "
                "where the script's was the device it chose: left as is; for the device's "
                f"type, as on one GPU, write torch.device({read}).type",
            )


def _device_texts(ctx: Context) -> list[tuple[cst.CSTNode, cst.BaseExpression]]:
    """Each ``str(x)`` and ``"..." % x`` (``"..." % (a, x)``) of the file, with the ``x`` it
    makes text of, where that is a name or an attribute path."""
    found: list[tuple[cst.CSTNode, cst.BaseExpression]] = []
    for call in ctx.model.index.of_type(cst.Call):
        assert isinstance(call, cst.Call)
        (argument, *more) = call.args or (None,)
        if (
            dotted(call.func) == "str"
            and argument is not None
            and not more
            and not (argument.keyword or argument.star)
            and dotted(argument.value) is not None
        ):
            found.append((call, argument.value))
    for operation in ctx.model.index.of_type(cst.BinaryOperation):
        assert isinstance(operation, cst.BinaryOperation)
        if not (
            isinstance(operation.operator, cst.Modulo)
            and isinstance(operation.left, cst.SimpleString)
        ):
            continue
        right = operation.right
        values = [e.value for e in right.elements] if isinstance(right, cst.Tuple) else [right]
        found += [(operation, v) for v in values if dotted(v) is not None]
    return found


def _shown_text(ctx: Context, node: cst.CSTNode) -> bool:
    """The text ``node`` makes only reaches a print or a log call (through string building:
    ``+``, ``%``, ``.format()``, an f-string, ``str()``)."""
    for ancestor in ctx.model.ancestors(node):
        if isinstance(ancestor, cst.BaseStatement):
            return False
        if not isinstance(ancestor, cst.Call):
            continue
        func = ancestor.func
        if dotted(func) == "str" or (
            isinstance(func, cst.Attribute) and func.attr.value == "format"
        ):
            continue
        return (dotted(func) or "").rsplit(".", 1)[-1] in _SHOWING
    return False


def _format_fields(text: str | bytes) -> dict[int | str, bool]:
    """The fields of a ``str.format`` text that format an argument itself, by position or
    keyword, each with whether it has a format spec and no conversion (``"{:<5}"``,
    ``"{0:>6}"``, ``"{dev:>6}"``); none where the text does not parse."""
    keys: dict[int | str, bool] = {}
    if not isinstance(text, str):
        return keys
    try:
        fields = list(string.Formatter().parse(text))
    except ValueError:
        return keys
    auto = 0
    for _, field, spec, conversion in fields:
        if field is None:
            continue
        root = field.split(".", 1)[0].split("[", 1)[0]
        key: int | str
        if root == "":
            key, auto = auto, auto + 1
        else:
            key = int(root) if root.isdigit() else root
        if root == field:
            keys[key] = keys.get(key, False) or bool(spec and conversion is None)
    return keys


def _types_only(binding: Binding) -> bool:
    """Every value the script gave the device is a type's name (``"cuda" if ... else
    "cpu"``): its type is the text the script's device formatted as."""
    return all(
        isinstance(choice, cst.SimpleString) and choice.evaluated_value in _DEVICE_TYPES
        for choice in _choices(binding.value)
    )


def _choices(value: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The values a device may take: the branches of ``a if c else b``, the argument of
    ``torch.device(...)``, else ``value`` itself."""
    if isinstance(value, cst.IfExp):
        return _choices(value.body) + _choices(value.orelse)
    if (
        isinstance(value, cst.Call)
        and (dotted(value.func) or "").endswith("device")
        and len(value.args) == 1
        and value.args[0].keyword is None
    ):
        return _choices(value.args[0].value)
    return [value]


#: calls whose text is only shown: a device formatted there changes what is shown, nothing else
_SHOWING = frozenset({"print", "debug", "info", "warning", "warn", "error", "log", "write"})


def _shown_only(ctx: Context, node: cst.CSTNode) -> bool:
    """The f-string holding ``node`` is an argument of a print or a log call."""
    string = next(
        (a for a in ctx.model.ancestors(node) if isinstance(a, cst.FormattedString)), None
    )
    argument = ctx.model.parent(string) if string is not None else None
    call = ctx.model.parent(argument) if isinstance(argument, cst.Arg) else None
    return isinstance(call, cst.Call) and (dotted(call.func) or "").rsplit(".", 1)[-1] in _SHOWING


def _unaliased(ctx: Context, node: cst.CSTNode, read: str) -> str | None:
    """``cfg.device`` where the function (or module) binds ``cfg = args`` once, above ``node``
    and not as a parameter: ``args.device``, the same object's attribute. None where the root is
    no such alias (set twice, unpacked, a call's result)."""
    root, dot, path = read.partition(".")
    scope = ctx.model.scope_of(node)
    if _sets(scope, root) != 1:
        return None
    if isinstance(scope, cst.FunctionDef) and root in {
        p.name.value for p in (*scope.params.params, *scope.params.kwonly_params)
    }:
        return None
    for assign in walk(scope):
        if not (
            isinstance(assign, cst.Assign)
            and len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Name)
            and assign.targets[0].target.value == root
        ):
            continue
        value = dotted(assign.value)
        if value is None or ctx.line(assign) >= ctx.line(node):
            return None
        return f"{value}{dot}{path}"
    return None


def _reads_directly(
    ctx: Context,
    node: cst.CSTNode,
    read: str | None,
    name: str,
    scope: cst.CSTNode,
    binding: cst.CSTNode | None = None,
) -> int:
    """How ``read`` itself (no alias followed) sees the device; see ``_reads_binding``."""
    if read is None:
        return _NOT
    if read == name and (
        ctx.model.scope_of(node) is scope
        or ("." not in name and _sees_binding(ctx, node, name, scope))
    ):
        return _DEVICE
    if ("." in name) != ("." in read):
        return _NOT
    if "." in name and read.split(".", 1)[1] != name.split(".", 1)[1]:
        return _NOT
    if "." not in name and binding is None:
        return _NOT  # a device left as it is: what a function is handed is still the string
    before: list[bool] = []
    if not _handed_the_binding(ctx, node, read, name, scope, 3, binding, before):
        return _NOT
    return _EITHER if any(before) else _DEVICE


def _sees_binding(ctx: Context, node: cst.CSTNode, name: str, scope: cst.CSTNode) -> bool:
    """``node`` reads the ``name`` that ``scope`` binds: in that scope, or a module-level name
    read in a function that binds no ``name`` of its own."""
    if ctx.model.scope_of(node) is scope:
        return True
    if "." in name:
        return _handed_the_binding(ctx, node, name, name, scope, 3, None, [])
    if not isinstance(scope, cst.Module):
        return False
    return sees_binding(ctx.model, node, name, scope)  # a parameter of that name is the caller's


def _handed_the_binding(
    ctx: Context,
    node: cst.CSTNode,
    read: str,
    name: str,
    scope: cst.CSTNode,
    depth: int,
    binding: cst.CSTNode | None,
    before: list[bool],
) -> bool:
    """``args.device`` read (as ``read``) in ``train(model, loader, args)`` after ``main`` set
    ``args.device = accelerator.device`` (``name``, in ``scope``) and handed ``train`` its
    ``args`` at every call of it (followed up to ``depth`` calls back, a renamed parameter too:
    ``train(cfg)`` of ``def train(args)``): the same object, so the same torch.device, which an
    ``autocast(device_type=args.device)`` there refuses; so is a parameter handed the device
    itself (``amp(device)`` of ``def amp(device_name)``). Also ``self.device`` read in another
    method of the class whose ``__init__`` set it, when nothing else in the class sets it. A
    function that sets the attribute, or rebinds its object, reads its own. A call in the
    binding's scope above the binding hands the script's own value: ``before`` records it."""
    if ctx.model.scope_of(node) is scope:
        if read == name and binding is not None and ctx.line(node) < ctx.line(binding):
            before.append(True)
        return read == name
    if (
        "." not in name
        and read == name
        and isinstance(scope, cst.Module)
        and sees_binding(ctx.model, node, name, scope)
    ):
        return True  # a module-level device a function reads, handed on from there
    function = ctx.facts.placement.enclosing_function(node)
    if function is None or depth == 0:
        return False
    root, _, path = read.partition(".")
    owner = ctx.facts.placement.class_of(function)
    if owner is not None and root == self_parameter(function):
        return (
            read == name
            and isinstance(scope, cst.FunctionDef)
            and ctx.facts.placement.class_of(scope) is owner
            and root == self_parameter(scope)
            and _sets(owner, read) == 1
        )
    if _sets(function, read) or _sets(function, root):
        return False
    if root not in {
        p.name.value for p in (*function.params.params, *function.params.kwonly_params)
    }:
        return False
    passed = [
        (argument.value, call)
        for call, implicit in ctx.facts.flow.calls_of(function)
        for bound, argument in bound_arguments(function, call, implicit)
        if bound == root
    ]
    if not passed:
        return False
    for value, call in passed:
        if not path and _is_string(value):
            before.append(True)  # ``amp("cpu")`` beside ``amp(device)``: a string here
            continue
        handed = dotted(value)
        if handed is None or not _handed_the_binding(
            ctx,
            call,
            f"{handed}.{path}" if path else handed,
            name,
            scope,
            depth - 1,
            binding,
            before,
        ):
            return False
    return True


def _sets(under: cst.CSTNode, name: str) -> int:
    """How many assignments under ``under`` set ``name`` (``args.device = ...``, ``args =
    ...``, ``for args in ...``)."""
    count = 0
    for node in walk(under):
        if isinstance(node, cst.Assign):
            targets = [t.target for t in node.targets]
        elif isinstance(node, cst.AnnAssign | cst.AugAssign | cst.For):
            targets = [node.target]
        else:
            continue
        for target in targets:
            elements = (
                [e.value for e in target.elements]
                if isinstance(target, cst.Tuple | cst.List)
                else [target]
            )
            count += sum(dotted(element) == name for element in elements)
    return count


def _batch_move_statement(
    ctx: Context, loop: Loop, line_statement: cst.SimpleStatementLine, batch: set[str]
) -> None:
    """Drop the moves of what the loop's prepared loader handed over; a name the body
    rebinds from elsewhere first (``j, data = next(enumerate(test_loader))``, that loader left
    unprepared) keeps its move: its tensors are not on the device yet."""
    for small in line_statement.body:
        if not isinstance(small, cst.Assign):
            continue
        found = batch_moves_in(small.value, batch)
        moves = [move for move in found if _moves_the_batch(ctx, loop, move)]
        if not moves:
            continue
        if len(moves) == len(found) and is_identity_assignment(small, batch):
            ctx.plan.add(
                rewrites.drop_statement(line_statement),
                line=ctx.line(small),
                text="removed batch device move (batches arrive on accelerator.device)",
            )
            return
        for move in moves:
            ctx.plan.add(
                rewrites.drop_move(move),
                line=ctx.line(move),
                text="removed batch device move (batches arrive on accelerator.device)",
            )


def _moves_the_batch(ctx: Context, loop: Loop, move: cst.Call) -> bool:
    receiver = move_receiver(move)
    name = root_name(receiver) if receiver is not None else None
    if name is None:
        return True
    return holds_the_batch(ctx.model, loop, name, move, set(ctx.plan.prepared))


def _is_string(value: cst.BaseExpression) -> bool:
    if isinstance(value, cst.IfExp):
        return _is_string(value.body) and _is_string(value.orelse)
    return isinstance(value, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString))


def _calls_method(call: cst.Call, method: str) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == method


def _index_reads(ctx: Context, binding: Binding, acc: str) -> None:
    """``self.gpu_id = gpu_id`` of a parameter its callers hand ``0`` (``0 if
    torch.cuda.is_available() else "cpu"``) becomes this rank's device, a torch.device; where
    the script reads it as the number it was (``f"[GPU{self.gpu_id}]"``, ``gpu_id + 1``) it
    would now show ``cuda:0``, or fail. Those reads are left as they are, each with a review
    line: the index the script meant is this rank's ``local_process_index`` on a GPU, but the
    same name is a device's name on a CPU run."""
    if "int" not in _values_of(ctx, binding):
        return
    for read, consequence in _read_as_a_number(ctx, binding):
        ctx.plan.review(
            ctx.line(read),
            f"{binding.name} was a GPU index (or a device's name), and is now {acc}.device, a "
            f"torch.device: read here as the number it was, {consequence}; left as is: write "
            f"{acc}.local_process_index here for this rank's GPU index",
        )


def _values_of(ctx: Context, binding: Binding) -> set[str]:
    """What the name was set to, followed back through the parameters it was handed in by:
    ``int`` (an index), ``str`` (a device's name), ``other``."""
    pending = [*binding.sources]
    value = binding.value
    found = _literal_kinds(value)
    read = dotted(value)
    if read is not None and "." in read and names.is_gpu_index_name(read):
        found.add("int")  # ``gpu_id = args.gpu``: a flag that names one GPU's index
    if isinstance(value, cst.Name):
        pending += [o for o in ctx.facts.flow.origins(value.value, value) if o is not None]
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen or "." in name:
            continue
        seen.add(name)
        for _, bound in ctx.model.index.values_bound_to(name):
            if isinstance(bound, cst.Name):
                pending.append(bound.value)
            else:
                found |= _literal_kinds(bound)
    return found


def _literal_kinds(value: cst.BaseExpression) -> set[str]:
    if isinstance(value, cst.IfExp):
        return _literal_kinds(value.body) | _literal_kinds(value.orelse)
    if isinstance(value, cst.Integer) or (
        isinstance(value, cst.Call) and dotted(value.func) == "int"
    ):
        return {"int"}
    if isinstance(value, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)):
        return {"str"}
    if isinstance(value, cst.Name):
        return set()
    return {"other"}


def _read_as_a_number(ctx: Context, binding: Binding) -> list[tuple[cst.BaseExpression, str]]:
    """Reads of ``binding``'s name (in its function, or its class for ``self.x``) that use it
    as a number, with what a device there does instead: formatted into a string, an operand of
    arithmetic, compared with a number (the multi-GPU tutorial's ``if self.gpu_id == 0:``, never
    true of a device), or an index."""
    name = binding.name
    if "." in name and not (name.startswith("self.") and name.count(".") == 1):
        return []
    owner = ctx.facts.placement.class_of(binding.assign) if "." in name else None
    found = []
    for node in ctx.model.orders:
        if not isinstance(node, (cst.Name, cst.Attribute)) or dotted(node) != name:
            continue
        if node is binding.value or ctx.facts.placement.inside(node, binding.statement):
            continue
        if owner is not None:
            if ctx.facts.placement.class_of(node) is not owner:
                continue
        elif ctx.model.scope_of(node) is not binding.scope:
            continue
        consequence = number_read(ctx.model, node)
        if consequence is not None:
            found.append((node, consequence))
    return found
