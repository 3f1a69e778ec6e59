"""Totals folded from the shard on some ranks only, then combined over every rank.

``total = torch.zeros(1)`` on every rank, ``if accelerator.is_main_process: total +=
loss.detach()`` in the loop over a prepared DataLoader, then ``accelerator.reduce(total)`` on
every rank: the other ranks hand the collective the value they started with, so the "sum over
the ranks" is the main process's shard alone (a mean over them is that divided by N), a silently
wrong number with no error. The same for ``gather``/``gather_for_metrics``/``dist.all_reduce``.

What a fold reads of this rank's shard is found by `OwnValues` (the analysis ACC409 and ACC420
ask): a value main decided alone and combined on purpose (``stop = 0``, ``if is_main: stop =
1``, ``reduce(stop)`` to broadcast a flag) reads no shard and is not one; nor is a count
(``n += 1``): it reads none of the shard's data, and the combine hands back the main process's
count (its number of batches, which every rank shares over a prepared loader), not N times it,
a per-rank step count a script often means. Only where every fold of the total is under the
same rank test (a fold on every rank too, or one in the test's ``else``, is every rank's) and
the combine runs on every rank (a combine on some ranks is ACC202's hang).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.collective_reach import spelled
from accelify.analysis.collectives import combines_ranks
from accelify.analysis.dataflow import statements
from accelify.analysis.own_values import OwnValues, binds
from accelify.analysis.syntax import dotted, walk

if TYPE_CHECKING:
    from accelify.analysis.facts import Facts


@dataclass(frozen=True)
class RankOnlyTotal:
    """A collective every rank makes over a total only some ranks folded."""

    combine: cst.Call  # ``accelerator.reduce(total)``
    name: str  # ``total``, ``self.total``
    fold: cst.CSTNode  # the fold of the shard into it, under ``guard``
    guard: cst.If  # the rank test around every fold


def rank_only_totals(facts: Facts) -> list[RankOnlyTotal]:
    """Every combine (reduce, gather, all-reduce) run on every rank whose argument reads a
    total folded from the shard only under a rank test."""
    model = facts.model
    found: list[RankOnlyTotal] = []
    for use in facts.collective_uses:
        call = use.collective
        if use.through_helper or use.skipped_on or not combines_ranks(model, call):
            continue
        positional = [a for a in call.args if a.keyword is None and not a.star]
        if not positional or model.under_rank_guard(call):
            continue
        statement = _small_statement(facts, call)
        if statement is None:
            continue
        fold = OwnValues(facts).origin(positional[0].value, statement, {})
        if fold is None:
            continue
        name = _folded_name(fold)
        guard = _rank_guard(facts, fold)
        if name is None or guard is None:
            continue
        if _every_fold_under(facts, name, guard, statement):
            found.append(RankOnlyTotal(call, name, fold, guard))
    return found


def _small_statement(facts: Facts, node: cst.CSTNode) -> cst.CSTNode | None:
    """The statement ``node`` is in (``total = accelerator.reduce(total)``): the total's
    bindings are those before it, not this one."""
    for ancestor in facts.model.ancestors(node):
        if isinstance(ancestor, cst.BaseSmallStatement):
            return ancestor
        if isinstance(ancestor, cst.BaseCompoundStatement):
            return None
    return None


def _folded_name(fold: cst.CSTNode) -> str | None:
    """What a fold adds into: ``total += x``, ``total = total + x``."""
    if isinstance(fold, cst.AugAssign):
        return dotted(fold.target)
    if isinstance(fold, cst.Assign) and len(fold.targets) == 1:
        name = dotted(fold.targets[0].target)
        reads = {
            dotted(node) for node in walk(fold.value) if isinstance(node, cst.Name | cst.Attribute)
        }
        return name if name is not None and name in reads else None
    return None


def _rank_guard(facts: Facts, node: cst.CSTNode) -> cst.If | None:
    """The innermost ``if`` on a rank test, in ``node``'s function, whose body (not its
    ``else``) holds ``node``."""
    child: cst.CSTNode = node
    for ancestor in facts.model.ancestors(node):
        if isinstance(ancestor, cst.FunctionDef):
            return None
        if (
            isinstance(ancestor, cst.If)
            and child is not ancestor.test
            and facts.ranks.is_rank_test(ancestor.test)
        ):
            return ancestor if child is ancestor.body else None
        child = ancestor
    return None


def _every_fold_under(facts: Facts, name: str, guard: cst.If, combine: cst.CSTNode) -> bool:
    """Every binding of ``name`` before ``combine`` in its function that adds to it sits under
    a rank test spelled as ``guard``'s; every other binding (the start: ``total = 0``) is made
    by every rank."""
    model = facts.model
    function = facts.placement.enclosing_function(combine)
    block = function.body if function is not None else model.module
    tested = spelled(model, guard.test)
    order = model.order(combine)
    for small in statements(block):
        if model.order(small) >= order or facts.placement.enclosing_function(small) is not function:
            continue
        if not binds(model, small, name):
            continue
        around = _rank_guard(facts, small)
        if _folded_name(small) == name:
            if around is None or spelled(model, around.test) != tested:
                return False
        elif around is not None or model.under_rank_guard(small):
            return False  # started (or reset) on some ranks only: not this shape
    return True
