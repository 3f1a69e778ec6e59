"""Prepared DataLoaders: each rank reads its shard, on its device, in an order every rank agrees on.

The user's DataLoader is re-created with the same dataset, workers and collate function and a batch
sampler that yields this rank's batches (`sharding.py`). Randomness is kept exactly where torch
keeps it: a shuffling pass draws its seed from the global RNG at the same moment an unprepared
DataLoader would, so one prepared process trains exactly like the unprepared script. With several
ranks, rank 0's draw is broadcast so every rank shuffles the same way.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from accelify.runtime import pending_work
from accelify.runtime.gradient_state import GradientState
from accelify.runtime.operations import first_dim, send_to_device
from accelify.runtime.sharding import (
    ShardPass,
    shard_batches,
    shard_index_batches,
    sharded_length,
)
from accelify.runtime.state import ProcessState

_LOADER_ARGS = (
    "num_workers",
    "collate_fn",
    "pin_memory",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "persistent_workers",
)


class _PassSeeds:
    """The sampler's generator for each pass: drawn like torch draws it, agreed across ranks."""

    def __init__(self, sampler: Any, state: ProcessState) -> None:
        self.state = state
        self.owns_generator = isinstance(sampler, RandomSampler) and sampler.generator is None
        if self.owns_generator:
            sampler.generator = torch.Generator()
        self.generator: torch.Generator | None = getattr(sampler, "generator", None)
        self.pass_start_state: torch.Tensor | None = None
        self.restore_state: torch.Tensor | None = None

    @pending_work.tracks
    def start_pass(self) -> None:
        if self.generator is None:
            return
        if self.restore_state is not None:
            self.generator.set_state(self.restore_state)
            self.restore_state = None
        elif self.owns_generator:
            # The same draw RandomSampler makes when it has no generator of its own.
            seed = torch.empty((), dtype=torch.int64).random_()
            if self.state.distributed:
                dist.broadcast(seed, src=0)
            self.generator.manual_seed(int(seed.item()))
        elif self.state.distributed:
            generator_state = self.generator.get_state()
            dist.broadcast(generator_state, src=0)
            self.generator.set_state(generator_state)
        self.pass_start_state = self.generator.get_state()


class _ShardedBatchSampler:
    """This rank's index batches of one pass; a batch sampler the inner DataLoader can use."""

    def __init__(
        self, batch_sampler: Any, state: ProcessState, even_batches: bool, drop_last: bool
    ) -> None:
        self.batch_sampler = copy.copy(batch_sampler)
        sampler = getattr(self.batch_sampler, "sampler", None)
        if sampler is not None:
            self.batch_sampler.sampler = copy.copy(sampler)
        self.seeds = _PassSeeds(getattr(self.batch_sampler, "sampler", None), state)
        self.state = state
        self.even_batches = even_batches
        self.drop_last = drop_last
        self.current = ShardPass()
        self.skip = 0

    def __len__(self) -> int:
        return sharded_length(
            len(self.batch_sampler),
            self.state.process_index,
            self.state.num_processes,
            even_batches=self.even_batches,
            drop_last=self.drop_last,
        )

    def __iter__(self) -> Iterator[list[int]]:
        # A generator, like torch's BatchSampler: the shuffle seed is drawn at the first batch,
        # after the DataLoader iterator has drawn its own base seed, exactly as without prepare.
        self.seeds.start_pass()
        self.current = ShardPass()
        batch_size = getattr(self.batch_sampler, "batch_size", None)
        if isinstance(batch_size, int) and batch_size > 0:
            batches = shard_index_batches(
                self.batch_sampler,
                self.state.process_index,
                self.state.num_processes,
                batch_size=batch_size,
                even_batches=self.even_batches,
                drop_last=self.drop_last,
                record=self.current,
            )
        else:  # a batch sampler of its own sizes: whole batches, the end evened out by repeats
            batches = shard_batches(
                self.batch_sampler,
                self.state.process_index,
                self.state.num_processes,
                even_batches=self.even_batches,
                drop_last=self.drop_last,
                size_of=len,
                record=self.current,
            )
        skip, self.skip = self.skip, 0
        yield from itertools.islice(batches, skip, None)


class PreparedDataLoader:
    """A DataLoader that yields this rank's batches on its device; len() is this rank's steps."""

    def __init__(
        self,
        loader: DataLoader,
        state: ProcessState,
        gradient_state: GradientState,
        *,
        device_placement: bool = True,
        even_batches: bool = True,
        non_blocking: bool = False,
    ) -> None:
        self.base_dataloader = loader
        self.non_blocking = non_blocking
        self.state = state
        self.gradient_state = gradient_state
        self.device_placement = device_placement
        self.even_batches = even_batches
        self.iteration = 0
        self.batches_yielded = 0
        self.at_last_batch = False
        self._resume_skip = 0
        self._iterable = isinstance(loader.dataset, IterableDataset)
        self._iterable_pass = ShardPass()
        if self._iterable:
            self._sampler: _ShardedBatchSampler | None = None
            self._inner = loader
        else:
            self._sampler = _ShardedBatchSampler(
                loader.batch_sampler or BatchSampler(loader.sampler, 1, False),
                state,
                even_batches,
                drop_last=loader.drop_last,
            )
            self._inner = _rebuild(loader, self._sampler)

    # --- what scripts read off a DataLoader -------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "base_dataloader":
            raise AttributeError(name)
        return getattr(self.base_dataloader, name)

    def __len__(self) -> int:
        if self._sampler is not None:
            return len(self._sampler)
        return sharded_length(
            len(self.base_dataloader),
            self.state.process_index,
            self.state.num_processes,
            even_batches=self.even_batches,
            drop_last=self.base_dataloader.drop_last,
        )

    @property
    def padding(self) -> int:
        """Samples repeated in the current pass's last round (0 before the last round)."""
        if self._sampler is not None:
            return self._sampler.current.padding
        return self._iterable_pass.padding

    def set_epoch(self, epoch: int) -> None:
        for owner in (getattr(self._sampler, "batch_sampler", None), self.base_dataloader.dataset):
            sampler = getattr(owner, "sampler", owner)
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)

    # --- iteration --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        skip, self._resume_skip = self._resume_skip, 0
        if self._sampler is not None:
            self._sampler.skip = skip
            batches: Iterator[Any] = self._start_inner_pass()
            expected = len(self._sampler) - skip
            stream = _count_to_end(batches, expected)
        else:
            self._iterable_pass = ShardPass()
            batches = shard_batches(
                self._inner,
                self.state.process_index,
                self.state.num_processes,
                even_batches=self.even_batches,
                drop_last=self.base_dataloader.drop_last,
                size_of=lambda batch: first_dim(batch) or 1,
                record=self._iterable_pass,
            )
            stream = _look_ahead(itertools.islice(batches, skip, None))
        self.iteration += 1
        self.batches_yielded = skip
        self.at_last_batch = False
        self.gradient_state.active_loaders.append(self)
        try:
            for batch, is_last in stream:
                self.batches_yielded += 1
                self.at_last_batch = is_last
                if self.device_placement:
                    batch = send_to_device(batch, self.state.device, self.non_blocking)
                yield batch
        finally:
            self.at_last_batch = False
            if self in self.gradient_state.active_loaders:
                self.gradient_state.active_loaders.remove(self)

    def _start_inner_pass(self) -> Iterator[Any]:
        """Start the inner DataLoader's pass; when resuming a checkpointed pass, without
        consuming the global RNG draw that the interrupted pass already made before the save."""
        resuming = self._sampler is not None and self._sampler.seeds.restore_state is not None
        if not resuming or self._inner.generator is not None:
            return iter(self._inner)
        rng_state = torch.get_rng_state()
        batches = iter(self._inner)
        torch.set_rng_state(rng_state)
        return batches

    # --- checkpoints --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        seeds = self._sampler.seeds if self._sampler is not None else None
        generator_state = seeds.pass_start_state if seeds is not None else None
        return {
            "iteration": self.iteration,
            "batches_yielded": self.batches_yielded,
            "generator_state": generator_state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next pass resume the interrupted one: same order, the seen batches skipped."""
        self.iteration = int(state["iteration"])
        yielded = int(state["batches_yielded"])
        if yielded >= len(self) or self.iteration == 0:
            return
        self.iteration -= 1
        self._resume_skip = yielded
        if self._sampler is not None and state["generator_state"] is not None:
            self._sampler.seeds.restore_state = state["generator_state"]

    def skip_first_batches(self, num_batches: int) -> PreparedDataLoader:
        """This loader, its next pass starting ``num_batches`` in (replaces a restored position)."""
        self._resume_skip = num_batches
        return self


def _rebuild(loader: DataLoader, batch_sampler: _ShardedBatchSampler) -> DataLoader:
    kwargs = {name: getattr(loader, name) for name in _LOADER_ARGS}
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    else:
        kwargs["persistent_workers"] = False
    return DataLoader(loader.dataset, batch_sampler=batch_sampler, **kwargs)


def _count_to_end(batches: Iterator[Any], expected: int) -> Iterator[tuple[Any, bool]]:
    """Mark the last batch by count, not by reading ahead: reading ahead would move a dataset's
    random transforms before the training step that precedes them, changing the RNG stream."""
    for index, batch in enumerate(batches, start=1):
        yield batch, index == expected


def _look_ahead(batches: Iterator[Any]) -> Iterator[tuple[Any, bool]]:
    """For streams of unknown length: hold one batch back to know which is the last."""
    iterator = iter(batches)
    try:
        current = next(iterator)
    except StopIteration:
        return
    for following in iterator:
        yield current, False
        current = following
    yield current, True
