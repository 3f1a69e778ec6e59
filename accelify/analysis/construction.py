"""What a trainer's construction does: ``__init__`` and the methods it calls through ``self``.

A trainer that prepares ``self.model`` while it is constructed hands every later method the
wrapper; the methods construction itself runs may run before the prepare (a checkpoint loaded
into the plain model on ``--resume``), so they are left out.
"""

from __future__ import annotations

import libcst as cst

from accelify.analysis.call_graph import CallGraph
from accelify.analysis.objects import bound_arguments
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import (
    assigned_targets,
    dotted,
    has_parameter,
    is_assignment,
    strip_self_methods,
    target_names,
    value_assigned_to,
    walk,
)


def prepared_in_construction(
    script: ScriptModel, owner: cst.BaseExpression, at: cst.CSTNode
) -> bool:
    """``self.unet`` read in a method of a trainer whose construction prepared it: ``__init__``
    (or a method it calls) binds ``self.unet`` from ``prepare``, the model is called
    (``self.unet(x)``), and only construction binds ``self.unet`` at all, so every other method
    sees the wrapper (a LoRA trainer's ``save_model``: ``self.unet.save_pretrained(path)``).
    Methods construction runs are left out: they may run before the prepare."""
    spelling = dotted(owner)
    if spelling is None or not spelling.startswith("self.") or spelling.count(".") != 1:
        return False
    graph = script.call_graph
    method = script.index.enclosing_function(at)
    owner_class = graph.owner(method) if method is not None else None
    if owner_class is None:
        return False
    init = graph.methods(owner_class).get("__init__")
    if init is None or method in run_by_construction(graph, init):
        return False
    if any(  # read where the method itself binds it again: unprepared there for a while
        script.index.enclosing_function(assign) is method and not keeps_the_object(assign, spelling)
        for assign in script.index.assignments_to(spelling)
    ):
        return False
    return _construction_prepares(script, owner_class, spelling)


def prepared_on_instance(script: ScriptModel, owner: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """``trainer.model`` read outside the class, where ``trainer`` is certainly an instance of a
    class of this file whose construction prepared ``self.model``: the attribute holds the
    wrapper there, as it does in the class's own methods (``trainer.train()`` then
    ``trainer.model.save_pretrained(out)`` in ``main``). The instance is the same object
    wherever it went: made in scope (``Trainer(...)`` or a factory that returns one), a
    parameter every call site hands such an instance, a module-level instance read by a
    function, a runner's ``self.trainer`` that its class only ever sets to one, or a call of a
    factory. Not when ``trainer.model`` is bound again on the way (``trainer.model =
    accelerator.unwrap_model(trainer.model)``)."""
    if not isinstance(owner, cst.Attribute):
        return False
    spelling = dotted(owner)
    if spelling is None or (spelling.startswith("self.") and spelling.count(".") == 1):
        return False  # the class's own ``self.model``: `prepared_in_construction`
    owner_class = constructed_instance(script, owner.value, owner.attr.value, at)
    return owner_class is not None and _construction_prepares(
        script, owner_class, f"self.{owner.attr.value}"
    )


def holds_constructed_wrapper(
    script: ScriptModel, value: cst.BaseExpression, at: cst.CSTNode, depth: int = 0
) -> bool:
    """``value`` certainly holds, at ``at``, a model a trainer's construction prepared: the
    attribute itself (`prepared_in_construction`, `prepared_on_instance`), a local bound to it
    (``model = trainer.model``), or a call of a function or method of this file whose every
    return is one (``def get_model(self): return self.model``; a ``build()`` that trains and
    returns ``trainer.model``)."""
    if depth > 3:
        return False
    if isinstance(value, cst.Attribute):
        return prepared_in_construction(script, value, at) or prepared_on_instance(
            script, value, at
        )
    if isinstance(value, cst.Call):
        functions = script.call_graph.targets(value)
        returns = script.index.own_returns(functions[0]) if len(functions) == 1 else []
        return bool(returns) and all(
            holds_constructed_wrapper(script, r.value, r, depth + 1)  # type: ignore[arg-type]
            for r in returns
        )
    if not isinstance(value, cst.Name):
        return False
    here, scope = script.order(at), script.scope_of(at)
    made = [
        assign
        for assign in script.index.assignments_to(value.value)
        if script.scope_of(assign) is scope and script.order(assign) < here
    ]
    if not made:
        return False
    last = max(made, key=script.order)
    if not is_assignment(last) or len(assigned_targets(last)) != 1:
        return False
    kept = strip_self_methods(last.value)  # ``trainer.model.eval()``: the same object
    return holds_constructed_wrapper(script, kept, last, depth + 1)


def constructed_accelerator(
    script: ScriptModel, owner: cst.BaseExpression, at: cst.CSTNode, depth: int = 0
) -> str | None:
    """The trainer's own accelerator, spelled where ``owner`` is read outside its class:
    ``trainer.accelerator`` for ``trainer.model`` (``self.trainer.accelerator`` for a runner's
    ``self.trainer.model``), the attribute whose ``prepare`` gave ``self.model`` in the
    construction; through a local bound to it (``model = trainer.model``) too. None when the
    object came from elsewhere (a call) or no such prepare is seen."""
    if isinstance(owner, cst.Name) and depth < 3:
        here, scope = script.order(at), script.scope_of(at)
        made = [
            assign
            for assign in script.index.assignments_to(owner.value)
            if script.scope_of(assign) is scope and script.order(assign) < here
        ]
        last = max(made, key=script.order) if made else None
        if is_assignment(last) and len(assigned_targets(last)) == 1:
            value = strip_self_methods(last.value)
            if not isinstance(value, cst.Name) or value.value != owner.value:
                return constructed_accelerator(script, value, last, depth + 1)
        return None
    spelling = dotted(owner) or ""
    if "." not in spelling or (spelling.startswith("self.") and spelling.count(".") == 1):
        return None
    instance, member = spelling.rsplit(".", 1)  # ``trainer``, or a runner's ``self.trainer``
    # with two trainer classes, only the instance's own class (or a base) prepared its member
    made = (
        constructed_instance(script, owner.value, member, at)
        if isinstance(owner, cst.Attribute)
        else None
    )
    for prepare in script.prepare_calls:
        func = prepare.call.func
        held = dotted(func.value) if isinstance(func, cst.Attribute) else None
        if f"self.{member}" not in prepare.outputs or not held or not held.startswith("self."):
            continue
        preparing = script.index.enclosing_class(prepare.call)
        if made is not None and (
            preparing is None or not script.call_graph.is_or_derives(made, preparing)
        ):
            continue
        return instance + held.removeprefix("self")
    return None


def constructed_instance(
    script: ScriptModel, instance: cst.BaseExpression, member: str, at: cst.CSTNode, depth: int = 0
) -> cst.ClassDef | None:
    """The class of this file that ``instance`` is certainly a constructed instance of at
    ``at``, with ``instance.member`` not bound again since it was made (None when unsure)."""
    graph = script.call_graph
    if depth > 3:
        return None
    if isinstance(instance, cst.Call):  # ``make_trainer(args).model``
        return graph.classes.get(graph.made_by(instance) or "")
    spelling = dotted(instance)
    if spelling is None:
        return None
    if isinstance(instance, cst.Attribute):
        return _held_by_attribute(script, spelling, member, at)
    if not isinstance(instance, cst.Name):
        return None
    here, scope = script.order(at), script.scope_of(at)
    made = [
        assign
        for assign in script.index.assignments_to(spelling)
        if script.scope_of(assign) is scope and script.order(assign) < here
    ]
    if made:
        last = max(made, key=script.order)
        if not is_assignment(last) or len(assigned_targets(last)) != 1:
            return None
        owner_class = graph.classes.get(graph.made_by(last.value) or "")
        if owner_class is None or _rebound(script, f"{spelling}.{member}", scope, last, here):
            return None
        return owner_class
    function = script.index.enclosing_function(at)
    if function is None or any(
        script.scope_of(assign) is scope for assign in script.index.assignments_to(spelling)
    ):
        return None
    if has_parameter(function, spelling):
        return _given_instance(script, spelling, member, at, function, depth)
    if spelling in _bound_otherwise(script, function):
        return None  # ``for trainer in trainers:``: a local, not the module's instance
    return _module_instance(script, spelling, member)


def _bound_otherwise(script: ScriptModel, function: cst.FunctionDef) -> set[str]:
    """The locals of ``function`` bound other than by ``=`` (which the caller checks): a loop's
    or a comprehension's target, ``with ... as name``, ``name: T = ...``, ``(name := ...)``.
    One walk per function (kept on the model): asked for every attribute read outside a class."""
    memo: dict[int, set[str]] = script.__dict__.setdefault("_bound_otherwise", {})
    found = memo.get(id(function))
    if found is None:
        found = memo[id(function)] = set()
        for node in walk(function.body):
            kind = type(node)  # none of these has subclasses: no ABC check per node
            if kind in _BINDING_TARGETS:
                found |= target_names(node.target)  # type: ignore[attr-defined]
            elif kind is cst.AsName:
                found |= target_names(node.name)  # type: ignore[attr-defined]
    return found


_BINDING_TARGETS = frozenset({cst.For, cst.CompFor, cst.AnnAssign, cst.NamedExpr})


def _given_instance(
    script: ScriptModel,
    parameter: str,
    member: str,
    at: cst.CSTNode,
    function: cst.FunctionDef,
    depth: int,
) -> cst.ClassDef | None:
    """``def finish(trainer): trainer.model.save_pretrained(out)``: every call of ``finish``
    hands it an instance of one class (made, or itself given, where it is called), and
    ``finish`` does not bind ``trainer.model`` itself."""
    if _rebound(script, f"{parameter}.{member}", function, None, None):
        return None
    passed = [
        argument
        for call, implicit in script.call_graph.calls_of(function)
        for name, argument in bound_arguments(function, call, implicit)
        if name == parameter
    ]
    classes = {
        constructed_instance(script, argument.value, member, argument, depth + 1)
        for argument in passed
    }
    return classes.pop() if len(classes) == 1 else None


def _module_instance(script: ScriptModel, name: str, member: str) -> cst.ClassDef | None:
    """A module-level ``trainer = Trainer(...)`` read in a function: every module-level binding
    makes one class, and nothing in the file binds ``trainer.model`` again."""
    graph = script.call_graph
    made = [
        a for a in script.index.assignments_to(name) if isinstance(script.scope_of(a), cst.Module)
    ]
    classes = {graph.made_by(a.value) if len(assigned_targets(a)) == 1 else None for a in made}
    if len(classes) != 1 or _rebound(script, f"{name}.{member}", None, None, None):
        return None
    return graph.classes.get(classes.pop() or "")


def _held_by_attribute(
    script: ScriptModel, spelling: str, member: str, at: cst.CSTNode
) -> cst.ClassDef | None:
    """``self.trainer.model`` in a method of a runner class that sets ``self.trainer`` only to
    instances of one class (``self.trainer = Trainer(cfg)`` in its ``__init__``), and nothing
    in the file binds ``self.trainer.model`` again."""
    if not spelling.startswith("self.") or spelling.count(".") != 1:
        return None
    runner = script.index.enclosing_class(at)
    graph = script.call_graph
    made = [
        assign
        for assign in script.index.assignments_to(spelling)
        if script.index.enclosing_class(assign) is runner
    ]
    classes = {graph.made_by(a.value) if len(assigned_targets(a)) == 1 else None for a in made}
    if runner is None or len(classes) != 1:
        return None
    if _rebound(script, f"{spelling}.{member}", None, None, None):
        return None
    return graph.classes.get(classes.pop() or "")


def _rebound(
    script: ScriptModel,
    spelling: str,
    scope: cst.CSTNode | None,
    after: cst.CSTNode | None,
    before: int | None,
) -> bool:
    """``spelling`` (``trainer.model``) is bound to another object in ``scope`` (anywhere in the
    file when None), between ``after`` and the order ``before`` when given."""
    for assign in script.index.assignments_to(spelling):
        if keeps_the_object(assign, spelling):
            continue
        if scope is not None and script.scope_of(assign) is not scope:
            continue
        if after is not None and script.order(assign) <= script.order(after):
            continue
        if before is not None and script.order(assign) >= before:
            continue
        return True
    return False


def _construction_prepares(script: ScriptModel, owner_class: cst.ClassDef, spelling: str) -> bool:
    """The construction of ``owner_class`` prepares ``spelling`` (``self.model``), a model
    (called or put in train/eval mode in the class, or shown to be one where it is prepared),
    and no method outside
    construction binds it to another object."""
    graph = script.call_graph
    init = graph.methods(owner_class).get("__init__")
    if init is None:
        return False
    construction = run_by_construction(graph, init)
    for assign in script.index.assignments_to(spelling):
        if keeps_the_object(assign, spelling):
            continue  # ``self.model = self.model.to(device)``: still the prepared wrapper
        binder = script.index.enclosing_function(assign)
        if binder is not None and graph.owner(binder) is owner_class and binder not in construction:
            if _prepared_again_after(script, assign, spelling, binder):
                continue  # ``self.model = load(...)`` then ``self.model = prepare(self.model)``
            return False  # bound again after construction: unwrap_model, a new model
    prepared = any(
        spelling in prepare.outputs
        and script.index.enclosing_function(prepare.call) in construction
        for prepare in script.prepare_calls
    )
    if not prepared:
        handed = _handed_prepared(script, init, spelling)
        if handed is None:
            return False
        prepared, handed_models = True, handed
    else:
        handed_models = False
    # called (``self.model(x)``) or switched between modes (``self.model.eval()``): only a
    # module has ``train``/``eval``, never the optimizer, loader or scheduler prepared beside it
    modes = {spelling, f"{spelling}.train", f"{spelling}.eval"}
    called = any(
        dotted(call.func) in modes and script.index.enclosing_class(call) is owner_class
        for call in script.calls
    )
    return prepared and (
        called
        or handed_models
        or _prepared_as_a_model(script, spelling, construction)
        or _run_where_handed(script, owner_class, spelling)
    )


def _run_where_handed(script: ScriptModel, owner_class: cst.ClassDef, spelling: str) -> bool:
    """The class hands ``spelling`` (``self.model_B``) to a function of this file that runs
    what it gets as a model: calls it, its ``generate`` or its ``train``/``eval``
    (``self._cycle_step(self.model_A, self.model_B, ...)`` where ``model_gen.generate(...)``).
    The parameter is the same object, so it is a model the class never calls by its own name.
    A parameter the function binds again is another object there."""
    graph = script.call_graph
    for call in script.calls:
        if script.index.enclosing_class(call) is not owner_class:
            continue
        handed = [a for a in call.args if dotted(a.value) == spelling]
        if not handed:
            continue
        for function, implicit in graph.callees(call):
            for parameter, argument in bound_arguments(function, call, implicit):
                if argument in handed and _runs_parameter(script, function, parameter):
                    return True
    return False


def _runs_parameter(script: ScriptModel, function: cst.FunctionDef, parameter: str) -> bool:
    """``function`` calls its ``parameter`` as a model (``model(x)``, ``model.generate(...)``,
    ``model.eval()``) and never binds it again."""
    if any(script.scope_of(a) is function for a in script.index.assignments_to(parameter)):
        return False
    runs = {parameter} | {f"{parameter}.{m}" for m in ("generate", "train", "eval")}
    return any(
        dotted(call.func) in runs and script.index.enclosing_function(call) is function
        for call in script.calls
    )


def _handed_prepared(script: ScriptModel, init: cst.FunctionDef, spelling: str) -> bool | None:
    """``self.model = model`` in ``__init__`` (or ``self.model, self.optimizer = model,
    optimizer``; its only binding in the file, ``model`` a
    parameter ``__init__`` never binds), and every construction of the class in this file hands
    that parameter a name a ``prepare`` call bound last above the call, in the caller's scope
    (``model, opt = accelerator.prepare(model, opt)``, then ``Trainer(accelerator, model,
    opt)``): the attribute is that wrapper, as the local is. None when it is not so; else
    whether every object handed is a model by the analysis (made by a model class, or fed to an
    optimizer beside it), where the class itself never calls it."""
    binds = [
        a
        for a in (
            *script.index.assignments_to(spelling),
            *script.index.unpacked_assignments_to(spelling),
        )
        if not keeps_the_object(a, spelling)
    ]
    if len(binds) != 1 or script.index.enclosing_function(binds[0]) is not init:
        return None
    # ``self.model = model``, or its place in ``self.model, self.optimizer = model, optimizer``
    value = value_assigned_to(binds[0], spelling)
    if len(assigned_targets(binds[0])) != 1 or not isinstance(value, cst.Name):
        return None
    if not has_parameter(init, value.value):
        return None
    parameter = value.value
    if any(script.scope_of(a) is init for a in script.index.assignments_to(parameter)):
        return None
    sites = script.call_graph.calls_of(init)
    given = script.given_parameters.get(init, {}).get(parameter)
    if not sites and given is not None and given.prepared:
        return given.kind is Kind.MODEL  # every construction in the project's other modules
    if not sites:
        return None
    models = True
    for site, implicit in sites:
        handed = [a for name, a in bound_arguments(init, site, implicit) if name == parameter]
        source = _prepared_from(script, handed[0].value, site) if len(handed) == 1 else None
        if source is None:
            return None
        models = models and source
    return models


def _prepared_from(script: ScriptModel, value: cst.BaseExpression, at: cst.CSTNode) -> bool | None:
    """``value`` is a name whose last binding above ``at`` in its scope is a ``prepare`` call's
    output: None when not; else whether what was prepared there is a model by the analysis."""
    if not isinstance(value, cst.Name):
        return None
    here, scope = script.order(at), script.scope_of(at)
    made = [  # unpacked too (``model, opt = prepare(...)``), loop targets, walruses
        node
        for node, _ in script.index.values_set_to(value.value)
        if script.scope_of(node) is scope and script.order(node) < here
    ]
    if not made:
        return None
    last = max(made, key=script.order)
    for prepare in script.prepare_calls:
        if value.value not in prepare.outputs or not script.inside(prepare.call, last):
            continue
        position = prepare.outputs.index(value.value)
        source = prepare.inputs[position] if position < len(prepare.inputs) else ""
        return any(
            binding.name in (source, value.value) and binding.scope is scope
            for binding in script.of_kind(Kind.MODEL)
        )
    return None


def _prepared_again_after(
    script: ScriptModel, assign: cst.CSTNode, spelling: str, method: cst.FunctionDef
) -> bool:
    """``method`` binds ``spelling`` at ``assign`` from a prepare call, or binds it there and,
    later in its own body (at its top level, so on every path), from a prepare call: a trainer's
    ``_load_trained_model`` loads a new model into ``self.model`` and prepares it again, so
    every other method still reads a wrapper."""
    if any(
        spelling in prepare.outputs and script.inside(prepare.call, assign)
        for prepare in script.prepare_calls
    ):
        return True  # the prepare's own binding
    top = list(method.body.body)
    position = next(
        (i for i, statement in enumerate(top) if script.inside(assign, statement)), None
    )
    if position is None:
        return False
    later = {id(statement) for statement in top[position + 1 :]}
    return any(
        spelling in prepare.outputs and any(id(a) in later for a in script.ancestors(prepare.call))
        for prepare in script.prepare_calls
    )


def keeps_the_object(assign: cst.CSTNode, spelling: str) -> bool:
    """``self.model = self.model.to(device)`` (``.cuda()``, ``.train()``, ``.eval()``): the
    value is the object the name already held, since nn.Module's moves hand ``self`` back; on a
    prepared model that is still the DistributedDataParallel wrapper."""
    if not is_assignment(assign) or len(assigned_targets(assign)) != 1:
        return False
    value = assign.value
    kept = strip_self_methods(value)
    return (
        kept is not value
        and dotted(kept) == spelling
        and dotted(assigned_targets(assign)[0]) == spelling
    )


def _prepared_as_a_model(
    script: ScriptModel, spelling: str, construction: set[cst.FunctionDef]
) -> bool:
    """Construction shows ``spelling`` is a model without calling it: what it prepared there is
    a model by the analysis (made by a model class, or fed to an optimizer as
    ``AdamW(model.parameters())`` beside it), was loaded with ``from_pretrained`` (a
    transformers model made by ``getattr(transformers, cls).from_pretrained(name)``, used only
    through ``generate``), or had its mode switched (`_switched_mode`: a reference model)."""
    for prepare in script.prepare_calls:
        function = script.index.enclosing_function(prepare.call)
        if function not in construction or spelling not in prepare.outputs:
            continue
        position = prepare.outputs.index(spelling)
        source = prepare.inputs[position] if position < len(prepare.inputs) else ""
        if not source:
            continue
        if any(
            binding.name == source and binding.scope is function
            for binding in script.of_kind(Kind.MODEL)
        ):
            return True
        if _loaded_pretrained(script, source, function):
            return True
        if _switched_mode(script, source, function):
            return True
    return False


_MODES = ("eval", "train")


def _switched_mode(script: ScriptModel, source: str, function: cst.FunctionDef) -> bool:
    """``source`` has its mode switched (``ref.eval()``, only a module has it) in ``function``,
    or is bound there to what a function of the file returns after switching its mode
    (``self.ref_model = self._init_ref_model()``, whose ``model_copy.eval()`` precedes ``return
    model_copy``): a reference model copied from the policy and left requiring grad."""
    if _mode_switched_in(script, source, function):
        return True
    for assign in script.index.assignments_to(source):
        if script.index.enclosing_function(assign) is not function or not isinstance(
            assign.value, cst.Call
        ):
            continue
        targets = script.call_graph.targets(assign.value)
        if len(targets) != 1:
            continue
        returns = script.index.own_returns(targets[0])
        if returns and all(
            isinstance(r.value, cst.Name) and _mode_switched_in(script, r.value.value, targets[0])
            for r in returns
        ):
            return True
    return False


def _mode_switched_in(script: ScriptModel, name: str, function: cst.FunctionDef) -> bool:
    modes = {f"{name}.{mode}" for mode in _MODES}
    return any(
        dotted(call.func) in modes and script.index.enclosing_function(call) is function
        for call in script.calls
    )


def _loaded_pretrained(script: ScriptModel, source: str, function: cst.FunctionDef) -> bool:
    """``source`` is bound in ``function`` from a ``...from_pretrained(...)`` call, also spelled
    ``getattr(model_class, 'from_pretrained')(path)`` (an evaluation harness's class picked from
    the config's ``architectures``)."""
    for assign in script.index.assignments_to(source):
        if script.index.enclosing_function(assign) is not function:
            continue
        if not isinstance(assign, cst.Assign):
            continue
        value = strip_self_methods(assign.value)
        func = value.func if isinstance(value, cst.Call) else None
        if isinstance(func, cst.Attribute) and func.attr.value == "from_pretrained":
            return True
        if _getattr_of(func) == "from_pretrained":
            return True
    return False


def _getattr_of(node: cst.BaseExpression | None) -> str | None:
    """``name`` of ``getattr(obj, "name")``, a literal attribute looked up by name."""
    if not (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Name)
        and node.func.value == "getattr"
        and len(node.args) == 2
        and isinstance(node.args[1].value, cst.SimpleString)
    ):
        return None
    return node.args[1].value.evaluated_value  # type: ignore[return-value]


def run_by_construction(graph: CallGraph, method: cst.FunctionDef) -> frozenset[cst.FunctionDef]:
    """``method`` and the methods it calls through ``self`` (three levels down). Kept per
    method: the call targets it follows are fixed once asked."""
    memo: dict[int, frozenset[cst.FunctionDef]] = graph.__dict__.setdefault("_construction", {})
    found = memo.get(id(method))
    if found is None:
        found = memo[id(method)] = frozenset(_run_by(graph, method, 0))
    return found


def _run_by(graph: CallGraph, method: cst.FunctionDef, depth: int) -> set[cst.FunctionDef]:
    found = {method}
    if depth >= 3:
        return found
    for node in walk(method.body):
        if type(node) is cst.Call and (dotted(node.func) or "").startswith("self."):
            for target in graph.targets(node):  # type: ignore[arg-type]
                if target not in found:
                    found |= _run_by(graph, target, depth + 1)
    return found
