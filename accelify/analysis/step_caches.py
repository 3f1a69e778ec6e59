"""Caches built over a whole DataLoader and read by a prepared loop's step: ``cache[step]``.

A list filled batch by batch while iterating a DataLoader that is not prepared there (before its
``prepare``, or never prepared) holds every batch of the dataset. Read back as ``cache[step]``
inside ``for step, batch in enumerate(prepared_loader)``, each rank reads indices 0..len/N: the
first 1/N of the cache, the same part on every rank, and never the batch it is training on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.loops import enumerates, first_enumerate_name
from accelify.analysis.script_model import Kind, Loop, ScriptModel
from accelify.analysis.syntax import dotted, walk

if TYPE_CHECKING:
    from accelify.analysis.facts import Facts


@dataclass(frozen=True)
class StepIndexedCache:
    read: cst.Subscript  # ``cache[step]``
    cache: str
    built_in: cst.For  # the loop over the unprepared loader that fills it


def step_indexed_caches(facts: Facts) -> list[StepIndexedCache]:
    model = facts.model
    built: dict[str, cst.For] = {}
    for loop in model.loops:
        if _reads_unprepared_loader(model, facts, loop):
            for name in _appended_to(loop):
                built.setdefault(name, loop.node)
    if not built:
        return []
    found = []
    for loop in model.loops:
        if not _reads_prepared_loader(model, facts, loop):
            continue
        if not enumerates(loop.node.iter):
            continue
        step = first_enumerate_name(loop.node.target)
        for node in walk(loop.node.body):
            if not isinstance(node, cst.Subscript) or len(node.slice) != 1:
                continue
            cache = dotted(node.value)
            index = node.slice[0].slice
            if (
                cache in built
                and isinstance(index, cst.Index)
                and dotted(index.value) in step
                and model.order(built[cache]) < model.order(loop.node)
            ):
                found.append(StepIndexedCache(node, cache, built[cache]))
    return found


def _prepared_at(model: ScriptModel, name: str | None) -> int | None:
    """Where ``name`` first holds a prepared object (the order of its prepare call)."""
    orders = [model.order(c.call) for c in model.prepare_calls if name in c.outputs]
    return min(orders) if orders else None


def _reads_unprepared_loader(model: ScriptModel, facts: Facts, loop: Loop) -> bool:
    if facts.flow.kind_of(loop.iterable, loop.node) is not Kind.DATALOADER:
        return False
    prepared = _prepared_at(model, loop.iterable)
    if prepared is None:
        # a helper's parameter (``fetch_teacher_outputs(teacher, train_dl)``): the loader its
        # callers hand it, prepared there
        outer = facts.flow.outer_name(loop.iterable, loop.node)
        return outer is None or _prepared_at(model, outer) is None
    return model.order(loop.node) < prepared


def _reads_prepared_loader(model: ScriptModel, facts: Facts, loop: Loop) -> bool:
    prepared = _prepared_at(model, loop.iterable)
    if prepared is None:
        outer = facts.flow.outer_name(loop.iterable, loop.node)
        return outer is not None and _prepared_at(model, outer) is not None
    return model.order(loop.node) > prepared


def _appended_to(loop: Loop) -> set[str]:
    """``cache.append(...)`` in the loop body: names of lists filled batch by batch."""
    found = set()
    for node in walk(loop.node.body):
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "append"
        ):
            name = dotted(node.func.value)
            if name is not None:
                found.add(name)
    return found
