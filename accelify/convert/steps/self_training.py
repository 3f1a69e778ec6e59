"""A model that trains itself (its own method runs the backward and steps its own optimizer) is
not prepared: the DDP wrapper would hide that method, and calling around the wrapper skips DDP's
gradient hooks. What DDP would do is written out instead (`accelify.analysis.self_training`):
each instance moves to ``accelerator.device`` and takes rank 0's weights where it is made, and
the method averages the gradients over the ranks after its backward. The backward itself stays
``loss.backward()``: the Accelerator's loss scaling and accumulation division are undone only by
a prepared optimizer, and this one is the model's own."""

from __future__ import annotations

from accelify.analysis.dataflow import fresh, names_in_scope
from accelify.analysis.self_training import moves_itself
from accelify.convert.steps.context import Context
from accelify.edits import rewrites


def run(ctx: Context) -> None:
    for entry in ctx.facts.self_training:
        if entry.blocker is not None:
            continue  # the planner left the whole script as it is
        for binding in entry.instances:
            made = ctx.plan.add(
                *rewrites.start_alike(
                    binding.statement, binding.name, ctx.acc, move=not moves_itself(binding)
                ),
                line=binding.line,
                text=(
                    f"{binding.name} trains itself ({entry.name}'s own optimizer): not prepared; "
                    f"moved to {ctx.a('device')} and given rank 0's weights (broadcast)"
                ),
            )
            if made:
                ctx.need(binding.statement)
                if "broadcast" not in ctx.uses:
                    ctx.uses.append("broadcast")
        for call in entry.backward_calls:
            after = ctx.statement_of(call)
            method = ctx.facts.placement.enclosing_function(call)
            param = fresh("param", names_in_scope(ctx.model, method or ctx.model.module))
            made = ctx.plan.add(
                rewrites.average_gradients(after, entry.receivers[call], ctx.acc, param),
                line=ctx.line(call),
                text=(
                    f"{entry.name} averages its gradients over the ranks after its own backward "
                    f'({ctx.a("reduce")}(grad, "mean")), as DDP would'
                ),
            )
            if made:
                ctx.need(after)
