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
from accelify.analysis.own_values import binds, names_read
from accelify.analysis.syntax import dotted, walk

if TYPE_CHECKING:
    from accelify.analysis.facts import Facts


@dataclass(frozen=True)
class RankLocalLoop:
    """A ``while`` whose test reads a value each rank computes alone, around a collective."""

    loop: cst.While
    name: str  # what the test reads: ``done``
    binding: cst.CSTNode  # where the loop binds it from this rank's data
    collective: cst.Call  # a collective (or a call reaching one) every pass makes


def rank_local_loops(facts: Facts) -> list[RankLocalLoop]:
    model = facts.model
    found: list[RankLocalLoop] = []
    for loop in model.index.of_type(cst.While):
        test = loop.test
        if facts.ranks.uniform(test) or facts.ranks.is_rank_test(test):
            continue  # a count or a setting; a rank test is ACC202's
        collective = _collective_in(facts, loop)
        if collective is None:
            continue
        own = _own_binding(facts, loop)
        if own is not None:
            found.append(RankLocalLoop(loop, own[0], own[1], collective))
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
    return not facts.ranks.uniform(value)
