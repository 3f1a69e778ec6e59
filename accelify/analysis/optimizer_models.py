"""Whatever's ``.parameters()`` an optimizer is built from is a model, whatever made it: a model
from a factory function, a hub, or a class in another file is found through its optimizer."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from accelify.analysis.names import OPTIMIZER_FACTORIES, is_optimizer_class
from accelify.analysis.objects import attributes_kept, bound_arguments
from accelify.analysis.script_model import (
    OPTIMIZER_METHODS,
    Binding,
    Kind,
    ScriptModel,
    factory_handed_model,
    owning_model,
)
from accelify.analysis.syntax import (
    Visitor,
    assigned_targets,
    dotted,
    root_name,
    strip_self_methods,
    visit_code,
    walk,
)

#: a parameter group's function, the name it is handed, and the group
_Handed = tuple[str, str, cst.DictElement]


class _Params(Visitor):
    """Adds to ``owners`` the model of each ``<model>.parameters()`` (or
    ``.named_parameters()``) call it visits, and to ``handed`` the name each parameter group
    hands to a function (``{"params": get_1x_lr_params(model)}``): the caller tells whether
    that name is a model or a list of parameters picked before (`_handed_owners`)."""

    def __init__(self, owners: set[str], handed: list[_Handed]) -> None:
        self.owners = owners
        self.handed = handed

    def visit_Call(self, call: cst.Call) -> None:
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value in (
            "parameters",
            "named_parameters",
        ):
            name = dotted(func.value)
            if name:
                self.owners.add(owning_model(name))

    def visit_DictElement(self, element: cst.DictElement) -> None:
        """``{"params": get_1x_lr_params(model), "lr": lr}``: a parameter group whose
        parameters a function picks out of the one object it is handed (the C3D / R(2+1)D
        trainers' ``R2Plus1D_model.get_10x_lr_params(model)``, a function of another module)
        trains that object. Only when that object holds no parameters picked before
        (``decay = [p for n, p in model.named_parameters() ...]`` then ``{"params":
        list(decay)}`` trains ``model``, not ``decay``): the caller resolves the name."""
        key, value = element.key, element.value
        if not (
            isinstance(key, cst.SimpleString)
            and key.evaluated_value == "params"
            and isinstance(value, cst.Call)
            and len(value.args) == 1
            and value.args[0].keyword is None
            and not value.args[0].star
        ):
            return
        name = dotted(value.args[0].value)
        if name:
            self.handed.append((dotted(value.func) or "", name, element))


#: functions that only copy or reorder the parameters they are handed: ``list(decay)`` trains
#: what ``decay`` was picked from, never ``decay`` itself
_COLLECTING = frozenset(
    {"list", "tuple", "set", "sorted", "iter", "filter", "chain", "itertools.chain"}
)


def _params(script: ScriptModel, code: cst.CSTNode, owners: set[str], depth: int = 0) -> None:
    """Adds to ``owners`` the models whose parameters ``code`` hands an optimizer; ``depth``
    bounds the names followed (a group may read the name it is assigned to)."""
    handed: list[_Handed] = []
    visit_code(code, _Params(owners, handed))
    owners |= _handed_owners(script, handed, depth)


def _handed_owners(script: ScriptModel, handed: list[_Handed], depth: int) -> set[str]:
    """The models the parameter groups of ``handed`` train: the models whose parameters the
    argument was picked from before the group, in its scope (``decay = [p for n, p in
    model.named_parameters() if ...]``), else the argument itself when a function that is not
    a mere collection picks the parameters out of it (``get_1x_lr_params(model)``)."""
    owners: set[str] = set()
    for function, name, element in handed:
        picked: set[str] = set()
        if "." not in name and depth < _MAX_DEPTH:
            for value in _values_behind(script, [cst.Name(name)], element, 0)[1:]:
                _params(script, value, picked, depth + 1)
        if picked:
            owners |= picked
        elif function not in _COLLECTING:
            owners.add(owning_model(name))
    return owners


def parameter_owners(optimizer: Binding) -> set[str]:
    """The models whose ``.parameters()``/``.named_parameters()`` build ``optimizer``
    (``model`` for ``model.fc.parameters()``). Kept per binding once the analysis is complete
    (rules ask for every optimizer, each of them); a copy is given."""
    script = optimizer.script
    memo = script.__dict__.get("_parameter_owners")
    kept = memo.get(id(optimizer)) if memo is not None else None
    if kept is not None and kept[0] is optimizer:
        return set(kept[1])
    owners = _parameter_owners(optimizer)
    if script.complete:
        script.__dict__.setdefault("_parameter_owners", {})[id(optimizer)] = (optimizer, owners)
        return set(owners)
    return owners


def entry_owners(optimizer: Binding) -> list[cst.BaseExpression]:
    """The container entries whose parameters build ``optimizer`` (``models["net"]`` of
    ``Adam(models["net"].parameters())``, ``state["model"].fc``): models the analysis holds no
    name for, so it cannot prepare them; preparing the optimizer and the loaders without them
    would train each rank's unsynchronised copy on its own shard."""
    core = strip_self_methods(optimizer.value)
    if not isinstance(core, cst.Call):
        return []
    entries: list[cst.BaseExpression] = []
    for argument in core.args:
        for node in walk(argument.value):
            if not (
                isinstance(node, cst.Call)
                and isinstance(node.func, cst.Attribute)
                and node.func.attr.value in ("parameters", "named_parameters")
            ):
                continue
            receiver = node.func.value
            root = receiver
            while isinstance(root, cst.Attribute):
                root = root.value
            if isinstance(root, cst.Subscript) and root_name(root) is not None:
                entries.append(receiver)
    return entries


def _parameter_owners(optimizer: Binding) -> set[str]:
    core = strip_self_methods(optimizer.value)
    if not isinstance(core, cst.Call):
        return set()
    owners: set[str] = set()
    script = optimizer.script
    for argument in core.args:
        _params(script, argument.value, owners)
    if not owners:  # ``AdamW(param_groups)``: the groups built in names before it
        for value in _values_behind(script, [a.value for a in core.args], optimizer.assign, 0):
            _params(script, value, owners)
        owners |= {
            owning_model(alias)
            for owner in set(owners)
            for alias in _aliased(script, owner, optimizer.assign, 0)
        }
    factory = optimizer.script.functions.get(dotted(core.func) or "")
    method = _own_method(optimizer.script, core, optimizer.assign)
    if method is not None:  # ``self._select_optimizer()`` over ``self.model.parameters()``
        found_before = set(owners)
        _params(script, method.body, owners)
        owners = found_before | {o for o in owners - found_before if o.split(".", 1)[0] == "self"}
    if factory is not None:  # ``build_optimizer(cfg, model)`` over ``model.parameters()``
        found_before = set(owners)
        _params(script, factory.body, owners)
        fed = owners - found_before
        owners -= fed
        for parameter, argument in bound_arguments(factory, core):
            name = dotted(argument.value)
            if parameter in fed and name is not None:
                owners.add(owning_model(name))
    if factory is None and (dotted(core.func) or "").rsplit(".", 1)[-1] in OPTIMIZER_FACTORIES:
        # ``build_optimizer(model, cfg)``, ``create_optimizer(model=net)`` of a library (one of
        # this file is read above): handed the model
        handed = factory_handed_model(core, optimizer.script.scope_of(core))
        name = dotted(handed) if handed is not None else None
        if name:
            owners.add(owning_model(name))
    func = core.func
    if isinstance(func, cst.Attribute) and func.attr.value in OPTIMIZER_METHODS:
        receiver = dotted(func.value)  # ``model.configure_optimizers(...)`` trains ``model``
        if receiver:
            owners.add(owning_model(receiver))
    return owners


def _own_method(script: ScriptModel, call: cst.Call, at: cst.CSTNode) -> cst.FunctionDef | None:
    """The method of ``at``'s own class that ``self.<name>()`` runs (an optimizer factory of a
    trainer: Informer's ``model_optim = self._select_optimizer()``): what it builds over
    ``self.model`` trains the same instance's model. Its own methods only, read from the class
    body (the analysis is still being built)."""
    func = call.func
    if not (
        isinstance(func, cst.Attribute)
        and isinstance(func.value, cst.Name)
        and func.value.value == "self"
    ):
        return None
    owner = script.index.enclosing_class(at)
    if owner is None or not isinstance(owner.body, cst.IndentedBlock):
        return None
    return next(
        (
            line
            for line in owner.body.body
            if isinstance(line, cst.FunctionDef) and line.name.value == func.attr.value
        ),
        None,
    )


_MAX_DEPTH = 3
_ADDING = ("append", "extend", "insert", "add_param_group")


def _values_behind(
    script: ScriptModel, values: list[cst.BaseExpression], at: cst.CSTNode, depth: int
) -> list[cst.BaseExpression]:
    """``values`` and, for each plain name they read, what it is set to in ``at``'s scope
    before ``at`` and what is added to it there (``param_groups.append({"params": ps})``, then
    ``ps = [p for p in uw_model.parameters() if p.requires_grad]``): where the parameter
    groups an optimizer is built from came from (a robot-policy trainer's lr groups)."""
    found = list(values)
    if depth >= _MAX_DEPTH:
        return found
    scope, order = script.scope_of(at), script.order(at)
    read = {n.value for v in values for n in walk(v) if isinstance(n, cst.Name)}
    for name in read:
        behind: list[cst.BaseExpression] = [
            assign.value
            for assign in script.index.assignments_to(name)
            if script.scope_of(assign) is scope and script.order(assign) < order
        ]
        behind += [
            argument.value
            for call in script.calls
            if type(call.func) is cst.Attribute  # no ABC check per call of the file
            and call.func.attr.value in _ADDING
            and dotted(call.func.value) == name
            and script.scope_of(call) is scope
            and script.order(call) < order
            for argument in call.args
        ]
        # ``for name, param in model.named_parameters(): ... params_to_update.append(param)``
        # (torchvision's fine-tuning tutorial): a loop target stands for what the loop reads
        behind += [
            loop.iter for loop in _loops_binding(script, scope, name) if script.order(loop) < order
        ]
        found += _values_behind(script, behind, at, depth + 1)
    return found


def _loops_binding(script: ScriptModel, scope: cst.CSTNode | None, name: str) -> list[cst.For]:
    """The ``for`` loops of ``scope`` (not of functions nested in it) whose target binds
    ``name``. ``scope`` is a scope of the analysed tree (`ScriptModel.scope_of`): its loops are
    read from the analysis's walk by type, in source order (not by a walk of the scope with a
    type test per node)."""
    if scope is None:
        return []
    return [
        node
        for node in script.index.of_type(cst.For)
        if script.scope_of(node) is scope
        and any(type(n) is cst.Name and n.value == name for n in walk(node.target))  # type: ignore[attr-defined]
    ]


def _aliased(script: ScriptModel, name: str, at: cst.CSTNode, depth: int) -> set[str]:
    """``name`` and the models it stands for (``uw_model = policy.model if hasattr(policy,
    "model") else policy``: ``policy.model`` and ``policy``)."""
    found = {name}
    if depth >= _MAX_DEPTH:
        return found
    scope, order = script.scope_of(at), script.order(at)
    for assign in script.index.assignments_to(name):
        if script.scope_of(assign) is not scope or script.order(assign) > order:
            continue
        value = assign.value
        arms = [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]
        for arm in arms:
            spelled = dotted(arm) if isinstance(arm, (cst.Name, cst.Attribute)) else None
            if spelled is not None and spelled != name:
                found |= _aliased(script, spelled, at, depth + 1)
    return found


def add_models_fed_to_optimizers(model: ScriptModel) -> None:
    """Whatever's ``.parameters()`` an optimizer is built from is a model, whatever made it."""
    known = {(b.name, id(b.scope)) for b in model.of_kind(Kind.MODEL)}
    fed = {
        name for optimizer in model.of_kind(Kind.OPTIMIZER) for name in parameter_owners(optimizer)
    }
    fed_here = _fed_to_inline_optimizers(model)
    for name, assign, value in _assignments(model):
        if (
            (name in fed or (name, id(model.scope_of(assign))) in fed_here)
            and (name, id(model.scope_of(assign))) not in known
            and not _in_model_class(assign, model)
        ):
            statement = model.parent(assign)
            if isinstance(statement, cst.SimpleStatementLine):
                model.bindings.append(
                    Binding(
                        name,
                        Kind.MODEL,
                        model.scope_of(assign),
                        statement,
                        assign,
                        value,
                        model,
                    )
                )
                known.add((name, id(model.scope_of(assign))))
    _add_kept_parameters(model, known)


def _fed_to_inline_optimizers(model: ScriptModel) -> set[tuple[str, int]]:
    """``train_model(model, loader, optim.Adam(model.parameters(), lr=1e-2))``: an optimizer
    made in a call's arguments, bound to no name, still trains the model whose parameters it
    is built from (ERNet's ``__main__``, its model a class of another module): that model is
    found through it, in the scope of the call (name, id of the scope), so that it is prepared
    where it is made, not left out while a scheduler over the same optimizer is prepared."""
    found: set[tuple[str, int]] = set()
    for call in model.calls:
        if not isinstance(model.parent(call), cst.Arg):
            continue
        if not any(is_optimizer_class(q) for q in model.call_names(call)):
            continue
        owners: set[str] = set()
        for argument in call.args:
            _params(model, argument.value, owners)
        scope = id(model.scope_of(call))
        found |= {(owner, scope) for owner in owners}
    return found


def _add_kept_parameters(model: ScriptModel, known: set[tuple[str, int]]) -> None:
    """``def __init__(self, model, ...)``: ``self.model = model``, then ``self.optimizer =
    SGD(model.parameters())``: the attribute the other methods train is the model handed in,
    received as the parameter is, also where no call of this file builds the class (a trainer
    module built by another file of the project)."""
    for optimizer in model.of_kind(Kind.OPTIMIZER):
        scope = optimizer.scope
        if not isinstance(scope, cst.FunctionDef) or not isinstance(
            model.parent(model.parent(scope)), cst.ClassDef
        ):
            continue
        parameters = {p.name.value for p in scope.params.params}
        kept = attributes_kept(model, scope)
        for owner in parameter_owners(optimizer) & parameters:
            attribute = kept.get(owner)
            if attribute is None or (attribute, id(scope)) in known:
                continue
            for assign in model.index.own_assignments(scope):
                statement = model.parent(assign)
                if isinstance(statement, cst.SimpleStatementLine) and any(
                    dotted(t) == attribute for t in assigned_targets(assign)
                ):
                    model.bindings.append(
                        Binding(
                            attribute,
                            Kind.MODEL,
                            scope,
                            statement,
                            assign,
                            assign.value,
                            model,
                            received=True,
                        )
                    )
                    known.add((attribute, id(scope)))
                    break


def _in_model_class(node: cst.CSTNode, model: ScriptModel) -> bool:
    for ancestor in model.ancestors(node):
        if isinstance(ancestor, cst.ClassDef):
            return ancestor.name.value in model.module_classes
    return False


def _assignments(model: ScriptModel) -> Iterator[tuple[str, cst.Assign, cst.BaseExpression]]:
    for node in model.assignments:
        for target in assigned_targets(node):
            name = dotted(target)
            if name:
                yield name, node, node.value


def used_entry_aliases(
    script: ScriptModel, model: Binding, before_line: int
) -> list[cst.BaseExpression]:
    """The containers that also hold the module bound to ``model`` (``models = {"net": net}``,
    ``models["net"] = net``, ``[net]``), in its scope, filled above ``before_line`` (where the
    prepare call goes: a container filled below it holds the prepared model), and read by
    entry somewhere (``models["net"](xb)``): preparing ``net`` leaves the entry the bare
    module, so a forward through the entry skips the DDP wrapper and its gradients are never
    synchronised. Each such container's read, the first one."""
    containers: set[str] = set()
    for node in walk(model.scope):
        if not isinstance(node, cst.Assign) or script.scope_of(node) is not model.scope:
            continue
        if script.line(node) >= before_line:
            continue
        if isinstance(node.value, (cst.Dict, cst.List, cst.Tuple, cst.Set)) and any(
            isinstance(n, cst.Name) and n.value == model.name for n in _elements(node.value)
        ):
            containers |= {t.target.value for t in node.targets if isinstance(t.target, cst.Name)}
        if isinstance(node.value, cst.Name) and node.value.value == model.name:
            containers |= {
                name
                for t in node.targets
                if isinstance(t.target, cst.Subscript) and (name := root_name(t.target)) is not None
            }
    if not containers:
        return []
    targets = {
        id(t.target) for n in walk(script.module) if isinstance(n, cst.Assign) for t in n.targets
    }
    found: dict[str, cst.BaseExpression] = {}
    for node in walk(script.module):
        if (
            isinstance(node, cst.Subscript)
            and id(node) not in targets
            and isinstance(node.value, cst.Name)
            and node.value.value in containers
        ):
            found.setdefault(node.value.value, node)
    return list(found.values())


def _elements(container: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The values a literal container holds: a dict's values, a list's items."""
    if isinstance(container, cst.Dict):
        return [e.value for e in container.elements if isinstance(e, cst.DictElement)]
    if isinstance(container, (cst.List, cst.Tuple, cst.Set)):
        return [e.value for e in container.elements if isinstance(e, cst.Element)]
    return []
