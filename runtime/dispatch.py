"""``dispatch_batches=True``: the main process alone reads the DataLoader and sends each rank
its batch, for data that only one process can read (a stream, a queue, files on one node).

Each step the main process reads one round, ``world`` batches (or one batch cut into ``world``
row slices with ``split_batches``), and broadcasts it with the flag that it is the last; every
rank keeps its own part. The other ranks never touch the DataLoader, so its shuffle and its
workers run once.

The end of a pass is HF's `DataLoaderDispatcher`'s, whatever ``even_batches`` says: the rows left
(a last round of fewer than ``world`` batches; with ``split_batches``, a short last batch) are
cut into ``world`` equal slices, completed only up to a multiple of ``world`` with rows of the
first batch. Every rank steps as often as the others (``ceil(batches / world)``, or
``len(loader)`` with ``split_batches``) and no sample is repeated where the rows divide evenly.
One difference: a full last round whose last batch is short keeps a batch per rank (HF cuts
its rows evenly too); every rank still steps, nothing is repeated.
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
    drop_last: bool,
    record: ShardPass,
) -> Iterator[tuple[Any, bool]]:
    """This rank's batches, each with whether it is this pass's last."""
    rank, world = state.process_index, state.num_processes
    rounds: Iterator[list[Any]] = iter(())
    if rank == 0:
        if split_batches:
            rounds = _split_rounds(loader, world, drop_last, record)
        else:
            rounds = _batch_rounds(loader, world, drop_last, record)
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
    loader: Iterable[Any], world: int, drop_last: bool, record: ShardPass
) -> Iterator[list[Any]]:
    """Each batch cut into ``world`` equal row slices; a short last batch the same way (see the
    module's doc), so every rank steps as often as the DataLoader has batches."""
    first: Any = None
    size = 0
    for batch in loader:
        rows = first_dim(batch) or 0
        if first is None:
            first, size = batch, rows
        if rows == size:
            yield _slices(batch, world)
            continue
        if not drop_last:
            yield _even_slices(batch, first, world, record)
        return


def _batch_rounds(
    loader: Iterable[Any], world: int, drop_last: bool, record: ShardPass
) -> Iterator[list[Any]]:
    """Rounds of ``world`` batches, batch ``r`` for rank ``r``; the rows of a short last round
    joined and cut into ``world`` equal slices (see the module's doc)."""
    first: Any = None
    round_: list[Any] = []
    for round_ in batch_rounds(
        loader,
        world,
        even_batches=False,
        drop_last=drop_last,
        size_of=lambda batch: first_dim(batch) or 1,
        record=record,
    ):
        if first is None:
            first = round_[0]
        if len(round_) == world:
            yield round_
    if 0 < len(round_) < world:  # batch_rounds yields a short round only last, and not drop_last
        yield _even_slices(_join_rows(round_), first, world, record)


def _even_slices(batch: Any, first: Any, world: int, record: ShardPass) -> list[Any]:
    """``batch`` cut into ``world`` equal slices, completed to a multiple of ``world`` with the
    first rows of ``first`` (HF's `DataLoaderDispatcher`)."""
    record.padding = -(first_dim(batch) or 0) % world
    if record.padding:
        batch = _concat_rows(batch, first, record.padding)
    return _slices(batch, world)


def _join_rows(batches: list[Any]) -> Any:
    """The batches' rows, tensor by tensor, in order."""
    columns: list[list[torch.Tensor]] = []
    for batch in batches:
        tensors: list[torch.Tensor] = []
        apply_to_tensors(tensors.append, batch)
        columns = columns or [[] for _ in tensors]
        for column, tensor in zip(columns, tensors, strict=True):
            column.append(tensor)
    position = iter(range(len(columns)))
    return apply_to_tensors(lambda _: torch.cat(columns[next(position)]), batches[0])


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
