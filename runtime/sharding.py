"""How a stream of batches is split across ranks: whole batches, strided.

Rank ``r`` of ``N`` takes batches ``r, r+N, r+2N, ...`` of the original order, so gathering one
step's batches in rank order gives the original order back, and N ranks with batch ``b`` see the
same samples per step as one process with batch ``N*b``. With ``even_batches`` every rank runs the
same number of steps, so no collective is left waiting: index batches of known size are completed
sample by sample from the start of the pass (`shard_index_batches`, HF Accelerate's way), other
streams repeat whole batches of the first round (`shard_batches`). `gather_for_metrics` drops
the repeats either way: each pass records how many samples were added.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

Batch = TypeVar("Batch")


@dataclass
class ShardPass:
    """Samples the last round repeated to even out the ranks; set before that round is yielded."""

    padding: int = 0


def shard_batches(
    batches: Iterable[Batch],
    rank: int,
    world: int,
    *,
    even_batches: bool,
    drop_last: bool,
    size_of: Callable[[Any], int],
    record: ShardPass,
) -> Iterator[Batch]:
    for round_ in batch_rounds(
        batches,
        world,
        even_batches=even_batches,
        drop_last=drop_last,
        size_of=size_of,
        record=record,
    ):
        if rank < len(round_):
            yield round_[rank]


def sharded_length(
    batches: int, rank: int, world: int, *, even_batches: bool, drop_last: bool
) -> int:
    full_rounds, leftover = divmod(batches, world)
    if leftover == 0 or drop_last:
        return full_rounds
    if even_batches:
        return full_rounds + 1
    return full_rounds + (1 if rank < leftover else 0)


def shard_index_batches(
    batches: Iterable[list[int]],
    rank: int,
    world: int,
    *,
    batch_size: int,
    even_batches: bool,
    drop_last: bool,
    record: ShardPass,
) -> Iterator[list[int]]:
    """Index batches of a map-style dataset, as HF Accelerate shards them: strided whole
    batches, and with ``even_batches`` a short end is completed sample by sample from the start
    of the pass (7 samples, batch 2, 2 ranks: rank 1 gets ``[6, 0]``, a full batch), so every
    rank's every batch has ``batch_size`` samples. ``record.padding`` counts the samples added.
    One process is not sharded at all: its last batch stays short, as without prepare."""
    if drop_last or not even_batches or world == 1:
        yield from shard_batches(
            batches,
            rank,
            world,
            even_batches=even_batches,
            drop_last=drop_last,
            size_of=len,
            record=record,
        )
        return
    # Rounds of ``world`` batches are taken in C (``zip_longest`` over one iterator): every
    # rank reads every rank's batches, and a Python loop over them cost the prepared loader's
    # step more than the rest of its layers (bench/step_instructions.py).
    iterator = iter(batches)
    start: list[int] = []  # the first round's indices, to complete the end with
    pending: list[list[int]] = []
    for index, round_ in enumerate(itertools.zip_longest(*[iterator] * world)):
        if index == 0:
            start = [sample for batch in round_ if batch is not None for sample in batch]
        last = round_[-1]
        if last is not None and len(last) == batch_size:
            yield round_[rank]
            continue
        # the end: a round cut short, or a short batch that ends it (every batch after it, if
        # any, goes to the completed round too)
        pending = [batch for batch in round_ if batch is not None]
        pending.extend(iterator)
        break
    if not pending or not start:
        return
    final, record.padding = _completed_round(pending, start, world, batch_size)
    yield final[rank]


def shard_range_batches(
    order: range, rank: int, world: int, *, batch_size: int, record: ShardPass
) -> Iterator[list[int]]:
    """`shard_index_batches`' even path (``even_batches``, no ``drop_last``, several ranks)
    for torch's `BatchSampler` over a `SequentialSampler`, whose order is ``range(n)``: this
    rank's batches are cut from the range itself, so only its own indices are made. Reading
    every rank's batches from the sampler made each step build ``world`` lists of new ints
    (the indices above 256 are new objects), where a hand-written `DistributedSampler` makes
    its rank's indices once a pass: about a third of the prepared loader's cost over it at 32
    wide (bench/step_instructions.py). The same batches, end and padding as that path.

    The full rounds are cut by iterators of C (``list(order[start:stop])`` mapped over the
    starts), not by a generator whose frame is resumed at every batch; the last round, which
    says its padding in ``record`` when it is reached, is a generator that runs once."""
    span = world * batch_size
    full = len(order) // span * span  # the indices of the rounds whose every batch is full
    first = rank * batch_size
    cuts = map(slice, range(first, full, span), range(first + batch_size, full + batch_size, span))
    return itertools.chain(
        map(list, map(order.__getitem__, cuts)),
        _last_range_round(order, full, rank, world, batch_size, record),
    )


def _last_range_round(
    order: range, full: int, rank: int, world: int, batch_size: int, record: ShardPass
) -> Iterator[list[int]]:
    """`shard_range_batches`' last round, when the range does not end with a full one."""
    tail = order[full:]
    if not tail:
        return
    pending = [list(tail[i : i + batch_size]) for i in range(0, len(tail), batch_size)]
    final, record.padding = _completed_round(
        pending, list(order[: world * batch_size]), world, batch_size
    )
    yield final[rank]


def _completed_round(
    round_: list[list[int]], start: list[int], world: int, batch_size: int
) -> tuple[list[list[int]], int]:
    """The last round with its short batch filled and its missing batches made, from ``start``
    (cycled when the dataset is smaller than one round); and how many samples that took."""
    pool = list(start)
    while len(pool) < world * batch_size:
        pool += start
    final = [batch for batch in round_ if len(batch) == batch_size]
    partial = [] if len(round_[-1]) == batch_size else list(round_[-1])
    taken = 0
    while len(final) < world:
        need = batch_size - len(partial)
        final.append(partial + pool[taken : taken + need])
        taken += need
        partial = []
    return final, taken


def split_index_batches(
    batches: Iterable[list[int]],
    rank: int,
    world: int,
    *,
    batch_size: int,
    even_batches: bool,
    drop_last: bool,
    record: ShardPass,
) -> Iterator[list[int]]:
    """``split_batches``: every batch is cut into ``world`` equal slices and rank ``r`` takes the
    r-th, so N ranks step as often as one process and together see its batches. A short last
    batch is completed from the start of the pass with ``even_batches`` (HF's way) and otherwise
    cut as far as it goes."""
    per_rank = batch_size // world
    first: list[int] = []
    batch: list[int] = []
    for index, batch in enumerate(batches):
        if index == 0:
            first = list(batch)
        if len(batch) == batch_size:
            yield batch[rank * per_rank : (rank + 1) * per_rank]
    if drop_last or not first or len(batch) == batch_size:
        return
    if not even_batches:
        if len(batch) > rank * per_rank:
            yield batch[rank * per_rank : (rank + 1) * per_rank]
        return
    pool = list(first)
    while len(pool) < batch_size:
        pool += first
    record.padding = batch_size - len(batch)
    completed = list(batch) + pool[: record.padding]
    yield completed[rank * per_rank : (rank + 1) * per_rank]


def batch_rounds(
    batches: Iterable[Batch],
    world: int,
    *,
    even_batches: bool,
    drop_last: bool,
    size_of: Callable[[Any], int],
    record: ShardPass,
) -> Iterator[list[Batch]]:
    """The stream in rounds of ``world`` batches, batch ``r`` of a round for rank ``r``; the
    last round completed as `shard_batches` completes it (it may be short without
    ``even_batches``)."""
    first_round: list[Batch] = []
    round_: list[Batch] = []
    for batch in batches:
        if len(first_round) < world:
            first_round.append(batch)
        round_.append(batch)
        if len(round_) == world:
            yield round_
            round_ = []
    if not round_ or drop_last:
        return
    if even_batches:
        repeats = [
            first_round[(r - len(round_)) % len(first_round)] for r in range(len(round_), world)
        ]
        record.padding = sum(size_of(batch) for batch in repeats)
        round_.extend(repeats)
    yield round_
