"""How a stream of batches is split across ranks: whole batches, strided.

Rank ``r`` of ``N`` takes batches ``r, r+N, r+2N, ...`` of the original order, so gathering one
step's batches in rank order gives the original order back, and N ranks with batch ``b`` see the
same samples per step as one process with batch ``N*b``. When the last round is short, the ranks
without a batch repeat batches from the first round (``even_batches``), so every rank runs the same
number of steps and no collective is left waiting; `gather_for_metrics` drops those repeats.
"""

from __future__ import annotations

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
    first_round: list[Batch] = []
    round_: list[Batch] = []
    for batch in batches:
        if len(first_round) < world:
            first_round.append(batch)
        round_.append(batch)
        if len(round_) == world:
            yield round_[rank]
            round_ = []
    if not round_ or drop_last:
        return
    repeats = [first_round[(r - len(round_)) % len(first_round)] for r in range(len(round_), world)]
    if even_batches:
        record.padding = sum(size_of(batch) for batch in repeats)
        round_.extend(repeats)
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
