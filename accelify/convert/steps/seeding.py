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
    if not ctx.plan.reaches(anchor):
        # the draws run before the class that owns ``self.accelerator`` is built: a
        # synchronization inside it would come after them, and claim what it cannot do
        draw = randomness.setup_draws[0]
        placement = ctx.facts.placement
        written_in = placement.enclosing_function(draw)
        if written_in is not None and placement.running_function(draw) is not written_in:
            run_from = f", in a default value that runs when line {ctx.line(written_in)} defines it"
        elif placement.inside(draw, anchor):
            run_from = ""
        else:  # the module's statement that runs this draw (the anchor may be another draw's)
            runner = _run_from_module(ctx, draw, None) or anchor
            run_from = f", run from line {ctx.line(runner)}"
        ctx.plan.review(
            ctx.line(draw),
            f"random values drawn before training with no seed set{run_from}, where "
            f"{ctx.acc} is not reachable: every rank draws its own values (its own synthetic "
            "data, its own targets); left as is: seed the generators the script draws from "
            "at its top, the same seed on every rank (torch.manual_seed(0), "
            "numpy.random.seed(0), random.seed(0))",
        )
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
_MAX_DEPTH = 6


def _run_from_module(
    ctx: Context, draw: cst.Call, scope: cst.FunctionDef | None
) -> cst.CSTNode | None:
    """The first statement of the module's own code that runs ``draw`` through the file's
    calls (``train_loader = get_loader(64, 2000)``, whose helper builds a data set that draws
    in its ``__init__``): a synchronization at the top of ``scope``, the function that owns
    training, would come after such a draw. A path through ``scope`` runs after that
    synchronization and needs nothing, but it does not excuse another path from the module's
    code (``VAL = make_data(16)`` beside ``make_data(32)`` in ``main()``): any such path is
    found. None when every path goes through ``scope``, or when one goes through calls the
    file cannot follow."""
    placement, module = ctx.facts.placement, ctx.model.module
    graph = ctx.model.call_graph
    frontier: list[cst.CSTNode] = [draw]
    seen: set[int] = set()
    found: list[cst.CSTNode] = []
    for _ in range(_MAX_DEPTH):
        later: list[cst.CSTNode] = []
        for node in frontier:
            if isinstance(scope, cst.FunctionDef) and placement.runs_inside(node, scope):
                continue  # after the synchronization at the top of ``scope``
            function = placement.running_function(node)
            if function is None:
                top = placement.top_statement(node, module)
                if top is not None:
                    found.append(top)
                continue
            if id(function) in seen:
                continue
            seen.add(id(function))
            sites = [call for call, _ in ctx.facts.flow.calls_of(function)]
            if not sites or graph.uncertain_callers(function) or graph.references(function):
                return None
            later += sites
        frontier = later
        if not frontier:
            break
    if frontier:
        return None
    return min(found, key=ctx.model.order) if found else None


def _seed_anchor(ctx: Context, draws: list[cst.Call]) -> cst.CSTNode | None:
    placement, module = ctx.facts.placement, ctx.model.module
    body = placement.body_of(module)
    # a draw in a module-level class body or in a default value runs at definition
    at_module = [d for d in draws if ctx.facts.placement.running_function(d) is None]
    if at_module:
        return placement.top_statement(at_module[0], module)
    scope = ctx.scope
    if not isinstance(scope, cst.Module):
        reached = [s for d in draws if (s := _run_from_module(ctx, d, scope)) is not None]
        if reached:
            return min(reached, key=ctx.model.order)
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
