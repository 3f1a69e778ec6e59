"""An evaluation loop whose forward pass runs in a helper it calls once per batch:
``out = eval_step(model, batch)`` (or ``self.validation_step(batch)``), where the helper runs the
model and returns per-batch numbers (``.item()`` sums, counts) that the loop adds up.

The gather then goes inside the helper, right after its forward, exactly as it would in a loop
(`accelify.analysis.evaluation`, run over the helper's body as if it were one batch of a loop):
the helper's ``return`` statements are its metrics, and each must read only gathered values. It
is only done when every call of the helper is such a per-batch call in an evaluation loop over a
loader (elsewhere a gather would change what a caller sees), and when the loop adds up nothing
but what the helper returns (a count of its own batch would stay this rank's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.dataflow import bound_by, is_binding, statements
from accelify.analysis.evaluation import (
    Evaluation,
    _assigned_in,
    _batch_names,
    _check_sinks,
    _gathers,
    _is_sink,
    _per_rank_reshape,
    _place,
    first_forward,
    padded_per_batch,
)
from accelify.analysis.objects import bound_arguments
from accelify.analysis.script_model import Loop
from accelify.analysis.syntax import dotted, walk

if TYPE_CHECKING:
    from accelify.analysis.facts import Facts


@dataclass
class HelperEvaluation:
    #: the evaluation loop that calls the helper per batch
    loop: Loop
    call: cst.Call
    helper: cst.FunctionDef
    #: the helper's body read as one batch of an evaluation (its ``loop`` is the helper)
    evaluation: Evaluation


def helper_evaluation_of(loop: Loop, facts: Facts) -> HelperEvaluation | None:
    """The helper evaluation of ``loop`` when it is sure; None otherwise (the loop's own
    `Evaluation` then says why it is left as it is)."""
    model = facts.model
    if loop.trains or not facts.flow.reads_loader(loop) or first_forward(loop, facts) is not None:
        return None
    local = _assigned_in(loop.node)
    body = list(statements(loop.node.body))
    sinks = [small for small in body if _is_sink(small, local)]
    if not sinks or _gathers(loop, facts) or padded_per_batch(loop, facts):
        return None
    found = _one_helper_call(loop, facts)
    if found is None:
        return None
    call, helper, implicit = found
    if not _sums_only_what_it_returns(loop, body, sinks, call, facts):
        return None
    batch = set(loop.batch_names)
    received = {
        parameter
        for parameter, argument in bound_arguments(helper, call, implicit)
        if dotted(argument.value) in batch
    }
    if not received or not all(
        _called_per_batch(other, helper, facts) for other in _calls(helper, facts)
    ):
        return None
    view = Loop(helper, helper, None, received, trains=False, evaluates=True)  # type: ignore[arg-type]
    evaluation = Evaluation(view)
    evaluation.sinks = [s for s in statements(helper.body) if isinstance(s, cst.Return)]
    forward = first_forward(view, facts)
    if forward is None or not evaluation.sinks:
        return None
    evaluation.forward = forward
    evaluation.statement = next(
        a for a in model.ancestors(forward) if isinstance(a, cst.SimpleStatementLine)
    )
    evaluation.batch = _batch_names(view, facts, evaluation.statement)
    if _place(evaluation, facts) is not None or _per_rank_reshape(evaluation, facts) is not None:
        return None
    if _check_sinks(evaluation, list(statements(helper.body)), facts) is not None:
        return None
    return HelperEvaluation(loop, call, helper, evaluation)


def _one_helper_call(loop: Loop, facts: Facts) -> tuple[cst.Call, cst.FunctionDef, int] | None:
    """The one call in the loop of a function of the file that runs a model (no backward, no
    loop of its own)."""
    placement, graph = facts.placement, facts.calls
    found = []
    for node in walk(loop.node.body):
        if not isinstance(node, cst.Call):
            continue
        targets = [t for t in graph.targets(node) if _runs_a_model(t, facts)]
        if len(targets) == 1:
            found.append((node, targets[0]))
    if len(found) != 1:
        return None
    call, helper = found[0]
    if any(placement.inside(b, helper) for b in facts.model.backward_calls) or any(
        placement.inside(other.node, helper) for other in facts.model.loops
    ):
        return None
    implicit = 1 if graph.owner(helper) is not None and not _is_static(helper) else 0
    return call, helper, implicit


def _runs_a_model(function: cst.FunctionDef, facts: Facts) -> bool:
    return any(isinstance(n, cst.Call) and facts.flow.is_forward(n) for n in walk(function.body))


def _is_static(function: cst.FunctionDef) -> bool:
    return any(dotted(d.decorator) == "staticmethod" for d in function.decorators)


def _calls(helper: cst.FunctionDef, facts: Facts) -> list[cst.Call]:
    graph = facts.calls
    return [*graph.callers(helper), *graph.uncertain_callers(helper)]


def _called_per_batch(call: cst.Call, helper: cst.FunctionDef, facts: Facts) -> bool:
    """``call`` is the helper call of an evaluation loop over a loader."""
    for loop in facts.model.loops:
        if facts.placement.inside(call, loop.node) and not loop.trains:
            found = _one_helper_call(loop, facts)
            if found is not None and found[0] is call and facts.flow.reads_loader(loop):
                return True
    return False


def _sums_only_what_it_returns(
    loop: Loop, body: list[cst.CSTNode], sinks: list[cst.CSTNode], call: cst.Call, facts: Facts
) -> bool:
    """Every metric of the loop reads what the helper returned, never the batch itself."""
    per_rank = set(loop.batch_names)
    inside_call = {id(n) for n in walk(call)}
    for small in body:
        reads = _reads_around(small, inside_call, loop, facts)
        holds_call = any(n is call for n in walk(small))
        if small in sinks:
            if (reads & per_rank) or holds_call:
                return False
            continue
        if holds_call:
            per_rank -= bound_by(small)
        elif reads & per_rank:
            per_rank |= bound_by(small)
    return True


def _reads_around(small: cst.CSTNode, skipped: set[int], loop: Loop, facts: Facts) -> set[str]:
    """Names ``small`` reads, with the tests and iterables of the blocks around it in the loop,
    leaving out what is handed to the helper (``for k, v in step(batch).items():`` reads what
    the helper returns, not ``batch``)."""
    model = facts.model
    nodes = list(walk(small))
    for ancestor in model.ancestors(small):
        if ancestor is loop.node:
            break
        if isinstance(ancestor, (cst.If, cst.While)):
            nodes += walk(ancestor.test)
        elif isinstance(ancestor, cst.For):
            nodes += walk(ancestor.iter)
    found = {
        n.value
        for n in nodes
        if isinstance(n, cst.Name) and id(n) not in skipped and not is_binding(model, n)
    }
    if isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name):
        found.discard(small.target.value)
    return found
