"""Counters of passes over a loader that a loop drawing batches by hand starts again:

    batches = iter(loader)
    while step < max_steps:
        try:
            x, y = next(batches)
        except StopIteration:
            epoch += 1
            batches = iter(loader)
            x, y = next(batches)

or its ``next(it, None)`` form (``batch = next(batches, None)``, then ``if batch is None:``
count up and start again). The counter counts the times this rank's iterator ran out.
Prepared, each rank's loader holds 1/N of the set and runs out N times as often for the same
number of steps (each step reads N batches, one per rank): the counter reaches N times the
original count. Each such pass is a whole pass over the set by the ranks together, so the
count is true of the data read, but the run reads N times as much data in its fixed number of
steps as the original did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted, walk

if TYPE_CHECKING:
    from accelify.analysis.facts import Facts


@dataclass(frozen=True)
class PassCounter:
    #: the name counted up when the iterator runs out: ``epoch``, ``self.epoch``
    counter: str
    #: ``epoch += 1``
    bump: cst.AugAssign
    #: the loader the iterator is started again over
    loader: str


def pass_counters(facts: Facts) -> list[PassCounter]:
    """Each block that runs where an iterator over a DataLoader runs out (``except
    StopIteration:``, ``if batch is None:`` after ``batch = next(batches, None)``), starts it
    again (``iter(loader)``) and counts something up by one (``epoch += 1``)."""
    found = []
    for block in _ran_out_blocks(facts):
        loaders = [
            loader
            for node in walk(block)
            if isinstance(node, cst.Call)
            and dotted(node.func) == "iter"
            and len(node.args) == 1
            and (loader := dotted(node.args[0].value)) is not None
            and facts.flow.kind_of(loader, node) is Kind.DATALOADER
        ]
        if not loaders:
            continue
        for node in walk(block):
            if (
                isinstance(node, cst.AugAssign)
                and isinstance(node.operator, cst.AddAssign)
                and isinstance(node.value, cst.Integer)
                and node.value.value == "1"
                and (counter := dotted(node.target)) is not None
            ):
                found.append(PassCounter(counter, node, loaders[0]))
    return found


def _ran_out_blocks(facts: Facts) -> list[cst.CSTNode]:
    """The bodies that run when an iterator runs out: ``except StopIteration:``, and ``if x
    is None:`` (``if not x:``) where ``x`` was last given ``next(it, None)`` in the same
    scope."""
    model = facts.model
    blocks: list[cst.CSTNode] = [
        handler.body
        for handler in model.index.of_type(cst.ExceptHandler)
        if isinstance(handler, cst.ExceptHandler)
        and handler.type is not None
        and dotted(handler.type) == "StopIteration"
    ]
    for test in model.index.of_type(cst.If):
        assert isinstance(test, cst.If)
        checked = _none_checked(test.test)
        if checked is not None and _given_next_or_none(model, checked, test):
            blocks.append(test.body)
    return blocks


def _none_checked(test: cst.BaseExpression) -> str | None:
    """``x is None``, ``not x``: the name tested for a spent iterator."""
    if (
        isinstance(test, cst.Comparison)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.Is)
        and isinstance(test.comparisons[0].comparator, cst.Name)
        and test.comparisons[0].comparator.value == "None"
    ):
        return dotted(test.left)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return dotted(test.expression)
    return None


def _given_next_or_none(model: ScriptModel, name: str, test: cst.If) -> bool:
    """The last assignment of ``name`` before ``test``, in its scope, is ``next(it, None)``."""
    scope = model.scope_of(test)
    before = [
        a
        for a in model.index.assignments_to(name)
        if model.scope_of(a) is scope and model.order(a) < model.order(test)
    ]
    if not before:
        return False
    value = max(before, key=model.order).value
    return (
        isinstance(value, cst.Call)
        and dotted(value.func) == "next"
        and len(value.args) == 2
        and isinstance(value.args[1].value, cst.Name)
        and value.args[1].value.value == "None"
    )
