"""Layers a model runs outside its own forward during training.

DDP reduces the gradients of the forward it runs itself (``model(x)``). A training step that runs
the model's layers another way gets none of them reduced: ``model.decoder(z)``,
``model.compute_loss(x)`` whose body runs ``self.head``, or the model handed to a helper
(``reconstruction_loss(model, x)``) or to a loss module (``self.loss_function(self.model, x)``,
whose forward runs ``model.encoder``) that does either. Called through the wrapper, the first such
call raises AttributeError on 2 ranks; called through ``unwrap_model``, the ranks drift apart
with nothing said. Neither is a conversion, so the conversion leaves such a script as it is and
says why at each call.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property

import libcst as cst

from accelify.analysis import names
from accelify.analysis.flow import ObjectFlow
from accelify.analysis.idle_members import (
    class_methods,
    holds_no_parameters,
    holds_parameters,
    member_values,
    without_gradients,
)
from accelify.analysis.loops import find_backward
from accelify.analysis.objects import bound_arguments, methods_of, received_name
from accelify.analysis.placement import Placement
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import assigned_targets, dotted, self_parameter, walk

#: How many helpers deep a model handed on is followed.
_DEPTH = 3


@dataclass(frozen=True)
class OutsideForward:
    """A call in a training step that runs a model's layers outside the model's forward."""

    call: cst.Call
    #: what runs the layers: ``model.decoder()``, or ``reconstruction_loss(model, ...)``
    what: str
    #: where a helper runs them, when the call hands the model on: ``model.decoder() (line 17)``
    through: str | None = None


def layers_outside_forward(
    model: ScriptModel,
    placement: Placement,
    flow: ObjectFlow,
    unprepared: set[str],
    imported: Mapping[str, str] | None = None,
) -> list[OutsideForward]:
    """Each such call; models in ``unprepared`` (frozen: no optimizer trains them, so they are
    not wrapped) are not asked about. ``imported``: members that run layers of the model
    classes the file imports from its project's other modules (`layer_members` of each), with
    where each is defined (``litbase.py:33``): ``module.training_step((x, y), i)`` on a
    ``Classifier`` made in ``litbase.py`` runs ``self(x)`` there."""
    finder = _Finder(model, placement, flow, unprepared, imported or {})
    found = []
    for call in model.calls:
        if not finder.in_training(call):
            continue
        direct = finder.direct(call, finder.is_prepared_model)
        if direct is not None:
            found.append(OutsideForward(call, direct))
            continue
        handed = finder.handed_on(call, _DEPTH)
        if handed is not None:
            found.append(OutsideForward(call, *handed))
    return found


def in_training_step(model: ScriptModel, placement: Placement, call: cst.Call) -> bool:
    """``call`` runs where gradients are computed for a backward: in a loop that trains, or
    above a backward of its function, not under ``no_grad``."""
    return _Finder(model, placement, None, set(), {}).in_training(call)  # type: ignore[arg-type]


def defined_by_a_module_class(model: ScriptModel, member: str) -> bool:
    """Some module class of this file has ``member`` as a method or sets it in ``__init__``:
    whether it runs layers is known here."""
    return any(
        member in methods_of(model, class_name) or member in _assigned_members(model, class_name)
        for class_name in model.module_classes
    )


def layer_members(model: ScriptModel, class_name: str) -> dict[str, cst.CSTNode]:
    """The members of module class ``class_name`` of ``model`` that run its layers outside its
    forward: methods that do (`runs_layers`: ``training_step`` calling ``self(x)``) and members
    ``__init__`` sets to something holding parameters (``self.head``), each with the node that
    defines it. Asked of a module of the project a script imports its model class from, where
    the script's own analysis cannot read the class."""
    found: dict[str, cst.CSTNode] = {}
    assigned = _assigned_members(model, class_name)
    for member in _layers(model, assigned):
        found[member] = assigned[member][0]
    for name, method in class_methods(model, class_name).items():
        if name not in found and runs_layers(model, class_name, method):
            found[name] = method
    return found


class _Finder:
    def __init__(
        self,
        model: ScriptModel,
        placement: Placement,
        flow: ObjectFlow,
        unprepared: set[str],
        imported: Mapping[str, str],
    ) -> None:
        self.model = model
        self.placement = placement
        self.flow = flow
        self.unprepared = unprepared
        self.imported = imported

    def is_prepared_model(self, name: str | None, at: cst.CSTNode) -> bool:
        return name not in self.unprepared and self.flow.is_model_name(name, at)

    def in_training(self, call: cst.Call) -> bool:
        """In a loop that runs a backward, or above a backward of its function (a training
        step's helper); not under no_grad, nor after the training (``z = model.encoder(x)`` to
        look at the codes once the loop is done)."""
        if any(map(self.model.disables_grad, self.model.ancestors(call))):
            return False
        if any(loop.trains and self.placement.inside(call, loop.node) for loop in self.model.loops):
            return True
        function = self.placement.enclosing_function(call)
        if any(_while_that_trains(ancestor) for ancestor in self._ancestors_within(call, function)):
            return True  # ``while step < max_steps: batch = next(it)``, its backward inside
        here = self.model.order(call)
        return function is not None and any(
            self.placement.inside(backward, function) and self.model.order(backward) > here
            for backward in self.model.backward_calls
        )

    def _ancestors_within(
        self, node: cst.CSTNode, function: cst.CSTNode | None
    ) -> Iterator[cst.CSTNode]:
        for ancestor in self.model.ancestors(node):
            if ancestor is function:
                return
            yield ancestor

    def direct(self, call: cst.Call, is_model) -> str | None:
        """``model.decoder(z)`` or ``model.compute_loss(x)`` on a model (``is_model``); or one
        of a container's modules, ``self.task_heads[task_name](features)`` on a prepared
        ``nn.ModuleDict``: the wrapper's forward never runs, so none of it is reduced."""
        func = call.func
        if isinstance(func, cst.Subscript) and isinstance(func.value, (cst.Name, cst.Attribute)):
            owner = dotted(func.value)
            return f"{owner}[...]()" if owner is not None and is_model(owner, func) else None
        if not isinstance(func, cst.Attribute) or not isinstance(
            func.value, (cst.Name, cst.Attribute)
        ):
            return None
        owner, member = dotted(func.value), func.attr.value
        if owner is None or member in names.MODULE_API or member.startswith("__"):
            return None
        if not is_model(owner, func) or not self._runs_layers(member):
            return None
        where = self.imported.get(member) if member not in self._layer_members else None
        return f"{owner}.{member}()" + (f" (defined at {where})" if where else "")

    def handed_on(self, call: cst.Call, depth: int) -> tuple[str, str] | None:
        """``helper(model, x)`` whose body runs ``model.decoder(...)``, directly or through
        helpers of its own: what the call is, and where the layers run."""
        for function, implicit in self._targets(call):
            for parameter, argument in bound_arguments(function, call, implicit):
                if not self.is_prepared_model(dotted(argument.value), call):
                    continue
                inner = self._runs_through(function, parameter, depth)
                if inner is not None:
                    return f"{dotted(call.func)}(...)", inner
        return None

    def _runs_through(self, function: cst.FunctionDef, parameter: str, depth: int) -> str | None:
        def is_parameter(name: str | None, at: cst.CSTNode) -> bool:
            return name == parameter and self.placement.enclosing_function(at) is function

        if self.model.disables_grad(function):  # ``@torch.no_grad()``: nothing here trains
            return None
        for node in walk(function.body):
            if not isinstance(node, cst.Call) or without_gradients(self.model, node, function):
                continue
            direct = self.direct(node, is_parameter)
            if direct is not None:
                return f"{direct} (line {self.model.line(node)})"
            if depth > 1 and any(dotted(a.value) == parameter for a in node.args):
                for inner_function, implicit in self._targets(node):
                    for inner_parameter, argument in bound_arguments(
                        inner_function, node, implicit
                    ):
                        if dotted(argument.value) != parameter:
                            continue
                        inner = self._runs_through(inner_function, inner_parameter, depth - 1)
                        if inner is not None:
                            return inner
        return None

    def _targets(self, call: cst.Call) -> list[tuple[cst.FunctionDef, int]]:
        """The file's functions ``call`` runs: its callee, or the forward of a module of this
        file it calls (``self.loss_function(...)``)."""
        callee = self.model.call_graph.callee(call)
        if callee is not None:
            return [callee]
        name = dotted(call.func)
        made = self._module_class(name, call, _DEPTH) if name is not None else None
        forward = methods_of(self.model, made).get("forward") if made is not None else None
        return [(forward, 1)] if forward is not None else []

    def _module_class(self, name: str, at: cst.CSTNode, depth: int) -> str | None:
        """The module class of this file that made ``name``: built where it is assigned, or
        for ``self.loss_function = loss_function``, built where the constructor is called."""
        made = self.model.call_graph.instance_class(name, at)
        if made is not None:
            return made if made in self.model.module_classes else None
        if not name.startswith("self.") or depth == 0:
            return None
        owner = self.model.index.enclosing_class(at)
        for method in methods_of(self.model, owner.name.value).values() if owner else ():
            for parameter in _stored_parameters(method, name):
                for call, implicit in self.model.call_graph.calls_of(method):
                    for bound, argument in bound_arguments(method, call, implicit):
                        if bound != parameter:
                            continue
                        made = self._made_by(argument.value, call, depth - 1)
                        if made is not None:
                            return made
        return None

    def _made_by(self, value: cst.BaseExpression, at: cst.CSTNode, depth: int) -> str | None:
        if isinstance(value, cst.Call) and dotted(value.func) in self.model.module_classes:
            return dotted(value.func)
        name = dotted(value)
        return self._module_class(name, at, depth) if name is not None else None

    def _runs_layers(self, member: str) -> bool:
        return member in self._layer_members or member in self.imported

    @cached_property
    def _layer_members(self) -> set[str]:
        """What some module class of this file holds as a layer with parameters, or has as a
        method that runs its layers."""
        found: set[str] = set()
        for class_name in self.model.module_classes:
            found |= _layers(self.model, _assigned_members(self.model, class_name))
            found |= {
                name
                for name, method in methods_of(self.model, class_name).items()
                if runs_layers(self.model, class_name, method)
            }
        return found


def runs_layers(
    model: ScriptModel, class_name: str, method: cst.FunctionDef, depth: int = _DEPTH
) -> bool:
    """``method`` of a module class runs the model's layers: ``self(x)``, ``self.forward(x)``,
    ``self.head(x)``, ``for layer in self.layers``, ``x @ self.weight``, or another method that
    does. A member ``__init__`` sets only to something without parameters (a loss, dropout,
    ``F.cross_entropy``) is not a layer: calling it outside the wrapper loses nothing."""
    if method.name.value in names.MODULE_API or model.disables_grad(method):
        return False
    methods = class_methods(model, class_name)
    holding = _layers(model, _assigned_members(model, class_name))
    me = self_parameter(method)
    for node in walk(method.body):
        if (
            isinstance(node, cst.Attribute)
            and dotted(node.value) == me
            and node.attr.value in holding
            and not _no_gradient(model, node)
        ):
            return True
        if not isinstance(node, cst.Call) or me is None:
            continue
        func = dotted(node.func)
        if func in (me, f"{me}.forward"):
            return True
        if func is None or func.count(".") != 1 or not func.startswith(f"{me}."):
            continue
        member = func.split(".", 1)[1]
        if member in methods:
            if depth > 1 and runs_layers(model, class_name, methods[member], depth - 1):
                return True
            continue
        if member in names.MODULE_API:
            continue
        values = _assigned_members(model, class_name).get(member)
        if values and all(holds_no_parameters(model, v) for v in values):
            continue
        return True
    return False


def _no_gradient(model: ScriptModel, member: cst.Attribute) -> bool:
    """``self.t.data`` (``self.t.data = torch.clamp(self.t.data, max=10)``, a CLIP trainer's
    temperature clamp), or a read under ``torch.no_grad()``: the parameter is touched with no
    gradient to reduce, so the method runs no layer the wrapper's forward should have run."""
    parent = model.parent(member)
    if isinstance(parent, cst.Attribute) and parent.value is member and parent.attr.value == "data":
        return True
    return any(model.disables_grad(a) for a in model.ancestors(member))


def _assigned_members(model: ScriptModel, class_name: str) -> dict[str, list[cst.BaseExpression]]:
    init = class_methods(model, class_name).get("__init__")
    return member_values(init) if init is not None else {}


def _layers(model: ScriptModel, assigned: dict[str, list[cst.BaseExpression]]) -> set[str]:
    """The members some assignment sets to something holding parameters."""
    return {m for m, values in assigned.items() if any(holds_parameters(model, v) for v in values)}


def _stored_parameters(method: cst.FunctionDef, attribute: str) -> list[str]:
    """``self.loss_function = loss_function`` in ``method``: the parameters it stores as
    ``attribute`` (``self.<name>``), read the way the object model reads a received attribute
    (`objects.received_name`)."""
    target = f"{self_parameter(method)}.{attribute.split('.', 1)[1]}"
    parameters = {p.name.value for p in (*method.params.params, *method.params.kwonly_params)}
    found = []
    for node in walk(method.body):
        if not isinstance(node, cst.Assign):
            continue
        name = received_name(method, node.value)
        if name in parameters and any(dotted(t) == target for t in assigned_targets(node)):
            found.append(name)
    return found


def unwrapped_forwards(
    model: ScriptModel, placement: Placement, flow: ObjectFlow, accelerators: set[str]
) -> dict[cst.Call, str]:
    """Forwards of a prepared model through ``unwrap_model`` in a training step, with the model's
    name: ``raw_model = accelerator.unwrap_model(model)`` then ``raw_model(input_ids=...)`` (an
    asymmetric bi-encoder's training loop), ``accelerator.unwrap_model(model)(x)``, or a method
    of it that runs the model's layers (``unwrap_model(model).training_step(batch, i)`` whose
    body calls ``self(x)``). The DistributedDataParallel wrapper's own forward is what arms
    its gradient hooks; the model's forward called past it leaves the backward's gradients on
    each rank unreduced, and the replicas drift apart with nothing said."""
    finder = _Finder(model, placement, flow, set(), {})
    found: dict[cst.Call, str] = {}
    for call in model.calls:
        unwrapped = _unwrapped_model(model, call.func, call, accelerators)
        func = call.func
        if (
            unwrapped is None
            and isinstance(func, cst.Attribute)
            and func.attr.value not in names.MODULE_API
            and finder._runs_layers(func.attr.value)
        ):
            # ``accelerator.unwrap_model(model).training_step(batch, i)``, whose body runs
            # ``self(x)``: the same forward past the wrapper, one method down
            unwrapped = _unwrapped_model(model, func.value, call, accelerators)
        if unwrapped is None or not finder.in_training(call):
            continue
        if finder.is_prepared_model(unwrapped, call):
            found[call] = unwrapped
    return found


def _unwrapped_model(
    model: ScriptModel, func: cst.BaseExpression, at: cst.CSTNode, accelerators: set[str]
) -> str | None:
    """The model ``func`` unwraps: ``accelerator.unwrap_model(model)`` itself, or a name its
    function (or the module, at module level) binds to that call only (once, or each time
    unwrapping the same model: a robot-policy trainer's ``uw = accelerator.unwrap_model(policy)``
    to count parameters, again to resume, again per batch for the forward)."""
    if isinstance(func, cst.Name):
        function = model.index.enclosing_function(at)
        values = [
            assign.value
            for assign in model.index.assignments_to(func.value)
            if model.index.enclosing_function(assign) is function
        ]
        unwrapped = {_unwrapped_model(model, value, at, accelerators) for value in values}
        return unwrapped.pop() if len(unwrapped) == 1 else None
    if not isinstance(func, cst.Call) or not func.args:
        return None
    callee = func.func
    if not (
        isinstance(callee, cst.Attribute)
        and callee.attr.value == "unwrap_model"
        and dotted(callee.value) in accelerators
    ):
        return None
    return dotted(func.args[0].value)


def _while_that_trains(node: cst.CSTNode) -> bool:
    """A ``while`` loop whose body runs a backward (``accelerator.backward(loss)``): the file's
    loops (`ScriptModel.loops`) are its ``for`` loops only."""
    return isinstance(node, cst.While) and next(find_backward(node.body), None) is not None
