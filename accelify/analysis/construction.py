"""What a trainer's construction does: ``__init__`` and the methods it calls through ``self``.

A trainer that prepares ``self.model`` while it is constructed hands every later method the
wrapper; the methods construction itself runs may run before the prepare (a checkpoint loaded
into the plain model on ``--resume``), so they are left out.
"""

from __future__ import annotations

import libcst as cst

from accelify.analysis.call_graph import CallGraph
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted, strip_self_methods, walk


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
    if init is None or method in run_by_construction(graph, init):
        return False
    return _construction_prepares(script, owner_class, spelling)


def prepared_on_instance(script: ScriptModel, owner: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """``trainer.model`` read outside the class, after ``trainer = Trainer(...)`` in the same
    scope, where the class's construction prepared ``self.model`` (``trainer.train()`` then
    ``trainer.model.save_pretrained(out)`` in ``main``): the attribute holds the wrapper, as
    it does in the class's own methods. Not when the scope binds ``trainer.model`` again in
    between (``trainer.model = accelerator.unwrap_model(trainer.model)``)."""
    spelling = dotted(owner)
    if spelling is None or spelling.count(".") != 1 or spelling.startswith("self."):
        return False
    instance, member = spelling.split(".")
    here, scope = script.order(at), script.scope_of(at)
    made = [
        assign
        for assign in script.index.assignments_to(instance)
        if script.scope_of(assign) is scope and script.order(assign) < here
    ]
    if not made:
        return False
    last = max(made, key=script.order)
    class_name = script.call_graph.instance_class(instance, last)
    owner_class = script.call_graph.classes.get(class_name or "")
    if owner_class is None or not isinstance(last, cst.Assign):
        return False
    if script.call_graph.instance_class(instance, at) != class_name:
        return False
    for assign in script.index.assignments_to(spelling):
        if script.scope_of(assign) is not scope or keeps_the_object(assign, spelling):
            continue
        if script.order(last) < script.order(assign) < here:
            return False
    return _construction_prepares(script, owner_class, f"self.{member}")


def _construction_prepares(script: ScriptModel, owner_class: cst.ClassDef, spelling: str) -> bool:
    """The construction of ``owner_class`` prepares ``spelling`` (``self.model``), a model
    (called in the class, or shown to be one where it is prepared), and no method outside
    construction binds it to another object."""
    graph = script.call_graph
    init = graph.methods(owner_class).get("__init__")
    if init is None:
        return False
    construction = run_by_construction(graph, init)
    for assign in script.index.assignments_to(spelling):
        if keeps_the_object(assign, spelling):
            continue  # ``self.model = self.model.to(device)``: still the prepared wrapper
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
    return prepared and (called or _prepared_as_a_model(script, spelling, construction))


def keeps_the_object(assign: cst.CSTNode, spelling: str) -> bool:
    """``self.model = self.model.to(device)`` (``.cuda()``, ``.train()``, ``.eval()``): the
    value is the object the name already held, since nn.Module's moves hand ``self`` back; on a
    prepared model that is still the DistributedDataParallel wrapper."""
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        return False
    value = assign.value
    kept = strip_self_methods(value)
    return (
        kept is not value
        and dotted(kept) == spelling
        and dotted(assign.targets[0].target) == spelling
    )


def _prepared_as_a_model(
    script: ScriptModel, spelling: str, construction: set[cst.FunctionDef]
) -> bool:
    """Construction shows ``spelling`` is a model without calling it: what it prepared there is
    a model by the analysis (made by a model class, or fed to an optimizer as
    ``AdamW(model.parameters())`` beside it), or was loaded with ``from_pretrained`` (a
    transformers model made by ``getattr(transformers, cls).from_pretrained(name)``, used only
    through ``generate``)."""
    for prepare in script.prepare_calls:
        function = script.index.enclosing_function(prepare.call)
        if function not in construction or spelling not in prepare.outputs:
            continue
        position = prepare.outputs.index(spelling)
        source = prepare.inputs[position] if position < len(prepare.inputs) else ""
        if not source:
            continue
        if any(
            binding.name == source and binding.scope is function
            for binding in script.of_kind(Kind.MODEL)
        ):
            return True
        if _loaded_pretrained(script, source, function):
            return True
    return False


def _loaded_pretrained(script: ScriptModel, source: str, function: cst.FunctionDef) -> bool:
    """``source`` is bound in ``function`` from a ``...from_pretrained(...)`` call."""
    for assign in script.index.assignments_to(source):
        if script.index.enclosing_function(assign) is not function:
            continue
        if not isinstance(assign, cst.Assign):
            continue
        value = strip_self_methods(assign.value)
        func = value.func if isinstance(value, cst.Call) else None
        if isinstance(func, cst.Attribute) and func.attr.value == "from_pretrained":
            return True
    return False


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
