"""The Accelerator's option groups with HF Accelerate's names: `DataLoaderConfiguration` and
`GradientAccumulationPlugin`. Torch-free dataclasses; an option accelify's runtime does not
implement is refused when the Accelerator is built, never silently ignored."""

from __future__ import annotations

import warnings
from dataclasses import dataclass


@dataclass
class DataLoaderConfiguration:
    """How prepared DataLoaders shard (see `accelify.runtime.data`): whole batches per rank, or
    each batch split across the ranks (``split_batches``); read by every rank, or by the main
    process and sent (``dispatch_batches``); shuffled by seed and epoch
    (``use_seedable_sampler``, ``data_seed``)."""

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False  # prepared loaders save their position either way

    def check(self) -> None:
        if self.data_seed is not None and not self.use_seedable_sampler:
            warnings.warn(
                "data_seed has no effect without use_seedable_sampler=True (it seeds that sampler)",
                stacklevel=3,
            )


@dataclass
class GradientAccumulationPlugin:
    num_steps: int | None = None
    adjust_scheduler: bool = True  # accelify steps schedulers only when the optimizer stepped
    sync_with_dataloader: bool = True  # and syncs at the end of a pass
    sync_each_batch: bool = False  # reduce every micro-batch (less memory), step every num_steps

    def steps(self) -> int:
        if self.num_steps is None or self.num_steps < 1:
            raise ValueError(
                f"GradientAccumulationPlugin needs num_steps >= 1, got {self.num_steps}"
            )
        for option, wanted in (
            ("adjust_scheduler", True),
            ("sync_with_dataloader", True),
        ):
            if getattr(self, option) != wanted:
                raise NotImplementedError(
                    f"GradientAccumulationPlugin({option}={not wanted}) is not supported: "
                    f"accelify's accumulation always runs with {option}={wanted}"
                )
        return self.num_steps
