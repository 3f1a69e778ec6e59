"""What the loss handed to a backward is computed from.

A rule about what reaches a backward (a loss built from gathered values, a loss divided by the
number of processes) asks the same question: which expressions does the value that
``accelerator.backward(loss)`` (or ``loss.backward()``) differentiates depend on? The answer
follows the value back through the names it was bound to (the last binding before the use, in
the same function or module), through a function of the file that returned it (``loss =
self.compute_loss(batch)``), and through a helper's parameter to what its callers pass: an
attribute, a parameter and a return value are the same object as the local they came from.

Denominators are not followed: ``loss_sum / n_tokens`` differentiates the numerator, and a
count gathered across ranks in a denominator is no gradient path (HF Trainer divides a summed
loss by the tokens of every rank on purpose). Nor is what ``.detach()``/``.item()`` cut off.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import libcst as cst

from accelify.analysis.facts import Facts, facts_of
from accelify.analysis.objects import bound_arguments
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import children_of, dotted

#: Methods whose result carries no gradient: nothing behind them reaches a backward.
_CUTS_GRADIENT = frozenset({"detach", "item", "tolist", "numpy", "cpu_detach"})
#: Methods whose result holds the receiver's values: their arguments say where (a device), in
#: which dtype or in which shape, and are no part of what the value is computed from
#: (``batch["x"].to(model.device)`` is the batch's, not the model's).
_KEEPS_RECEIVER = frozenset(
    {
        "to",
        "cuda",
        "cpu",
        "type",
        "type_as",
        "view",
        "reshape",
        "expand",
        "permute",
        "transpose",
        "squeeze",
        "unsqueeze",
        "flatten",
        "contiguous",
        "float",
        "half",
        "bfloat16",
        "double",
    }
)
#: Builtins whose result is a plain Python number, which carries no gradient (``len(loader)``,
#: ``int(total / world_size)``): what they are computed from does not reach a backward.
_NUMBERS = frozenset(f"builtins.{name}" for name in ("len", "int", "float", "round", "bool"))
#: Objects a loss is computed *by*, not from: how a model, an optimizer or a loader was made
#: (``accelerator.prepare(model, optimizer, scheduler)``, the scheduler's step count) is no
#: value the loss holds.
_NOT_VALUES = frozenset(
    {Kind.MODEL, Kind.OPTIMIZER, Kind.SCHEDULER, Kind.DATALOADER, Kind.ACCELERATOR, Kind.SCALER}
)
#: How many bindings, returns and call sites one walk follows before it stops.
_MAX_STEPS = 200
_Binding = cst.Assign | cst.AugAssign | cst.AnnAssign


@dataclass(frozen=True)
class Backward:
    """A backward call and the expression whose gradient it computes."""

    call: cst.Call
    loss: cst.BaseExpression


def backwards(script: ScriptModel) -> list[Backward]:
    """``accelerator.backward(loss, ...)`` of an accelerator (also ``self.accelerator``, a
    parameter that receives one), DeepSpeed's ``model_engine.backward(loss)`` and
    ``loss.backward()``, with their losses."""
    facts = facts_of(script)
    accelerators = facts.flow.names_of(Kind.ACCELERATOR)
    found: list[Backward] = []
    for call in script.calls:
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "backward"):
            continue
        receiver = dotted(func.value)
        positional = [a for a in call.args if a.keyword is None and not a.star]
        if receiver is not None and (
            receiver in accelerators or (positional and _engine(facts, receiver, call))
        ):
            if positional:
                found.append(Backward(call, positional[0].value))
        elif any(call is b for b in script.backward_calls):
            found.append(Backward(call, func.value))
    return found


def _engine(facts: Facts, receiver: str, call: cst.Call) -> bool:
    """``model_engine.backward(loss)``: DeepSpeed's engine (a model, or named for one) takes
    the loss as its argument, where ``loss.backward(gradient)`` is the tensor's own."""
    return (
        facts.flow.kind_of(receiver, call) is Kind.MODEL
        or "engine" in receiver.rsplit(".", 1)[-1].lower()
    )


@dataclass
class _Walk:
    script: ScriptModel
    #: a call not to look into (its arguments do not reach the value the walk follows)
    stop_at: Callable[[cst.Call], bool]
    seen: set[int] = field(default_factory=set)
    steps: int = 0


def loss_sources(
    script: ScriptModel,
    value: cst.BaseExpression,
    at: cst.CSTNode,
    stop_at: Callable[[cst.Call], bool] = lambda call: False,
) -> Iterator[cst.CSTNode]:
    """Every expression (and ``x /= n`` statement) that ``value``, read at ``at``, is computed
    from, ``value`` first; the arguments of a call ``stop_at`` accepts are not entered."""
    yield from _sources(_Walk(script, stop_at), value, at)


def _sources(walk: _Walk, node: cst.CSTNode, at: cst.CSTNode) -> Iterator[cst.CSTNode]:
    if id(node) in walk.seen or walk.steps > _MAX_STEPS:
        return
    walk.seen.add(id(node))
    walk.steps += 1
    yield node
    if isinstance(node, (cst.Name, cst.Attribute)) and dotted(node) is not None:
        if facts_of(walk.script).flow.kind_of(dotted(node), at) in _NOT_VALUES:
            return
        yield from _bound_value(walk, node, at)
        if isinstance(node, cst.Attribute):
            yield from _sources(walk, node.value, at)
        return
    if isinstance(node, cst.BinaryOperation) and isinstance(
        node.operator, (cst.Divide, cst.FloorDivide)
    ):
        yield from _sources(walk, node.left, at)  # the denominator is no gradient path
        return
    if isinstance(node, cst.Call):
        yield from _call_sources(walk, node, at)
        return
    if isinstance(node, (cst.Lambda, cst.FunctionDef, cst.ClassDef, cst.Comparison)):
        return
    for child in children_of(node):
        if isinstance(child, cst.BaseExpression | cst.Arg | cst.Element | cst.DictElement):
            yield from _sources(walk, child, at)
        elif isinstance(child, (cst.Index, cst.SubscriptElement, cst.Slice)):
            continue  # an index picks rows, it does not compute them


def _call_sources(walk: _Walk, call: cst.Call, at: cst.CSTNode) -> Iterator[cst.CSTNode]:
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value in _CUTS_GRADIENT:
        return
    if walk.stop_at(call):
        return
    if walk.script.qualified(func) & _NUMBERS:
        return
    facts = facts_of(walk.script)
    for function in facts.calls.targets(call):
        for returned in walk.script.index.own_returns(function):
            yield from _sources(walk, returned.value, returned)  # type: ignore[arg-type]
    if isinstance(func, cst.Attribute):
        yield from _sources(walk, func.value, at)  # ``loss.mean()``, ``out.logits.float()``
        if func.attr.value in _KEEPS_RECEIVER:
            return
    for argument in call.args:
        yield from _sources(walk, argument.value, at)


def _bound_value(walk: _Walk, node: cst.BaseExpression, at: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """What ``node`` (a name or ``self.x``) holds at ``at``: its last binding above ``at`` in
    the same function, then (for ``x /= n``) the binding before that; for a parameter, what
    the function's callers pass."""
    name = dotted(node)
    binding = last_binding(walk.script, name, at)  # type: ignore[arg-type]
    while binding is not None:
        if isinstance(binding, cst.AugAssign):
            yield binding
            if not isinstance(binding.operator, (cst.DivideAssign, cst.FloorDivideAssign)):
                yield from _sources(walk, binding.value, binding)
            binding = last_binding(walk.script, name, binding)  # type: ignore[arg-type]
            continue
        if binding.value is not None:
            yield from _sources(walk, binding.value, binding)
        return
    if name is not None and "." not in name:
        yield from _passed_for(walk, name, at)


def _passed_for(walk: _Walk, parameter: str, at: cst.CSTNode) -> Iterator[cst.CSTNode]:
    facts = facts_of(walk.script)
    function = facts.placement.enclosing_function(at)
    if function is None:
        return
    for call, implicit in facts.calls.calls_of(function):
        for name, argument in bound_arguments(function, call, implicit):
            if name == parameter:
                yield from _sources(walk, argument.value, call)


def last_binding(script: ScriptModel, name: str, at: cst.CSTNode) -> _Binding | None:
    """The last ``name = ...`` (``name /= ...``, ``name: T = ...``, or a tuple target naming
    it) above ``at`` in the function (or module) that holds ``at``."""
    facts = facts_of(script)
    function = facts.placement.enclosing_function(at)
    here = script.order(at)
    around: set[int] | None = None
    for node in reversed(script.index.own_bindings(function).get(name, ())):
        if script.order(node) >= here:
            continue
        if around is None:
            around = {id(ancestor) for ancestor in script.ancestors(at)}
        if id(node) not in around:  # ``x = f(x)`` reads the binding before it, not itself
            return node
    return None


def made_for(script: ScriptModel, name: str, at: cst.CSTNode) -> cst.CSTNode | None:
    """The statement that made the object ``name`` holds at ``at``, when that is known: its
    last binding above ``at`` makes a new model (``student = StudentCnn().to(device)``) and
    every block that holds it also holds ``at`` (a binding in a branch may not run). Two
    calls that hand ``name`` made by different statements hand different objects."""
    binding = last_binding(script, name, at)
    if not isinstance(binding, (cst.Assign, cst.AnnAssign)):
        return None
    if not any(made.assign is binding for made in script.of_kind(Kind.MODEL) if made.name == name):
        return None
    if not isinstance(binding.value, cst.Call) or not runs_before(script, binding, at):
        return None
    return binding


def runs_before(script: ScriptModel, binding: cst.CSTNode, at: cst.CSTNode) -> bool:
    """``binding`` (above ``at`` in the same function) runs whenever ``at`` does: every block
    that holds it (a branch, a loop, a ``with``) also holds ``at``. A ``try`` body is such a
    block: its handlers and ``finally`` run when the body stopped early, maybe before the
    binding (``except KeyboardInterrupt:`` around a loop that makes the trainer)."""
    around = {id(ancestor) for ancestor in script.ancestors(at)}
    scope = facts_of(script).placement.enclosing_function(at)
    for ancestor in script.ancestors(binding):
        if ancestor is scope:
            break
        if isinstance(ancestor, cst.BaseCompoundStatement) and id(ancestor) not in around:
            return False
        if isinstance(ancestor, cst.Try) and not _after_the_body(script, ancestor, binding, at):
            return False
    return True


def _after_the_body(
    script: ScriptModel, statement: cst.Try, binding: cst.CSTNode, at: cst.CSTNode
) -> bool:
    """A binding in the ``try`` body runs before ``at`` only when ``at`` is in that body or
    its ``else`` (where the body ran to ``at`` or to its end), never in a handler or the
    ``finally``, which run when the body stopped early."""
    if not any(ancestor is statement.body for ancestor in script.ancestors(binding)):
        return True
    blocks = [statement.body] + ([statement.orelse] if statement.orelse is not None else [])
    return any(ancestor is block for ancestor in script.ancestors(at) for block in blocks)
