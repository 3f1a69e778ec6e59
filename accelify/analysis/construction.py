"""What a trainer's construction does: ``__init__`` and the methods it calls through ``self``.

A trainer that prepares ``self.model`` while it is constructed hands every later method the
wrapper; the methods construction itself runs may run before the prepare (a checkpoint loaded
into the plain model on ``--resume``), so they are left out.
"""

from __future__ import annotations

import libcst as cst

from accelify.analysis.call_graph import CallGraph
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted, walk


def prepared_in_construction(
    script: ScriptModel, owner: cst.BaseExpression, at: cst.CSTNode
) -> bool:
    """``self.unet`` read in a method of a trainer whose construction prepared it: ``__init__``
    (or a method it calls) binds ``self.unet`` from ``prepare``, the model is called
    (``self.unet(x)``), and only construction binds ``self.unet`` at all, so every other method
    sees the wrapper (a LoRA trainer's ``save_model``: ``self.unet.save_pretrained(path)``).
    Methods construction runs are left out: they may run before the prepare."""
    spelling = dotted(owner)
    if spelling is None or not spelling.startswith("self.") or spelling.count(".") != 1:
        return False
    graph = script.call_graph
    method = script.index.enclosing_function(at)
    owner_class = graph.owner(method) if method is not None else None
    if owner_class is None:
        return False
    init = graph.methods(owner_class).get("__init__")
    if init is None:
        return False
    construction = run_by_construction(graph, init)
    if method in construction:
        return False
    for assign in script.index.assignments_to(spelling):
        binder = script.index.enclosing_function(assign)
        if binder is not None and graph.owner(binder) is owner_class and binder not in construction:
            return False  # bound again after construction: unwrap_model, a new model
    prepared = any(
        spelling in prepare.outputs
        and script.index.enclosing_function(prepare.call) in construction
        for prepare in script.prepare_calls
    )
    called = any(
        dotted(call.func) == spelling and script.index.enclosing_class(call) is owner_class
        for call in script.calls
    )
    return prepared and called


def run_by_construction(
    graph: CallGraph, method: cst.FunctionDef, depth: int = 0
) -> set[cst.FunctionDef]:
    """``method`` and the methods it calls through ``self`` (three levels down)."""
    found = {method}
    if depth >= 3:
        return found
    for node in walk(method.body):
        if isinstance(node, cst.Call) and (dotted(node.func) or "").startswith("self."):
            for target in graph.targets(node):
                if target not in found:
                    found |= run_by_construction(graph, target, depth + 1)
    return found
