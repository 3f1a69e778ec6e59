"""Loops that train through a call: ``for x, y in loader: trainer(x, y)`` or ``[step(x, y) for x,
y in loader]``, where the backward runs in a function or method of this file (a trainer's
``__call__``, ``train_step``) that the loop's body calls. The loop has no backward of its own, so
it is not a training loop by its body; its loader is what the ranks train on all the same."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.loops import loop_source
from accelify.analysis.script_model import Loop, ScriptModel
from accelify.analysis.syntax import target_names, walk

_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
#: How many calls deep a step may hide its backward (``trainer(x, y)`` -> ``self._step``).
_DEPTH = 3


def step_driven_loops(model: ScriptModel) -> list[tuple[Loop, cst.FunctionDef]]:
    """Each loop (a ``for`` or a comprehension) whose own body runs no backward but calls a
    function of this file that does, with the first such function it calls."""
    trainers = _training_functions(model)
    if not trainers:
        return []
    graph = model.call_graph
    found: list[tuple[Loop, cst.FunctionDef]] = []
    candidates: list[tuple[Loop, cst.CSTNode]] = [
        # a loop with gradients off evaluates through the step (``make_step(b, update=False)``)
        (loop, loop.node.body)
        for loop in model.loops
        if not loop.trains and not loop.evaluates
    ]
    for node in model.orders:
        if isinstance(node, _COMPREHENSIONS) and node.for_in.inner_for_in is None:
            loop = Loop(
                node=node,  # type: ignore[arg-type]
                scope=model.scope_of(node),
                iterable=loop_source(node.for_in.iter),
                batch_names=target_names(node.for_in.target),
                trains=True,
                evaluates=False,
            )
            body = node.elt if not isinstance(node, cst.DictComp) else node.value
            candidates.append((loop, body))
    for loop, body in candidates:
        step = next(
            (
                target
                for call in walk(body)
                if isinstance(call, cst.Call)
                for target in graph.targets(call)
                if target in trainers
            ),
            None,
        )
        if step is not None:
            found.append((loop, step))
    return found


def _training_functions(model: ScriptModel) -> set[cst.FunctionDef]:
    """The functions of this file that run one backward per call, themselves or through calls
    (a few deep). One whose backward runs in a loop of its own is an epoch runner: a loop that
    calls it is an epoch loop, and the inner loop is the training loop."""
    index = model.index
    trainers = {
        function
        for call in model.backward_calls
        if (function := index.enclosing_function(call)) is not None
        and not _inside_a_loop(model, call, function)
    }
    graph = model.call_graph
    for _ in range(_DEPTH):
        grown = {
            caller_function
            for function in trainers
            for call in graph.callers(function)
            if (caller_function := index.enclosing_function(call)) is not None
            and not _inside_a_loop(model, call, caller_function)
        }
        if grown <= trainers:
            break
        trainers |= grown
    return trainers


def _inside_a_loop(model: ScriptModel, call: cst.Call, function: cst.FunctionDef) -> bool:
    """``call`` runs in a loop (or a comprehension) of ``function`` itself."""
    for ancestor in model.ancestors(call):
        if ancestor is function:
            return False
        if isinstance(ancestor, (cst.For, cst.While, *_COMPREHENSIONS)):
            return True
    return False
