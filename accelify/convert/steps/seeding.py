"""12. Random state drawn before training is the same on every rank: a script that sets no seed
and draws from the global generators outside its training loops (a synthetic dataset, a random
target function, ``random_split``) is seeded with ``set_seed(0)`` right after its imports.
A script that seeds itself is left as it is."""

from __future__ import annotations

from accelify.analysis.randomness import randomness_of
from accelify.convert.steps.context import Context
from accelify.edits.plan import statement


def run(ctx: Context) -> None:
    randomness = randomness_of(ctx.model)
    if randomness.seeded or not randomness.setup_draws:
        return
    module = ctx.model.module
    body = ctx.facts.placement.body_of(module)
    first = ctx.facts.placement.first_free_index(module)
    if first >= len(body):
        return
    ctx.plan.insert_before(body[first], statement("set_seed(0)"))
    ctx.uses.append("set_seed")
    draw = randomness.setup_draws[0]
    ctx.plan.change(
        ctx.line(draw),
        "random values drawn before training with no seed set: set_seed(0) after the imports "
        "makes them the same on every rank",
    )
