"""``while`` loops whose number of passes is each rank's own, around a collective.

An RL trainer's ``while not done:`` over an environment (``obs, reward, done, info =
env.step(action)``), with ``accelerator.backward(loss)`` in the body: each rank plays its own
episode, so the ranks make different numbers of passes, and under DDP each backward is a
gradient all-reduce. The rank whose episode ends first leaves the loop, and the others wait in
their next all-reduce for it (a hang), or pair it with that rank's next collective (gradients
of different steps averaged).

A test is each rank's own where it reads a name the loop itself binds, each pass, to a value
that is neither a count nor a setting (`RankDependence.uniform`) nor agreed over the ranks (a
reduce or a gather on the way): ``done`` from ``env.step``, ``len(buffer)`` of what this
rank appended. A counter (``step += 1``), a setting, a flag set from one (``done = step >=
args.max_steps``) or from a reduced value, and a batch drawn by hand (``batch =
next(batches, None)``, or bound in the test itself, ``while (batch := next(it, None)) is not
None:``: a prepared loader gives every rank as many) are not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.collectives import agrees_across_ranks, backends_in_view
from accelify.analysis.dataflow import statements
from accelify.analysis.own_stops import decided_by_object
from accelify.analysis.own_values import binds, names_read
from accelify.analysis.rank_dependence import integer_step
from accelify.analysis.sample_counts import first_dimension_of
from accelify.analysis.syntax import dotted, target_names, walk

if TYPE_CHECKING:
    from accelify.analysis.facts import Facts
    from accelify.analysis.script_model import ScriptModel

_LOOPS = (cst.For, cst.While)


@dataclass(frozen=True)
class RankLocalLoop:
    """A ``while`` whose test reads a value each rank computes alone, around a collective."""

    loop: cst.While
    name: str  # what the test reads: ``done``
    binding: cst.CSTNode  # where the loop binds it from this rank's data
    collective: cst.Call  # a collective (or a call reaching one) every pass makes
    #: for a flag an object sets (``stopper.early_stop``): what the loop hands it of this
    #: rank's own (``val_loss`` of ``stopper(val_loss)``, the call being ``binding``)
    handed: cst.BaseExpression | None = None


def rank_local_loops(facts: Facts) -> list[RankLocalLoop]:
    model = facts.model
    found: list[RankLocalLoop] = []
    for loop in model.index.of_type(cst.While):
        test = loop.test
        if facts.ranks.is_rank_test(test):
            continue  # a rank test is ACC202's
        uniform = facts.ranks.uniform(test)  # a count or a setting (``self.*`` taken as one)
        if uniform and not any(isinstance(node, cst.Attribute) for node in walk(test)):
            continue
        collective = _collective_in(facts, loop)
        if collective is None:
            continue
        own = None if uniform else _own_binding(facts, loop)
        if own is not None:
            found.append(RankLocalLoop(loop, own[0], own[1], collective))
            continue
        decided = decided_by_object(facts, test, loop)
        if decided is not None and decided.call is not None:
            # ``while not stopper.early_stop:`` (``self.stopper.early_stop``): the flag an
            # object of a class of the file sets from what the body hands it
            # (``stopper(val_loss)``), this rank's own (folded from its shard, never reduced)
            handed = decided.argument
            found.append(RankLocalLoop(loop, decided.read, decided.call, collective, handed))
    return found


def _collective_in(facts: Facts, loop: cst.While) -> cst.Call | None:
    """The first call in the loop's body that is a collective (a backward, a gather) or runs
    one, reached by every rank that runs the pass."""
    model = facts.model
    in_view = backends_in_view(model)  # a forward is one under FSDP only, where it is named
    uses = [
        use
        for use in facts.collective_uses
        if use.backends & in_view and not use.skipped_on and model.inside(use.call, loop.body)
    ]
    return min((use.call for use in uses), key=model.order, default=None)


def _own_binding(facts: Facts, loop: cst.While) -> tuple[str, cst.CSTNode] | None:
    """A name the test reads that the loop's body binds from this rank's own data."""
    model = facts.model
    for name in names_read(model, loop.test):
        for small in statements(loop.body):
            if not binds(model, small, name) or not _own_value(facts, small):
                continue
            if _one_per_pass(model, loop, small, name) or _prepared_rows(facts, loop, small):
                continue  # grows alike on every rank each pass: a count
            return name, small
    return None


def _own_value(facts: Facts, binding: cst.CSTNode) -> bool:
    """A binding to a value the ranks may disagree on: not a count or a setting, and no
    collective makes them agree on the way."""
    if isinstance(binding, cst.Assign | cst.AnnAssign | cst.AugAssign):
        value = binding.value
    elif isinstance(binding, cst.Expr) and isinstance(binding.value, cst.Call):
        value = binding.value  # ``buffer.append(transition)``
    else:
        return False
    if value is None:
        return False
    if isinstance(value, cst.Call) and (dotted(value.func) or "").rsplit(".", 1)[-1] == "next":
        return False  # ``batch = next(batches, None)``: a prepared loader's, the same count
    if any(
        isinstance(call, cst.Call) and agrees_across_ranks(facts.model, call)
        for call in walk(value)
    ):
        return False
    if isinstance(binding, cst.AugAssign) and isinstance(value, cst.Integer):
        return False  # ``step += 1``
    if isinstance(binding, cst.Assign) and any(
        integer_step(name, value)
        for target in binding.targets
        for name in target_names(target.target)
    ):
        return False  # ``step = step + 1``
    return not facts.ranks.uniform(value)


def _one_per_pass(model: ScriptModel, loop: cst.While, binding: cst.CSTNode, name: str) -> bool:
    """``rollouts.append(...)`` once on every pass of ``while len(rollouts) < 128:``: the test
    reads the list's length only, and nothing skips the append (no ``if``, inner loop or
    ``continue`` on the way), so every rank makes the same number of passes."""
    if not (
        isinstance(binding, cst.Expr)
        and isinstance(binding.value, cst.Call)
        and dotted(binding.value.func) == f"{name}.append"
    ):
        return False
    for read in walk(loop.test):
        if isinstance(read, cst.Name) and read.value == name:
            arg = model.parent(read)
            call = model.parent(arg) if isinstance(arg, cst.Arg) else None
            if not (isinstance(call, cst.Call) and dotted(call.func) == "len"):
                return False  # ``rollouts[-1].done``: read for more than its length
    for outer in model.ancestors(binding):
        if outer is loop.body:
            break
        if not isinstance(outer, cst.SimpleStatementLine | cst.IndentedBlock | cst.With):
            return False
    return not any(
        isinstance(node, cst.Continue) and model.index.nearest(node, _LOOPS) is loop
        for node in walk(loop.body)
    )


def _prepared_rows(facts: Facts, loop: cst.While, binding: cst.CSTNode) -> bool:
    """``samples += x.size(0)`` (``len(x)``, ``x.shape[0]``) of a batch drawn from a prepared
    loader: with Accelerate's ``even_batches`` (the default) every rank's batches have the same
    first dimension, so the count grows alike. Not ``numel()``: a padded batch's token count is
    each rank's own."""
    model = facts.model
    if not (
        isinstance(binding, cst.AugAssign)
        and isinstance(binding.operator, cst.AddAssign)
        and "even_batches" not in model.source
    ):
        return False
    batch = first_dimension_of(binding.value)
    if not isinstance(batch, cst.Name):
        return False
    return _drawn_from_prepared(model, loop, binding, batch.value, depth=3)


def _drawn_from_prepared(
    model: ScriptModel, loop: cst.While, use: cst.CSTNode, name: str, depth: int
) -> bool:
    """``name`` is a batch of a prepared loader at ``use``: the target of a ``for`` over one
    around it, or unpacked (``x, y = batch``) from one in the ``while``'s body, or drawn by
    hand from one (``batch = next(it)`` after ``it = iter(loader)``)."""
    prepared = model.prepared_before(use)
    for outer in model.ancestors(use):
        if outer is loop:
            break
        if isinstance(outer, cst.For) and name in target_names(outer.target):
            return any(f.node is outer and f.iterable in prepared for f in model.loops)
    if depth == 0:
        return False
    values = [
        small.value
        for small in statements(loop.body)
        if isinstance(small, cst.Assign) and binds(model, small, name)
    ]
    return bool(values) and all(
        _a_batch_from(model, loop, value, prepared, depth - 1) for value in values
    )


def _a_batch_from(
    model: ScriptModel,
    loop: cst.While,
    value: cst.BaseExpression,
    prepared: set[str],
    depth: int,
) -> bool:
    if isinstance(value, cst.Name):  # ``x, y = batch``
        return _drawn_from_prepared(model, loop, value, value.value, depth)
    if not (isinstance(value, cst.Call) and dotted(value.func) == "next" and value.args):
        return False
    source = value.args[0].value  # ``next(it)``: every ``it = iter(loader)`` of a prepared one
    if not isinstance(source, cst.Name):
        return False
    function = model.index.nearest(value, cst.FunctionDef)
    made = [
        node.value
        for node in model.index.of_type(cst.Assign)
        if binds(model, node, source.value)
        and model.index.nearest(node, cst.FunctionDef) is function
    ]
    return bool(made) and all(
        isinstance(it, cst.Call)
        and dotted(it.func) == "iter"
        and len(it.args) == 1
        and dotted(it.args[0].value) in prepared
        for it in made
    )
