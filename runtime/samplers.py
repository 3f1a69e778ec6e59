"""`SeedableRandomSampler`, HF Accelerate's shuffle that a seed and an epoch fully decide.

``DataLoaderConfiguration(use_seedable_sampler=True)`` puts it in place of a DataLoader's
`RandomSampler` at prepare: pass ``e`` shuffles with seed ``initial_seed + e`` (``initial_seed``
is ``data_seed``, or torch's initial seed: the one `set_seed` sets), so ``set_epoch(e)`` replays
a pass exactly, whatever ran before it. The epoch moves on by itself at the end of each pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import RandomSampler


class SeedableRandomSampler(RandomSampler):
    def __init__(self, *args: Any, data_seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initial_seed = data_seed if data_seed is not None else torch.random.initial_seed()
        self.epoch = 0

    def __iter__(self) -> Iterator[int]:
        if self.generator is None:
            self.generator = torch.Generator()
        self.generator.manual_seed(self.initial_seed + self.epoch)
        yield from super().__iter__()
        self.set_epoch(self.epoch + 1)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


def seedable(sampler: RandomSampler, data_seed: int | None) -> SeedableRandomSampler:
    """The same shuffle settings, seeded by seed and epoch."""
    return SeedableRandomSampler(
        sampler.data_source,
        replacement=sampler.replacement,
        num_samples=sampler._num_samples,
        generator=sampler.generator,
        data_seed=data_seed,
    )
