"""``dispatch_batches=True``: the main process alone reads the DataLoader and sends each rank
its batch, for data that only one process can read (a stream, a queue, files on one node).

Each step the main process reads one round, ``world`` batches (or one batch cut into ``world``
row slices with ``split_batches``), and broadcasts it with the flag that it is the last; every
rank keeps its own part. The other ranks never touch the DataLoader, so its shuffle and its
workers run once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from accelify.runtime.operations import apply_to_tensors, broadcast_object_list, first_dim
from accelify.runtime.sharding import ShardPass, batch_rounds
from accelify.runtime.state import ProcessState


def dispatched(
    loader: Iterable[Any],
    state: ProcessState,
    *,
    split_batches: bool,
    even_batches: bool,
    drop_last: bool,
    record: ShardPass,
) -> Iterator[tuple[Any, bool]]:
    """This rank's batches, each with whether it is this pass's last."""
    rank, world = state.process_index, state.num_processes
    rounds: Iterator[list[Any]] = iter(())
    if rank == 0:
        if split_batches:
            rounds = _split_rounds(loader, world, even_batches, drop_last, record)
        else:
            rounds = batch_rounds(
                loader,
                world,
                even_batches=even_batches,
                drop_last=drop_last,
                size_of=lambda batch: first_dim(batch) or 1,
                record=record,
            )
    upcoming = next(rounds, None) if rank == 0 else None
    while True:
        if rank == 0:
            current, upcoming = upcoming, (next(rounds, None) if upcoming is not None else None)
            payload = [None if current is None else (current, upcoming is None, record.padding)]
        else:
            payload = [None]
        message = broadcast_object_list(payload)[0]
        if message is None:
            return
        round_, is_last, record.padding = message
        if rank < len(round_):
            yield round_[rank], is_last
        if is_last:
            return


def _split_rounds(
    loader: Iterable[Any], world: int, even_batches: bool, drop_last: bool, record: ShardPass
) -> Iterator[list[Any]]:
    """Each batch cut into ``world`` equal row slices. A short last batch is completed with rows
    of the first batch: to the full batch size under ``even_batches``, else (HF's
    `DataLoaderDispatcher`) only up to the next multiple of ``world``, so every rank still gets
    a slice, of equal size, and steps as often as the DataLoader has batches."""
    first: Any = None
    size = 0
    for batch in loader:
        rows = first_dim(batch) or 0
        if first is None:
            first, size = batch, rows
        if rows == size:
            yield _slices(batch, world)
            continue
        if drop_last:
            return
        record.padding = size - rows if even_batches else -rows % world
        if record.padding:
            batch = _concat_rows(batch, first, record.padding)
        yield _slices(batch, world)
        return


def _slices(batch: Any, world: int) -> list[Any]:
    rows = first_dim(batch) or 0
    per_rank = -(-rows // world)
    return [
        apply_to_tensors(lambda t, r=r: t[r * per_rank : (r + 1) * per_rank], batch)
        for r in range(world)
    ]


def _concat_rows(batch: Any, source: Any, count: int) -> Any:
    """``batch`` with the first ``count`` rows of ``source`` appended, tensor by tensor."""
    sources: list[torch.Tensor] = []
    apply_to_tensors(sources.append, source)
    position = iter(range(len(sources)))

    def extend(tensor: torch.Tensor) -> torch.Tensor:
        other = sources[next(position)]
        filler = other[:count]
        while filler.shape[0] < count:
            filler = torch.cat([filler, other[: count - filler.shape[0]]])
        return torch.cat([tensor, filler])

    return apply_to_tensors(extend, batch)
