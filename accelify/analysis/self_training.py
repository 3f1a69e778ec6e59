"""Models that train themselves: an ``nn.Module`` subclass whose own method runs the backward
and steps an optimizer the model holds (a forward-forward layer's ``train(x_pos, x_neg)``).

``prepare`` cannot serve such a model: the DDP wrapper has none of its methods, and calling the
model unwrapped bypasses DDP's gradient hooks. What DDP would do is done by hand instead, through
the public API of both runtimes: the model moves to this rank's device, starts from rank 0's
weights (``broadcast``), and averages its gradients after its own backward
(``accelerator.reduce(grad, "mean")``). That is only right when every instance is a name the
conversion follows and nothing else trains it; otherwise `blocker` says why, and the script is
left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from accelify.analysis.call_graph import CallGraph
from accelify.analysis.optimizer_models import parameter_owners
from accelify.analysis.placement import Placement
from accelify.analysis.precision import Precision
from accelify.analysis.script_model import Binding, Kind, ScriptModel
from accelify.analysis.syntax import dotted, self_parameter, strip_self_methods


@dataclass
class SelfTraining:
    """One class that trains itself, its backward calls and the names its instances live in."""

    owner: cst.ClassDef
    #: the ``.backward()`` calls in the class's methods
    backward_calls: list[cst.Call]
    #: each backward call's method and the name that method calls its instance (``self``)
    receivers: dict[cst.Call, str] = field(default_factory=dict)
    #: bindings made by calling the class (or a subclass of it): ``layer = Layer(4, 4)``
    instances: list[Binding] = field(default_factory=list)
    #: why the conversion cannot average its gradients by hand; None when it can
    blocker: str | None = None

    @property
    def name(self) -> str:
        return self.owner.name.value


def self_training_of(
    model: ScriptModel, placement: Placement, calls: CallGraph, precision: Precision
) -> list[SelfTraining]:
    """Every model class of the file whose own methods call ``.backward()``, in source order."""
    found: dict[str, SelfTraining] = {}
    for call in model.backward_calls:
        owner = placement.class_of(call)
        if owner is None or owner.name.value not in model.module_classes:
            continue
        entry = found.setdefault(owner.name.value, SelfTraining(owner, []))
        entry.backward_calls.append(call)
    for entry in found.values():
        entry.blocker = _blocker(entry, model, placement, calls, precision)
    return list(found.values())


def _blocker(
    entry: SelfTraining,
    model: ScriptModel,
    placement: Placement,
    calls: CallGraph,
    precision: Precision,
) -> str | None:
    for call in entry.backward_calls:
        method = placement.enclosing_function(call)
        receiver = self_parameter(method) if method is not None else None
        if method is None or calls.owner(method) is not entry.owner or receiver is None:
            return "its backward runs outside a method of its own (a nested function, a lambda)"
        entry.receivers[call] = receiver
    if precision.autocasts or precision.scalers:
        return (
            "the script uses mixed precision: the Accelerator scales and casts only what it "
            "prepares, never this model's own optimizer"
        )
    classes = {entry.name, *(sub.name.value for sub in calls.subclasses(entry.owner))}
    instances = {
        id(binding.value): binding
        for binding in model.of_kind(Kind.MODEL)
        if not binding.received and _constructed(binding.value) in classes
    }
    for call in model.calls:
        if dotted(call.func) in classes and not any(
            _constructor(b.value) is call for b in instances.values()
        ):
            return (
                f"{dotted(call.func)}(...) at line {model.line(call)} is not bound to a name the "
                "conversion follows (a list, another model's attribute)"
            )
    if not instances:
        return "no instance of it is made in this file"
    entry.instances = sorted(instances.values(), key=lambda b: model.order(b.assign))
    names = {binding.name for binding in entry.instances}
    for optimizer in model.of_kind(Kind.OPTIMIZER):
        if parameter_owners(optimizer) & names:
            return f"the optimizer at line {optimizer.line} trains it too, from outside"
    return None


def _constructor(value: cst.BaseExpression) -> cst.Call | None:
    """The class call that makes ``value``, through moves: ``Layer(4)`` of ``Layer(4).to(d)``."""
    core = strip_self_methods(value)
    return core if isinstance(core, cst.Call) else None


def _constructed(value: cst.BaseExpression) -> str | None:
    call = _constructor(value)
    return dotted(call.func) if call is not None else None


def moves_itself(binding: Binding) -> bool:
    """``Layer(4).to(device)``: the script places the instance where it makes it."""
    value = binding.value
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        if value.func.attr.value in ("to", "cuda"):
            return True
        value = value.func.value
    return False
