"""Caches built over a whole DataLoader and read by a prepared loop's step: ``cache[step]``;
and the dataset a prepared loader was built over, read the same way (``dataset[step * bs + j]``).

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
from accelify.analysis.scheduler_preparation import PROCESS_COUNT
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


@dataclass(frozen=True)
class StepIndexedDataset:
    read: cst.Subscript  # ``dataset[step * batch_size + j]``
    dataset: str
    loader: cst.Call  # ``DataLoader(dataset, ...)``, the loader prepare shards


def step_indexed_datasets(facts: Facts) -> list[StepIndexedDataset]:
    """``dataset[idx * batch_size + j]`` in ``for idx, batch in enumerate(prepared_loader)``,
    where ``prepared_loader`` was built as ``DataLoader(dataset, ...)`` (a prompt-generation
    pipeline names each output file after ``dataset[idx * bs + j]["url"]``). The step counts this
    rank's batches, so every rank reads the first 1/N of the dataset, the same samples on every
    rank, and never those of the batch in hand. An index that names the process count or rank
    (``(idx * num_processes + process_index) * bs``) maps the shard back and is left alone."""
    model = facts.model
    found = []
    for loop in model.loops:
        if not enumerates(loop.node.iter) or not _reads_prepared_loader(model, facts, loop):
            continue
        built = _loader_construction(model, facts, loop)
        dataset = _dataset_of(built) if built is not None else None
        if built is None or dataset is None:
            continue
        step = first_enumerate_name(loop.node.target)
        for node in walk(loop.node.body):
            if not isinstance(node, cst.Subscript) or len(node.slice) != 1:
                continue
            index = node.slice[0].slice
            if dotted(node.value) != dataset or not isinstance(index, cst.Index):
                continue
            names = {n.value for n in walk(index.value) if isinstance(n, cst.Name)}
            spelled = model.module.code_for_node(index.value)
            if names & step and not _maps_the_shard_back(spelled):
                found.append(StepIndexedDataset(node, dataset, built))
    return found


def _maps_the_shard_back(index: str) -> bool:
    """An index that names the process count or this rank: it maps the shard's step back to
    the sample."""
    return bool(PROCESS_COUNT.search(index)) or "rank" in index or "process_index" in index


def _loader_construction(model: ScriptModel, facts: Facts, loop: Loop) -> cst.Call | None:
    """The ``DataLoader(...)`` call the prepared loader of ``loop`` was made from, in the loop's
    scope: the last binding of the loader's name (or of the name prepare was handed) before
    its prepare."""
    prepared = _prepared_at(model, loop.iterable)
    if prepared is None:
        return None
    inputs = {
        given
        for call in model.prepare_calls
        if loop.iterable in call.outputs
        for given, output in zip(call.inputs, call.outputs, strict=False)
        if output == loop.iterable
    }
    made = [
        binding.value
        for binding in model.of_kind(Kind.DATALOADER)
        if binding.name in inputs | {loop.iterable}
        and model.order(binding.assign) < prepared
        and isinstance(binding.value, cst.Call)
        and (dotted(binding.value.func) or "").rsplit(".", 1)[-1] == "DataLoader"
    ]
    return made[-1] if made else None  # type: ignore[return-value]


def _dataset_of(call: cst.Call) -> str | None:
    """The name ``DataLoader(dataset, ...)`` (or ``dataset=``) reads its samples from."""
    for position, argument in enumerate(call.args):
        keyword = argument.keyword.value if argument.keyword is not None else None
        if keyword == "dataset" or (keyword is None and position == 0 and not argument.star):
            return dotted(argument.value)
    return None


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
