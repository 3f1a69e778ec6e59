"""Where an untrained model (a distillation teacher, a frozen extractor, an EMA copy) that
prepare leaves out meets the batches of a prepared loader in a loop, wherever that loop stands:
in another method of the class that holds the model (``self.teacher(x)`` in ``fit()`` over
``self.loader``, the teacher bound in ``__init__``), or over a loader read out of a dict
(``for x, _ in loaders["train"]: warmup(x)``). Converted, those batches arrive on the
accelerator's device; the model, moved nowhere by a CPU-only original, stays on the CPU and its
forward fails on mixed devices on a GPU (on the CPU nothing shows it).

Only a call whose argument holds what the prepared loader handed over (or a prepared model's
output: `batch_values.holds_the_batch`) counts: a model fed tensors the script makes on the
host (a replay buffer's sample, ``torch.randn``) is kept on the host as the script keeps it.
"""

from __future__ import annotations

import libcst as cst

from accelify.analysis.batch_values import holds_an_argument, holds_the_batch
from accelify.analysis.dataflow import variables_in
from accelify.analysis.objects import bound_arguments
from accelify.analysis.script_model import Binding
from accelify.analysis.syntax import dotted, walk
from accelify.convert.steps.context import Context


def fed_prepared_batches_in_a_loop(ctx: Context, binding: Binding) -> cst.Call | None:
    """The first call of ``binding``'s model, inside a loop over prepared loaders, that hands it
    the loop's batch or a prepared model's output; None where none does. A ``self.`` attribute
    is followed into every method of the class that binds it, a local only in its own scope."""
    name = binding.name
    owner = _owner(ctx, binding)
    if owner is None:
        return None
    prepared = set(ctx.plan.prepared)
    for loop in ctx.model.loops:
        if not ctx.facts.flow.reads_loader(loop) or ctx.unprepared_loaders(loop):
            continue
        if _owner_of(ctx, name, loop.node) != owner:
            continue
        for node in walk(loop.node.body):
            if not isinstance(node, cst.Call) or dotted(node.func) != name:
                continue
            if any(
                holds_the_batch(ctx.model, loop, read, node, prepared)
                for argument in node.args
                for read in variables_in(ctx.model, argument.value)
            ):
                return node
    return None


def fed_prepared_batches_through_a_step(ctx: Context, binding: Binding) -> cst.Call | None:
    """The first call of ``binding``'s model in a step function that a loop over prepared
    loaders hands its batch (``self.teacher(x)`` in ``Distiller.step(self, batch)`` after ``x, y
    = batch``, called as ``d.step(batch)`` in ``for batch in train_loader:``), with what that
    call hands it holding the batch; None where none does."""
    name = binding.name
    owner = _owner(ctx, binding)
    if owner is None:
        return None
    prepared = set(ctx.plan.prepared)
    graph = ctx.facts.calls
    for loop, step in ctx.facts.step_driven_loops:
        if not isinstance(loop.node, cst.For) or not ctx.facts.flow.reads_loader(loop):
            continue
        if ctx.unprepared_loaders(loop):
            continue
        implicit = 1 if graph.owner(step) is not None else 0
        for call in walk(loop.node.body):
            if not isinstance(call, cst.Call) or step not in graph.targets(call):
                continue
            fed = {
                parameter
                for parameter, argument in bound_arguments(step, call, implicit)
                if any(
                    holds_the_batch(ctx.model, loop, read, call, prepared)
                    for read in variables_in(ctx.model, argument.value)
                )
            }
            found = _model_call_on(ctx, step, name, owner, fed) if fed else None
            if found is not None:
                return found
    return None


def _model_call_on(
    ctx: Context, step: cst.FunctionDef, name: str, owner: object, fed: set[str]
) -> cst.Call | None:
    """The first call of ``name`` in ``step`` handed what its ``fed`` parameters received."""
    prepared = set(ctx.plan.prepared)
    for node in walk(step.body):
        if not isinstance(node, cst.Call) or dotted(node.func) != name:
            continue
        if _owner_of(ctx, name, node) != owner:
            continue
        if any(
            holds_an_argument(ctx.model, step, fed, read, node, prepared)
            for argument in node.args
            for read in variables_in(ctx.model, argument.value)
        ):
            return node
    return None


def _owner(ctx: Context, binding: Binding) -> object | None:
    return _owner_of(ctx, binding.name, binding.statement)


def _owner_of(ctx: Context, name: str, node: cst.CSTNode) -> object | None:
    """What a read of ``name`` at ``node`` refers through: the class that encloses it for a
    ``self.`` attribute, the scope that encloses it for a plain name (None for other dotted
    names, which this step does not follow)."""
    if name.startswith("self.") and name.count(".") == 1:
        found = ctx.model.index.enclosing_class_name(node)
        return ("class", found) if found is not None else None
    if "." in name:
        return None
    return ("scope", id(ctx.model.scope_of(node)))
