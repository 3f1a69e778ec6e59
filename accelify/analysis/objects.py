"""Objects across functions and classes: an attribute, a parameter and a return value are the
same object as the local they came from.

``Trainer(model, train_loader)`` makes ``__init__``'s ``train_loader`` a loader, and
``self.train_loader = train_loader`` makes ``self.train_loader`` one too (a *received* binding:
the object was made elsewhere). ``train_loader, val_loader = get_loaders()`` binds two loaders
when ``get_loaders`` returns them, and ``optimizer = model.configure_optimizers()`` an optimizer
when the model's class builds and returns one. One question answers which function a call runs
(`callee`) and which parameter each argument lands in (`bound_arguments`): the analysis and the
object flow ask it, nothing else re-derives it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import libcst as cst

from accelify.analysis.script_model import Binding, Kind, ScriptModel
from accelify.analysis.syntax import dotted, strip_self_methods

Classify = Callable[[cst.BaseExpression, str], Kind | None]

#: Rounds of propagation: a factory that returns what a constructor received, and so on.
ROUNDS = 4


def methods_of(model: ScriptModel, class_name: str) -> dict[str, cst.FunctionDef]:
    definition = model.classes.get(class_name)
    if definition is None or not isinstance(definition.body, cst.IndentedBlock):
        return {}
    return {
        line.name.value: line for line in definition.body.body if isinstance(line, cst.FunctionDef)
    }


def callee(model: ScriptModel, call: cst.Call) -> tuple[cst.FunctionDef, int] | None:
    """The function of this file that ``call`` runs, and how many of its leading parameters the
    call binds implicitly (``self``): ``train(...)``, ``Trainer(...)`` (its ``__init__``),
    ``self.evaluate(...)``, ``trainer.fit(...)`` and ``model.configure_optimizers(...)`` when
    the receiver was made by a class of this file."""
    func = call.func
    if isinstance(func, cst.Name):
        if func.value in model.functions:
            return model.functions[func.value], 0
        init = methods_of(model, func.value).get("__init__")
        return (init, 1) if init is not None else None
    if not isinstance(func, cst.Attribute):
        return None
    if _is_super(func.value):  # ``super().__init__(model, ...)``: the base class's method
        return _base_method(model, _enclosing_class(model, call), func.attr.value)
    receiver = dotted(func.value)
    if receiver is None:
        return None
    if receiver in model.classes:  # ``Regressor.load(path)``: a class or static method
        method = methods_of(model, receiver).get(func.attr.value)
        if method is None:
            return None
        decorators = {dotted(d.decorator) for d in method.decorators}
        return method, 1 if "classmethod" in decorators else 0
    if receiver == "self":
        owner = _enclosing_class(model, call)
    else:
        owner = instance_class(model, receiver, call)
    if owner is None and receiver in model.names_of(Kind.MODEL):
        # a model from a hub or a loader: the one model class of the file with this method
        having = [
            name for name in model.module_classes if func.attr.value in methods_of(model, name)
        ]
        owner = having[0] if len(having) == 1 else None
    if owner is None:
        return None
    method = methods_of(model, owner).get(func.attr.value)
    return (method, 1) if method is not None else None


def _is_super(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Call) and dotted(node.func) == "super"


def _base_method(
    model: ScriptModel, owner: str | None, name: str, depth: int = 0
) -> tuple[cst.FunctionDef, int] | None:
    """The method ``name`` of the nearest base class of ``owner`` defined in this file."""
    definition = model.classes.get(owner or "")
    if definition is None or depth > 10:
        return None
    for base in definition.bases:
        base_name = dotted(base.value)
        if base_name is None or base_name not in model.classes:
            continue
        method = methods_of(model, base_name).get(name)
        if method is not None:
            return method, 1
        found = _base_method(model, base_name, name, depth + 1)
        if found is not None:
            return found
    return None


def is_loader_dict(model: ScriptModel, binding: Binding) -> bool:
    """A dict of DataLoaders (``{"train": DataLoader(...), ...}``), made here or returned by a
    factory (``loaders = get_dataloaders()``): ``prepare`` hands a dict back untouched, so each
    loader in it must be prepared on its own."""
    value = binding.value
    if binding.kind is not Kind.DATALOADER:
        return False
    if isinstance(value, cst.Dict):
        return True
    target = callee(model, value) if isinstance(value, cst.Call) else None
    if target is None:
        return False
    returned = [
        node.value
        for node in _own_nodes(target[0])
        if isinstance(node, cst.Return) and node.value is not None
    ]
    for result in returned:
        if isinstance(result, cst.Name):
            values = [
                a.value
                for a in _assignments_in(target[0])
                if any(dotted(t.target) == result.value for t in a.targets)
            ]
            result = values[0] if len(values) == 1 else result
        if not isinstance(result, cst.Dict):
            return False
    return bool(returned)


def instance_class(model: ScriptModel, name: str, at: cst.CSTNode) -> str | None:
    """The class of this file that made ``name``: ``trainer = Trainer(...)``, or
    ``model = build_model()`` where ``build_model`` returns ``Net(...)``. Failing that, for a
    model, the one model class of the file that has the method being looked up is left to
    `callee`."""
    wanted_class = _enclosing_class(model, at) if name.startswith("self.") else None
    found = None
    for assign in model.assignments:
        if not any(dotted(t.target) == name for t in assign.targets):
            continue
        if wanted_class is not None and _enclosing_class(model, assign) != wanted_class:
            continue
        found = _made_by(model, assign.value, depth=2) or found
    return found


def _made_by(model: ScriptModel, value: cst.BaseExpression, depth: int) -> str | None:
    core = strip_self_methods(value)
    if not (isinstance(core, cst.Call) and isinstance(core.func, cst.Name)):
        return None
    if core.func.value in model.classes:
        return core.func.value
    factory = model.functions.get(core.func.value)
    if factory is None or depth == 0:
        return None
    made = set()
    for node in _own_nodes(factory):
        if isinstance(node, cst.Return) and node.value is not None:
            returned = node.value
            name = dotted(returned)
            if name is not None:
                values = [
                    a.value
                    for a in _assignments_in(factory)
                    if any(dotted(t.target) == name for t in a.targets)
                ]
                made |= {_made_by(model, v, depth - 1) for v in values}
            else:
                made.add(_made_by(model, returned, depth - 1))
    return made.pop() if len(made) == 1 else None


def bound_arguments(
    function: cst.FunctionDef, call: cst.Call, implicit: int = 0
) -> list[tuple[str, cst.Arg]]:
    """(parameter, argument) pairs of one call, by position or keyword; ``*args`` skipped;
    the first ``implicit`` parameters (``self``) are bound by the call itself."""
    positional = [p.name.value for p in function.params.params][implicit:]
    pairs = []
    for index, argument in enumerate(call.args):
        if argument.star:
            continue
        if argument.keyword is not None:
            pairs.append((argument.keyword.value, argument))
        elif index < len(positional):
            pairs.append((positional[index], argument))
    return pairs


def add_object_bindings(model: ScriptModel, classify: Classify) -> None:
    """Bind what constructors and methods receive into attributes, and what factories return
    into their callers' names, until nothing new is found. ``classify`` is the analysis's own
    test of what a value makes (the collector's)."""
    parameters: dict[cst.FunctionDef, dict[str, Kind]] = {}
    known = {(b.name, id(b.scope)) for b in model.bindings}
    for _ in range(ROUNDS):
        added = _receive(model, parameters, known, classify) + _factories(model, classify, known)
        if not added:
            break
    _record_sources(model)
    model.bindings.sort(key=lambda b: model.order(b.assign))
    model.received_parameters = parameters


def _record_sources(model: ScriptModel) -> None:
    """For each received attribute, the callers' names for what it received: ``self.loader``
    of ``Trainer(train_loader)`` came from ``train_loader`` (so it is prepared when that is)."""
    for binding in model.bindings:
        if not binding.received or not isinstance(binding.scope, cst.FunctionDef):
            continue
        parameter = dotted(strip_self_methods(binding.value))
        for call in model.calls:
            target = callee(model, call)
            if target is None or target[0] is not binding.scope:
                continue
            for name, argument in bound_arguments(target[0], call, target[1]):
                source = dotted(argument.value)
                if name == parameter and source is not None:
                    binding.sources.append(source)


def _kind_at(
    model: ScriptModel,
    name: str | None,
    at: cst.CSTNode,
    parameters: dict[cst.FunctionDef, dict[str, Kind]],
) -> Kind | None:
    if name is None:
        return None
    scope = model.scope_of(at)
    for binding in model.bindings:
        if binding.name != name:
            continue
        if binding.scope is scope or isinstance(binding.scope, cst.Module):
            return binding.kind
        if name.startswith("self.") and _enclosing_class(model, binding.assign) == (
            _enclosing_class(model, at)
        ):
            return binding.kind
    if isinstance(scope, cst.FunctionDef):
        return parameters.get(scope, {}).get(name)
    return None


def _receive(
    model: ScriptModel,
    parameters: dict[cst.FunctionDef, dict[str, Kind]],
    known: set[tuple[str, int]],
    classify: Classify,
) -> int:
    added = 0
    for call in model.calls:
        target = callee(model, call)
        if target is None:
            continue
        function, implicit = target
        for parameter, argument in bound_arguments(function, call, implicit):
            value = argument.value
            if isinstance(value, (cst.Name, cst.Attribute)):
                kind = _kind_at(model, dotted(value), call, parameters)
            else:  # ``Trainer(DataLoader(...))``
                kind = classify(value, "")
            if kind is not None and parameter not in parameters.get(function, {}):
                parameters.setdefault(function, {})[parameter] = kind
                added += 1
    for function, received in parameters.items():
        if _enclosing_class(model, function) is None:
            continue
        for assign in _assignments_in(function):
            value = strip_self_methods(assign.value)
            kind = received.get(dotted(value) or "") if isinstance(value, cst.Name) else None
            if kind is None:
                continue
            for target in assign.targets:
                name = dotted(target.target)
                if name and name.startswith("self.") and (name, id(function)) not in known:
                    added += _bind(model, name, kind, function, assign, known, received=True)
    return added


def _factories(model: ScriptModel, classify: Classify, known: set[tuple[str, int]]) -> int:
    added = 0
    for assign in model.assignments:
        value = strip_self_methods(assign.value)
        if not isinstance(value, cst.Call) or len(assign.targets) != 1:
            continue
        target = callee(model, value)
        if target is None or target[0].name.value == "__init__":
            continue
        kinds = returned_kinds(model, target[0], classify)
        if not kinds:
            continue
        names = _target_names(assign.targets[0].target)
        if names is None or len(names) != len(kinds):
            continue
        scope = model.scope_of(assign)
        for name, kind in zip(names, kinds, strict=True):
            if kind is not None and (name, id(scope)) not in known:
                added += _bind(model, name, kind, scope, assign, known, received=False)
    return added


def returned_kinds(
    model: ScriptModel, function: cst.FunctionDef, classify: Classify
) -> list[Kind | None]:
    """What ``function`` returns, one kind per element of a returned tuple; empty when its
    ``return`` statements disagree or return nothing the analysis tracks."""
    answers: list[list[Kind | None]] = []
    for node in _own_nodes(function):
        if isinstance(node, cst.Return) and node.value is not None:
            value = node.value
            elements = (
                [e.value for e in value.elements]
                if isinstance(value, cst.Tuple)
                and all(isinstance(e, cst.Element) for e in value.elements)
                else [value]
            )
            answers.append([_value_kind(model, function, e, classify) for e in elements])
    if not answers or any(answer != answers[0] for answer in answers):
        return []
    return answers[0] if any(kind is not None for kind in answers[0]) else []


def _value_kind(
    model: ScriptModel, function: cst.FunctionDef, value: cst.BaseExpression, classify: Classify
) -> Kind | None:
    name = dotted(value)
    if name is not None:
        for binding in model.bindings:
            if binding.name == name and binding.scope is function:
                return binding.kind
        for assign in _assignments_in(function):
            if any(dotted(t.target) == name for t in assign.targets):
                return classify(assign.value, name)
        return None
    return classify(value, "")


def _bind(
    model: ScriptModel,
    name: str,
    kind: Kind,
    scope: cst.FunctionDef | cst.Module,
    assign: cst.Assign,
    known: set[tuple[str, int]],
    *,
    received: bool,
) -> int:
    statement = model.parent(assign)
    if not isinstance(statement, cst.SimpleStatementLine):
        return 0
    model.bindings.append(
        Binding(name, kind, scope, statement, assign, assign.value, model, received=received)
    )
    known.add((name, id(scope)))
    return 1


def _target_names(target: cst.BaseExpression) -> list[str] | None:
    if isinstance(target, (cst.Tuple, cst.List)):
        names = [dotted(e.value) for e in target.elements if isinstance(e, cst.Element)]
        if len(names) != len(target.elements) or None in names:
            return None
        return names  # type: ignore[return-value]
    name = dotted(target)
    return [name] if name is not None else None


def _enclosing_class(model: ScriptModel, node: cst.CSTNode) -> str | None:
    for ancestor in model.ancestors(node):
        if isinstance(ancestor, cst.ClassDef):
            return ancestor.name.value
    return None


def _own_nodes(function: cst.FunctionDef) -> Iterator[cst.CSTNode]:
    """``function``'s body, not the bodies of functions or classes defined inside it."""
    stack: list[cst.CSTNode] = [function.body]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        stack.extend(reversed(list(node.children)))


def _assignments_in(function: cst.FunctionDef) -> Iterator[cst.Assign]:
    return (node for node in _own_nodes(function) if isinstance(node, cst.Assign))
