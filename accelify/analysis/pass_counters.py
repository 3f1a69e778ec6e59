"""Counters of passes over a loader that a loop drawing batches by hand starts again:

    batches = iter(loader)
    while step < max_steps:
        try:
            x, y = next(batches)
        except StopIteration:
            epoch += 1
            batches = iter(loader)
            x, y = next(batches)

The counter counts the times this rank's iterator ran out. Prepared, each rank's loader holds
1/N of the set and runs out N times as often for the same number of steps (each step reads N
batches, one per rank): the counter reaches N times the original count. Each such pass is a
whole pass over the set by the ranks together, so the count is true of the data read, but the
run reads N times as much data in its fixed number of steps as the original did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.script_model import Kind
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
    """Each ``except StopIteration:`` that starts an iterator over a DataLoader again
    (``iter(loader)``) and counts something up by one (``epoch += 1``)."""
    model = facts.model
    found = []
    for handler in model.index.of_type(cst.ExceptHandler):
        if handler.type is None or dotted(handler.type) != "StopIteration":
            continue
        loaders = [
            loader
            for node in walk(handler.body)
            if isinstance(node, cst.Call)
            and dotted(node.func) == "iter"
            and len(node.args) == 1
            and (loader := dotted(node.args[0].value)) is not None
            and facts.flow.kind_of(loader, node) is Kind.DATALOADER
        ]
        if not loaders:
            continue
        for node in walk(handler.body):
            if (
                isinstance(node, cst.AugAssign)
                and isinstance(node.operator, cst.AddAssign)
                and isinstance(node.value, cst.Integer)
                and node.value.value == "1"
                and (counter := dotted(node.target)) is not None
            ):
                found.append(PassCounter(counter, node, loaders[0]))
    return found
