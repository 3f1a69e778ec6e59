"""12. Random state drawn before training is the same on every rank: a script that sets no seed
and draws from the global generators outside its training loops (a synthetic dataset, a random
target function, ``random_split``) gets ``synchronize_rng_states()`` before the first such draw
at module level, else at the start of the function that owns training: every rank takes rank
0's random state, and on one process nothing changes, so the conversion prints what the
original printed. (For Hugging Face Accelerate, which synchronizes torch's generators only, a
script that also draws from NumPy or ``random`` gets ``set_seed(0)``.) A script that seeds
itself is left as it is."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.randomness import randomness_of
from accelify.convert.steps.context import Context
from accelify.convert.steps.data_notes import draws_alike_on_every_rank
from accelify.edits.kinds import InsertBefore
from accelify.edits.plan import statement


def run(ctx: Context) -> None:
    randomness = randomness_of(ctx.model)
    if randomness.seeded or not randomness.setup_draws:
        return
    anchor = _seed_anchor(ctx, randomness.setup_draws)
    if anchor is None:
        return
    if ctx.options.target == "accelify" or randomness.torch_only:
        # Only the generators the script draws from before training, named as Accelerate does.
        torch_only = 'synchronize_rng_states(["torch"])'
        code = torch_only if randomness.torch_only else "synchronize_rng_states()"
        used = "synchronize_rng_states"
        ctx.need(anchor)  # a broadcast from rank 0: the Accelerator comes first
        text = f"{code} before it: every rank draws what rank 0 draws"
    else:
        code = "set_seed(0)"  # Accelerate synchronizes torch's generators only
        used = "set_seed"
        text = "set_seed(0) before it makes them the same on every rank"
    draw = randomness.setup_draws[0]
    made = ctx.plan.add(
        InsertBefore(anchor, statement(code)),
        line=ctx.line(draw),
        text=f"random values drawn before training with no seed set: {text}",
    )
    if made:  # not where self.accelerator cannot reach
        ctx.uses.append(used)
        # what each training step draws after the synchronized state is alike on every rank
        draws_alike_on_every_rank(ctx, frozenset({"torch"}) if randomness.torch_only else _ALL)


_ALL = frozenset({"torch", "numpy", "random"})


def _seed_anchor(ctx: Context, draws: list[cst.Call]) -> cst.CSTNode | None:
    placement, module = ctx.facts.placement, ctx.model.module
    body = placement.body_of(module)
    at_module = [d for d in draws if isinstance(ctx.model.scope_of(d), cst.Module)]
    if at_module:
        return placement.top_statement(at_module[0], module)
    scope = ctx.scope
    if isinstance(scope, cst.FunctionDef):
        inner = placement.body_of(scope)
        first = placement.first_free_index(scope)
        return inner[first] if first < len(inner) else None
    executable = [
        line
        for line in body[placement.first_free_index(module) :]
        if not isinstance(line, (cst.FunctionDef, cst.ClassDef))
    ]
    return executable[0] if executable else None
