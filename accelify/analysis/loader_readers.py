"""The loops that read a loader a function binds: its own loops over the name, and the loops of
the helpers it hands the name to (``train(net, trainloader, criterion, optimizer)`` runs ``for x,
y in dataloader:`` over that very object), followed through the helpers those call in turn.

A loader made away from the scope that prepares the model (``trainloader, valloader =
get_dataloaders(bs)`` in ``run()``, the model built and prepared by a ``setup_network()``
factory) is read by the helpers it is handed to; a question about what reads it ("only training
loops?") has to look there, or it sees no reader at all.
"""

from __future__ import annotations

import libcst as cst

from accelify.analysis.call_graph import CallGraph
from accelify.analysis.objects import bound_arguments
from accelify.analysis.placement import Placement
from accelify.analysis.script_model import Loop, ScriptModel
from accelify.analysis.syntax import dotted, walk

#: How many helper calls deep a loader is followed (``run`` -> ``fit`` -> ``train_epoch``).
_MAX_DEPTH = 3


def loops_reading(
    model: ScriptModel,
    placement: Placement,
    graph: CallGraph,
    name: str,
    function: cst.FunctionDef,
    depth: int = 0,
) -> list[Loop]:
    """Every loop that iterates the object ``function`` holds under ``name``: a loop of
    ``function`` over ``name``, and a loop over a parameter of a function of the file that a
    call inside ``function`` fills with ``name`` (by position or keyword), followed through the
    calls of that function."""
    found = [
        loop
        for loop in model.loops
        if loop.iterable == name and placement.enclosing_function(loop.node) is function
    ]
    if depth >= _MAX_DEPTH:
        return found
    for call in walk(function.body):
        if not isinstance(call, cst.Call) or placement.enclosing_function(call) is not function:
            continue
        for helper, implicit in graph.callees(call):
            if helper is function:
                continue
            for parameter, argument in bound_arguments(helper, call, implicit):
                if dotted(argument.value) == name:
                    found += loops_reading(model, placement, graph, parameter, helper, depth + 1)
    return found
