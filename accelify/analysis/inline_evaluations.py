"""Evaluations over a DataLoader that are not ``for`` loops over it, where no gather fits: a
comprehension or ``map()`` whose forward the analysis does not know as a model's (an EMA copy
made by ``copy.deepcopy(self.model)``: ``sum((self.ema(x) - y).abs().sum().item() for x, y in
self.loader)`` under ``torch.no_grad()``), and a loop that draws the batches itself with
``next()`` from ``iter(loader)`` (``while True: xb, yb = next(it)`` ... ``except
StopIteration: break``). Prepared, each rank's totals would cover its own shard, and nothing
in them says so: the conversion leaves such a loader whole (every rank evaluates all of it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.script_model import Kind
from accelify.analysis.syntax import dotted, target_names, walk

if TYPE_CHECKING:
    from accelify.analysis.facts import Facts

_COMPREHENSIONS = (cst.GeneratorExp, cst.ListComp, cst.SetComp, cst.DictComp)


def computes_without_grad(facts: Facts, node: cst.CSTNode) -> bool:
    """``node`` (a comprehension or a lambda) calls something on the batch it reads with
    gradients off (inside ``with torch.no_grad():`` or a function decorated so), or runs a copy
    of a model (``ema = copy.deepcopy(model)``) on it: an evaluation whose forward is a model
    the analysis does not know. A call into a function of the file that runs a backward is a
    training step, not one."""
    model = facts.model
    grad_off = any(model.disables_grad(a) for a in model.ancestors(node))
    if isinstance(node, cst.Lambda):
        bound = {p.name.value for p in node.params.params}
        element: cst.CSTNode = node.body
    elif isinstance(node, _COMPREHENSIONS):
        bound = set()
        clause: cst.CompFor | None = node.for_in
        while clause is not None:
            bound |= target_names(clause.target)
            clause = clause.inner_for_in
        element = node.value if isinstance(node, cst.DictComp) else node.elt
    else:
        return False
    calls = [n for n in walk(element) if isinstance(n, cst.Call)]
    if any(_trains(facts, call) for call in calls):
        return False
    return any(
        isinstance(n, cst.Name) and n.value in bound
        for call in calls
        if grad_off or runs_a_model_copy(facts, call)
        for n in walk(call)
        if n is not call.func
    )


def runs_a_model_copy(facts: Facts, call: cst.Call) -> bool:
    """``ema(x)`` / ``self.ema(x)`` where every assignment of that name in the file is
    ``copy.deepcopy(<a model>)``: the copy runs as the model does."""
    name = dotted(call.func)
    if name is None:
        return False
    values = [
        assignment.value
        for assignment in facts.model.assignments
        if isinstance(assignment, cst.Assign)
        and any(dotted(t.target) == name for t in assignment.targets)
    ]
    return bool(values) and all(
        isinstance(v, cst.Call)
        and "copy.deepcopy" in facts.model.call_names(v)
        and len(v.args) == 1
        and facts.flow.is_model_name(dotted(v.args[0].value), v)
        for v in values
    )


def drawn_evaluations(facts: Facts) -> Iterator[tuple[str, cst.Call, cst.CSTNode]]:
    """``it = iter(val_loader)`` whose every ``next(it)`` in a loop of the same function sits in
    one that runs no backward (none in it, none in a function of the file it calls) and runs a
    model or turns gradients off: the loader's name at ``iter()``, the ``iter()`` call, and the
    first such loop. The loop evaluates the loader batch by batch, as a ``for`` over it would."""
    model, placement = facts.model, facts.placement
    for call in model.calls:
        if dotted(call.func) != "iter" or len(call.args) != 1:
            continue
        loader = dotted(call.args[0].value)
        if loader is None or facts.flow.kind_of(loader, call) is not Kind.DATALOADER:
            continue
        iterator = _bound_to(facts, call)
        function = placement.enclosing_function(call)
        scope = function if function is not None else model.module
        if iterator is None:
            continue
        draws = [
            c
            for c in model.calls
            if dotted(c.func) == "next"
            and c.args
            and dotted(c.args[0].value) == iterator
            and placement.enclosing_function(c) is function
            and placement.inside(c, scope)
        ]
        # a draw outside any loop primes the first batch (``batch = next(it, None)`` before
        # ``while batch is not None:``)
        loops = [loop for draw in draws if (loop := _loop_around(facts, draw, function, call))]
        if loops and all(_evaluates(facts, loop) for loop in loops):
            yield loader, call, loops[0]


def _bound_to(facts: Facts, call: cst.Call) -> str | None:
    """``it = iter(loader)``: ``it``."""
    parent = facts.model.parent(call)
    if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
        return dotted(parent.targets[0].target)
    return None


def _loop_around(
    facts: Facts, node: cst.CSTNode, function: cst.FunctionDef | None, made: cst.Call
) -> cst.For | cst.While | None:
    """The innermost loop around the draw ``node`` that is inside the code where the iterator
    was ``made``: a loop around ``iter()`` as well (the epochs) repeats the whole evaluation."""
    for ancestor in facts.model.ancestors(node):
        if ancestor is function or isinstance(ancestor, (cst.Lambda, cst.ClassDef)):
            return None
        if isinstance(ancestor, (cst.For, cst.While)):
            return None if facts.placement.inside(made, ancestor) else ancestor
    return None


def _evaluates(facts: Facts, loop: cst.For | cst.While) -> bool:
    model = facts.model
    if any(facts.placement.inside(b, loop) for b in model.backward_calls):
        return False
    calls = [n for n in walk(loop.body) if isinstance(n, cst.Call)]
    if any(_trains(facts, call) for call in calls):
        return False
    grad_off = any(model.disables_grad(a) for a in model.ancestors(loop)) or any(
        model.disables_grad(n) for n in walk(loop.body)
    )
    return grad_off or any(
        facts.flow.is_forward(call) or runs_a_model_copy(facts, call) for call in calls
    )


def _trains(facts: Facts, call: cst.Call) -> bool:
    """A call of a function of the file that runs a backward."""
    return any(
        facts.placement.inside(b, function)
        for function in facts.calls.targets(call)
        for b in facts.model.backward_calls
    )
