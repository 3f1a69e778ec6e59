"""DataLoaders rebuilt on every step over tensors the run has just made on this rank.

An RL trainer batches the rollouts it generated this step (``DataLoader(TensorDataset(*rollouts))``
inside ``step_with_rollouts(rollouts)``, called once per step of the training loop); so do
pseudo-labelling and replay-buffer loops. Each rank made its own rollouts from its own shard of
the prompts: the loader already holds this rank's data, and ``prepare`` would shard it again and
drop (N-1)/N of it. A trainer's public method that nothing in the file calls
(``IterativeSFTTrainer.step(input_ids=...)``) is one of those steps: its user hands it each
step's data. A loader built once over the dataset (even through a helper, or in a loop over
folds of a global dataset) is not one of these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.names import DATALOADERS
from accelify.analysis.objects import bound_arguments, callee
from accelify.analysis.repeated_effects import callers_of
from accelify.analysis.script_model import Kind, Loop, ScriptModel
from accelify.analysis.syntax import (
    argument_value,
    assigned_targets,
    dotted,
    strip_self_methods,
    walk,
)

if TYPE_CHECKING:
    from accelify.analysis.facts import Facts


def over_step_data(facts: Facts, loop: Loop) -> bool:
    """``loop`` reads a DataLoader made, on every step of an outer loop, over a dataset built
    from nothing but the arguments of the function that makes it."""
    model = facts.model
    function = facts.placement.enclosing_function(loop.node)
    binding = next(
        (
            b
            for b in model.bindings
            if b.name == loop.iterable
            and b.kind is Kind.DATALOADER
            and facts.placement.enclosing_function(b.assign) is function
            and model.order(b.assign) < model.order(loop.node)
        ),
        None,
    )
    if binding is None:
        return False
    value = strip_self_methods(binding.value)
    if not isinstance(value, cst.Call):
        return False
    if model.call_names(value) & DATALOADERS and _over_step_buffers(model, value, binding.assign):
        return True
    if function is None:
        return False
    home, constructor = function, value
    if not model.call_names(value) & DATALOADERS:
        target = callee(model, value)
        if target is None:
            return False
        home = target[0]
        constructor = next(
            (
                c
                for c in model.calls
                if model.call_names(c) & DATALOADERS and _within(model, c, home)
            ),
            None,
        )
        if constructor is None or not _data_from_arguments(model, value, function, home):
            return False
    return _dataset_from_arguments(model, constructor, home) and _per_iteration(
        facts, binding.assign, 0
    )


_FILLS = frozenset({"append", "extend", "add", "push", "insert", "add_experience"})


def _over_step_buffers(model: ScriptModel, constructor: cst.Call, made: cst.CSTNode) -> bool:
    """``replay_buffer.clear()``, filled with this step's rollouts, then
    ``DataLoader(replay_buffer)`` in the same pass of the loop: every name the dataset reads is
    emptied (or made anew) and filled again on each pass before the loader is built, so the
    loader holds what this rank made in this pass, not a dataset of the run."""
    dataset = argument_value(constructor, "dataset")
    loop = next((a for a in model.ancestors(made) if isinstance(a, (cst.For, cst.While))), None)
    if dataset is None or loop is None:
        return False
    names = _value_names(dataset) if not isinstance(dataset, cst.Name) else {dataset.value}
    before = model.order(made)
    emptied: set[str] = set()
    filled: set[str] = set()
    for node in walk(loop.body):
        order = model.orders.get(node)
        if order is None or order >= before:
            continue
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            receiver = node.func.value
            if isinstance(receiver, cst.Name) and receiver.value in names:
                if node.func.attr.value == "clear":
                    emptied.add(receiver.value)
                elif node.func.attr.value in _FILLS:
                    filled.add(receiver.value)
        elif isinstance(node, cst.Assign):
            for target in assigned_targets(node):
                if isinstance(target, cst.Name) and target.value in names:
                    emptied.add(target.value)
    return bool(names) and names <= emptied & filled


def _within(model: ScriptModel, node: cst.CSTNode, container: cst.CSTNode) -> bool:
    return any(a is container for a in model.ancestors(node))


def _parameters(function: cst.FunctionDef) -> set[str]:
    params = function.params
    every = [*params.posonly_params, *params.params, *params.kwonly_params]
    return {p.name.value for p in every} - {"self", "cls"}


def _value_names(node: cst.CSTNode) -> set[str]:
    """Names read as values in ``node`` (not the functions it calls, not attribute names,
    not the targets of its own comprehensions)."""
    read: set[str] = set()
    bound: set[str] = set()
    keywords: set[int] = set()
    for sub in walk(node):
        if isinstance(sub, cst.CompFor):
            bound |= {n.value for n in walk(sub.target) if isinstance(n, cst.Name)}
        elif isinstance(sub, cst.Call) and isinstance(sub.func, cst.Name):
            bound.add(sub.func.value)  # ``list(...)``, ``TensorDataset(...)``: the callee
        elif isinstance(sub, cst.Call) and isinstance(sub.func, cst.Attribute):
            root = sub.func.value
            if isinstance(root, cst.Name) and root.value[:1].isupper():
                bound.add(root.value)  # ``Dataset.from_dict(...)``: a class's constructor
        elif isinstance(sub, cst.Attribute):
            bound.add(sub.attr.value)
        elif isinstance(sub, cst.Arg) and sub.keyword is not None:
            keywords.add(id(sub.keyword))  # ``batch_first=True``: a keyword, not a value read
    for sub in walk(node):
        if isinstance(sub, cst.Name) and id(sub) not in keywords:
            read.add(sub.value)
    return read - bound - {"True", "False", "None"}


def _from_arguments(model: ScriptModel, call: cst.Call, function: cst.FunctionDef) -> bool:
    """Every value ``call`` passes comes from ``function``'s own parameters."""
    names = set().union(*(_value_names(a.value) for a in call.args)) if call.args else set()
    return bool(names) and names <= _parameters(function)


def _data_from_arguments(
    model: ScriptModel, call: cst.Call, function: cst.FunctionDef, home: cst.FunctionDef
) -> bool:
    """``create_dataloader(stacked, self.minibatch_size, device=self.accelerator.device)`` in
    ``learn(self, memories)``, where ``stacked`` is made from ``memories``: the data the helper
    batches comes from ``function``'s parameters (or locals made from them alone); its other
    arguments (a batch size, a device) are settings, not data. Every value passed qualifies as
    well (``_from_arguments``)."""
    if _from_arguments(model, call, function):
        return True
    implicit = 1 if home.params.params and home.params.params[0].name.value == "self" else 0
    pairs = bound_arguments(home, call, implicit)
    data = _dataset_parameters(model, home)
    own = _parameters(function) | _locals_from_parameters(model, function)
    fed = [argument for parameter, argument in pairs if parameter in data]
    return (
        bool(fed)
        and all(
            _value_names(argument.value) <= own or _a_device(argument.value) for argument in fed
        )
        and any(_value_names(argument.value) & own for argument in fed)
    )


def _a_device(value: cst.BaseExpression) -> bool:
    """``self.accelerator.device``, ``device``: where the tensors go, not what they hold."""
    name = dotted(value)
    return name is not None and name.rsplit(".", 1)[-1] == "device"


def _dataset_parameters(model: ScriptModel, home: cst.FunctionDef) -> set[str]:
    """The parameters of ``home`` that the dataset of its DataLoader reads (``data`` of
    ``ds = ExperienceDataset(data, device=device); return DataLoader(ds, ...)``)."""
    constructor = next(
        (c for c in model.calls if model.call_names(c) & DATALOADERS and _within(model, c, home)),
        None,
    )
    dataset = _dataset_of(model, constructor, home) if constructor is not None else None
    if dataset is None:
        return set()
    return _value_names(dataset) & _parameters(home)


def _dataset_of(
    model: ScriptModel, constructor: cst.Call, home: cst.FunctionDef
) -> cst.BaseExpression | None:
    """The loader's ``dataset`` argument, or the one value ``home`` binds to the name it is
    (``ds = ExperienceDataset(data)``); None where there is none or several."""
    dataset = argument_value(constructor, "dataset")
    if isinstance(dataset, cst.Name):
        made = [
            assign.value
            for assign in model.assignments
            if _within(model, assign, home)
            and any(
                isinstance(t, cst.Name) and t.value == dataset.value
                for t in assigned_targets(assign)
            )
        ]
        return made[0] if len(made) == 1 else None
    return dataset


def _dataset_from_arguments(
    model: ScriptModel, constructor: cst.Call, home: cst.FunctionDef
) -> bool:
    """The loader's dataset is built in ``home`` (``TensorDataset(...)``, directly or through a
    local) from ``home``'s parameters alone: not a dataset that exists outside the call."""
    dataset = _dataset_of(model, constructor, home)
    if dataset is None:
        return False
    if not isinstance(dataset, cst.Call):
        return False
    names = _value_names(dataset)
    return bool(names) and names <= _parameters(home) | _locals_from_parameters(model, home)


def _locals_from_parameters(model: ScriptModel, home: cst.FunctionDef) -> set[str]:
    """Locals of ``home`` assigned only from its parameters (``keys = tuple(rollouts.keys())``)."""
    params = _parameters(home)
    code = _code_names(model)
    found: set[str] = set()
    for assign in model.assignments:
        if not _within(model, assign, home) or len(assigned_targets(assign)) != 1:
            continue
        target = assigned_targets(assign)[0]
        read = _value_names(assign.value) - code
        if isinstance(target, cst.Name) and read <= params:
            found.add(target.value)
    return found


def _code_names(model: ScriptModel) -> set[str]:
    """Names that hold code, not data: the file's imports (``pad_sequence`` handed to ``map``)
    and its top-level functions and classes."""
    defined = {
        statement.name.value
        for statement in model.module.body
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef))
    }
    return set(model.imports.bound) | defined


def _per_iteration(facts: Facts, node: cst.CSTNode, depth: int) -> bool:
    """``node`` runs on every pass of some loop: inside one, or in a function called in one."""
    model = facts.model
    function = facts.placement.enclosing_function(node)
    for ancestor in model.ancestors(node):
        if ancestor is function:
            break
        if isinstance(ancestor, (cst.For, cst.While)):
            return True
    if function is None or depth >= 3:
        return False
    sites = callers_of(model, facts.placement, function)
    if (
        not sites
        and facts.placement.is_method(function)
        and not function.name.value.startswith("_")
    ):
        # a trainer's public ``step(inputs)``: its caller hands it each step's data
        return True
    return any(_per_iteration(facts, site, depth + 1) for site in sites)
