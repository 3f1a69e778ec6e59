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
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from accelify.runtime import pending_work
from accelify.runtime.dispatch import dispatched
from accelify.runtime.gradient_state import GradientState
from accelify.runtime.operations import broadcast_object_list, first_dim, placer
from accelify.runtime.plugins import DataLoaderConfiguration
from accelify.runtime.samplers import SeedableRandomSampler, seedable
from accelify.runtime.sharding import (
    ShardPass,
    shard_batches,
    shard_index_batches,
    shard_range_batches,
    sharded_length,
    split_index_batches,
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
        self.seedable = sampler if isinstance(sampler, SeedableRandomSampler) else None
        self.owns_generator = (
            isinstance(sampler, RandomSampler) and sampler.generator is None and not self.seedable
        )
        if self.owns_generator:
            sampler.generator = torch.Generator()
        self.generator: torch.Generator | None = (
            None if self.seedable else getattr(sampler, "generator", None)
        )
        self.pass_start_state: torch.Tensor | None = None
        self.restore_state: torch.Tensor | None = None
        self.pass_start_epoch: int | None = None
        self.restore_epoch: int | None = None
        self.seed_agreed = False

    @pending_work.tracks
    def start_pass(self) -> None:
        if self.seedable is not None:
            self._start_seedable_pass(self.seedable)
            return
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

    def _start_seedable_pass(self, sampler: SeedableRandomSampler) -> None:
        """Its seed and epoch decide the pass; rank 0's seed is taken once, so that ranks that
        were not seeded alike still shuffle alike."""
        if self.state.distributed and not self.seed_agreed:
            sampler.initial_seed = broadcast_object_list([sampler.initial_seed])[0]
            self.seed_agreed = True
        if self.restore_epoch is not None:
            sampler.set_epoch(self.restore_epoch)
            self.restore_epoch = None
        self.pass_start_epoch = sampler.epoch


class _ShardedBatchSampler:
    """This rank's index batches of one pass; a batch sampler the inner DataLoader can use.

    ``batch_sampler`` is (a copy of) the user's, ``even_batches`` can be changed between passes
    (`Accelerator.join_uneven_inputs` does), as on HF's ``BatchSamplerShard``.
    """

    def __init__(
        self,
        batch_sampler: Any,
        state: ProcessState,
        even_batches: bool,
        drop_last: bool,
        *,
        split_batches: bool = False,
        seedable_sampler: bool = False,
        data_seed: int | None = None,
        size_of: Any = len,
    ) -> None:
        self.batch_sampler = copy.copy(batch_sampler)
        if hasattr(self.batch_sampler, "sampler"):
            sampler = copy.copy(self.batch_sampler.sampler)
            if seedable_sampler and type(sampler) is RandomSampler:
                sampler = seedable(sampler, data_seed)
            self.batch_sampler.sampler = sampler
        else:  # the sampler itself (a DataLoader with batch_size=None): each item is one step
            if seedable_sampler and type(self.batch_sampler) is RandomSampler:
                self.batch_sampler = seedable(self.batch_sampler, data_seed)
            sampler = self.batch_sampler
        self.seeds = _PassSeeds(sampler, state)
        self.state = state
        self.even_batches = even_batches
        self.drop_last = drop_last
        self.split_batches = split_batches
        self.size_of = size_of
        self.current = ShardPass()
        self.skip = 0
        if split_batches:
            size = self.batch_size
            if size is None or size % state.num_processes:
                raise ValueError(
                    "split_batches=True needs a batch size that is a multiple of the number of "
                    f"processes ({state.num_processes}); the DataLoader's is {size}"
                )

    @property
    def batch_size(self) -> int | None:
        size = getattr(self.batch_sampler, "batch_size", None)
        return size if isinstance(size, int) and size > 0 else None

    def __len__(self) -> int:
        batches = len(self.batch_sampler)
        if self.split_batches:
            return self._split_length(batches)
        return sharded_length(
            batches,
            self.state.process_index,
            self.state.num_processes,
            even_batches=self.even_batches,
            drop_last=self.drop_last,
        )

    def _split_length(self, batches: int) -> int:
        assert self.batch_size is not None
        samples = len(getattr(self.batch_sampler, "sampler", ()) or ()) or batches * self.batch_size
        last = samples % self.batch_size
        if last == 0 or self.drop_last or self.even_batches:
            return batches
        per_rank = self.batch_size // self.state.num_processes
        return batches if last > self.state.process_index * per_rank else batches - 1

    def _sequential(self, world: int) -> bool:
        """Whether this pass's index batches are torch's `BatchSampler`'s over a
        `SequentialSampler` (``range(n)`` in batches), evened out on several ranks: cut from
        the range (`shard_range_batches`). A subclass of either may order otherwise."""
        batches = self.batch_sampler
        return (
            type(batches) is BatchSampler
            and type(batches.sampler) is SequentialSampler
            and self.even_batches
            and not self.drop_last
            and not batches.drop_last
            and world > 1
        )

    def __iter__(self) -> Iterator[Any]:
        # Lazy, like torch's BatchSampler (a generator): the shuffle seed is drawn at the first
        # batch, after the DataLoader iterator has drawn its own base seed, exactly as without
        # prepare. `_pass` runs then and hands over the pass's iterator, which the chain reads
        # from C: no frame of ours is resumed at each batch (a prepared loader's step cost,
        # bench/step_instructions.py).
        return itertools.chain.from_iterable(self._pass())

    def _pass(self) -> Iterator[Iterator[Any]]:
        """The pass's batches, as one iterator: `__iter__`."""
        self.seeds.start_pass()
        self.current = ShardPass()
        rank, world = self.state.process_index, self.state.num_processes
        options = {"even_batches": self.even_batches, "drop_last": self.drop_last}
        if self.split_batches:
            assert self.batch_size is not None
            batches = split_index_batches(
                self.batch_sampler,
                rank,
                world,
                batch_size=self.batch_size,
                record=self.current,
                **options,
            )
        elif self.batch_size is not None and self.size_of is len and self._sequential(world):
            batches = shard_range_batches(
                range(len(self.batch_sampler.sampler)),
                rank,
                world,
                batch_size=self.batch_size,
                record=self.current,
            )
        elif self.batch_size is not None and self.size_of is len:
            batches = shard_index_batches(
                self.batch_sampler,
                rank,
                world,
                batch_size=self.batch_size,
                record=self.current,
                **options,
            )
        else:  # a batch sampler of its own sizes: whole batches, the end evened out by repeats
            batches = shard_batches(
                self.batch_sampler,
                rank,
                world,
                size_of=self.size_of,
                record=self.current,
                **options,
            )
        skip, self.skip = self.skip, 0
        yield itertools.islice(batches, skip, None) if skip else batches


class PreparedDataLoader:
    """A DataLoader that yields this rank's batches on its device; len() is this rank's steps."""

    def __init__(
        self,
        loader: DataLoader,
        state: ProcessState,
        gradient_state: GradientState,
        *,
        device_placement: bool = True,
        config: DataLoaderConfiguration | None = None,
    ) -> None:
        config = config or DataLoaderConfiguration()
        self.base_dataloader = loader
        self.non_blocking = config.non_blocking
        self.state = state
        self.gradient_state = gradient_state
        self.device_placement = device_placement
        self.split_batches = config.split_batches
        self.dispatch_batches = bool(config.dispatch_batches) and state.distributed
        self.iteration = 0
        self.batches_yielded = 0
        self.at_last_batch = False
        self._even_batches = config.even_batches
        self._resume_skip = 0
        self._pass_finished = True  # no pass in progress
        self._stream_pass = ShardPass()
        self._sampler: _ShardedBatchSampler | None = None
        self._inner: DataLoader = loader
        if isinstance(loader.dataset, IterableDataset) or self.dispatch_batches:
            if self.split_batches and not self.dispatch_batches and state.distributed:
                raise NotImplementedError(
                    "split_batches=True over an IterableDataset needs dispatch_batches=True "
                    "(the main process reads each batch and sends every rank its slice)"
                )
            return
        automatic_batches = loader.batch_sampler is not None
        self._sampler = _ShardedBatchSampler(
            loader.batch_sampler if automatic_batches else loader.sampler,
            state,
            config.even_batches,
            drop_last=loader.drop_last,
            split_batches=self.split_batches,
            seedable_sampler=config.use_seedable_sampler,
            data_seed=config.data_seed,
            size_of=len if automatic_batches else _items_in,
        )
        self._inner = _rebuild(loader, self._sampler, automatic_batches)

    # --- what scripts read off a DataLoader -------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "base_dataloader":
            raise AttributeError(name)
        return getattr(self.base_dataloader, name)

    @property
    def batch_sampler(self) -> Any:
        """The sampler of this rank's batches (``.batch_sampler`` is the user's, HF's shape)."""
        return self._sampler if self._sampler is not None else self.base_dataloader.batch_sampler

    @property
    def map_style(self) -> bool:
        """Sharded by index batches on each rank (not a stream, not dispatched)."""
        return self._sampler is not None

    @property
    def even_batches(self) -> bool:
        return self._sampler.even_batches if self._sampler is not None else self._even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        if self._sampler is not None:
            self._sampler.even_batches = value
        self._even_batches = value

    def __len__(self) -> int:
        if self._sampler is not None:
            return len(self._sampler)
        batches = len(self.base_dataloader)
        if self.split_batches:
            return batches
        if self.dispatch_batches:  # every rank steps alike (dispatch.py)
            rounds, short = divmod(batches, self.state.num_processes)
            return rounds + int(short > 0 and not self.base_dataloader.drop_last)
        return sharded_length(
            batches,
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
        return self._stream_pass.padding

    def set_epoch(self, epoch: int) -> None:
        """The pass count becomes ``epoch`` and the user's batch sampler, its sampler (else the
        data set) learn it, as on HF's ``DataLoaderShard``: each pass sets it (``__iter__``), so a
        sampler of the user's seeded by seed + epoch (a bucket sampler) shuffles anew each epoch
        although its ``loader.sampler.set_epoch`` reaches the user's object, not this copy."""
        self.iteration = epoch
        batch_sampler = self._sampler.batch_sampler if self._sampler is not None else None
        sampler = getattr(batch_sampler, "sampler", None)
        if hasattr(batch_sampler, "set_epoch"):
            batch_sampler.set_epoch(epoch)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        elif hasattr(self.base_dataloader.dataset, "set_epoch"):
            self.base_dataloader.dataset.set_epoch(epoch)

    # --- iteration --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        # Not a generator itself: torch's iter(DataLoader) draws the iterator's base seed from
        # the global RNG at once, and zip(loader_a, loader_b) calls both iter()s before either
        # batch, so the inner pass starts here, where the unprepared one would (the sampler's
        # own seed stays drawn at the first batch, `_ShardedBatchSampler.__iter__`).
        skip, self._resume_skip = self._resume_skip, 0
        self.set_epoch(self.iteration)
        inner: Iterator[Any] | None = None
        if self._sampler is not None:
            self._sampler.skip = skip
            inner = self._start_inner_pass()
        return self._yield_pass(skip, inner)

    def _yield_pass(self, skip: int, inner: Iterator[Any] | None) -> Iterator[Any]:
        """This rank's batches of one pass, on its device: `__iter__`."""
        if self._sampler is not None:
            assert inner is not None
            expected = len(self._sampler) - skip
            stream = _count_to_end(inner, expected)
        elif self.dispatch_batches:
            self._stream_pass = ShardPass()
            stream = itertools.islice(
                dispatched(
                    self._inner,
                    self.state,
                    split_batches=self.split_batches,
                    drop_last=self.base_dataloader.drop_last,
                    record=self._stream_pass,
                ),
                skip,
                None,
            )
        else:
            self._stream_pass = ShardPass()
            batches = shard_batches(
                self._inner,
                self.state.process_index,
                self.state.num_processes,
                even_batches=self.even_batches,
                drop_last=self.base_dataloader.drop_last,
                size_of=lambda batch: first_dim(batch) or 1,
                record=self._stream_pass,
            )
            stream = _look_ahead(itertools.islice(batches, skip, None))
        self.iteration += 1
        self.batches_yielded = skip
        self.at_last_batch = False
        self._pass_finished = False
        self.gradient_state.active_loaders.append(self)
        # made once a pass, not at every batch: the device is the process's, set once
        place = placer(self.state.device, self.non_blocking)
        try:
            # the count kept by enumerate, in C, stored straight into the attribute
            for self.batches_yielded, (batch, is_last) in enumerate(stream, skip + 1):
                self.at_last_batch = self._pass_finished = is_last
                if self.device_placement:
                    batch = place(batch)
                yield batch
            self._pass_finished = True
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
        state = {
            "iteration": self.iteration,
            "batches_yielded": self.batches_yielded,
            "generator_state": seeds.pass_start_state if seeds is not None else None,
            "pass_finished": self._pass_finished,
        }
        if seeds is not None and seeds.pass_start_epoch is not None:
            state["sampler_epoch"] = seeds.pass_start_epoch
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next pass resume the interrupted one: same order, the seen batches skipped."""
        self.iteration = int(state["iteration"])
        yielded = int(state["batches_yielded"])
        finished = state.get("pass_finished")
        if finished is None:  # written by accelify 0.2 (map-style loaders only)
            finished = yielded >= len(self)
        if finished or self.iteration == 0:
            return
        self.iteration -= 1
        self._resume_skip = yielded
        if self._sampler is not None and state["generator_state"] is not None:
            self._sampler.seeds.restore_state = state["generator_state"]
        if self._sampler is not None and state.get("sampler_epoch") is not None:
            self._sampler.seeds.restore_epoch = int(state["sampler_epoch"])

    def skip_first_batches(self, num_batches: int) -> PreparedDataLoader:
        """This loader, its next pass starting ``num_batches`` in (replaces a restored position)."""
        self._resume_skip = num_batches
        return self


def _rebuild(
    loader: DataLoader, sharded: _ShardedBatchSampler, automatic_batches: bool
) -> DataLoader:
    """The user's DataLoader on this rank's share: batches of indices, or (``batch_size=None``)
    the sampler's items, each handed to the dataset whole, as the user's loader does."""
    kwargs = {name: getattr(loader, name) for name in _LOADER_ARGS}
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    else:
        kwargs["persistent_workers"] = False
    if automatic_batches:
        return DataLoader(loader.dataset, batch_sampler=sharded, **kwargs)
    return DataLoader(loader.dataset, sampler=sharded, batch_size=None, **kwargs)


def _items_in(item: Any) -> int:
    """Samples in one sampler item: a list of indices, or one index."""
    return len(item) if isinstance(item, (list, tuple)) else 1


def _count_to_end(batches: Iterator[Any], expected: int) -> Iterator[tuple[Any, bool]]:
    """Mark the last batch by count, not by reading ahead: reading ahead would move a dataset's
    random transforms before the training step that precedes them, changing the RNG stream.
    The ``expected``-th batch is the last; iterators of C, no generator's frame resumed per
    batch (the prepared loader's layers cost a small model's step more than DDP's own Python)."""
    if expected < 1:
        return zip(batches, itertools.repeat(False), strict=False)
    marks = itertools.chain(itertools.repeat(False, expected - 1), (True,), itertools.repeat(False))
    return zip(batches, marks, strict=False)


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
