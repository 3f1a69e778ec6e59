"""The Accelerator's option groups with HF Accelerate's names: `DataLoaderConfiguration` and
`GradientAccumulationPlugin`. Torch-free dataclasses; an option accelify's runtime does not
implement is refused when the Accelerator is built, never silently ignored."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DataLoaderConfiguration:
    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False  # accelify's samplers are seeded per pass either way
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False  # prepared loaders save their position either way

    def check(self) -> None:
        if self.split_batches:
            raise NotImplementedError(
                "split_batches=True is not supported: each rank reads whole batches of the "
                "DataLoader's batch_size"
            )
        if self.dispatch_batches:
            raise NotImplementedError(
                "dispatch_batches=True is not supported: every rank reads its own batches"
            )
        if self.data_seed is not None:
            raise NotImplementedError(
                "data_seed is not supported: the shuffle seed comes from the global RNG, as in "
                "an unprepared DataLoader (seed it with set_seed)"
            )


@dataclass
class GradientAccumulationPlugin:
    num_steps: int | None = None
    adjust_scheduler: bool = True  # accelify steps schedulers only when the optimizer stepped
    sync_with_dataloader: bool = True  # and syncs at the end of a pass
    sync_each_batch: bool = False

    def steps(self) -> int:
        if self.num_steps is None or self.num_steps < 1:
            raise ValueError(
                f"GradientAccumulationPlugin needs num_steps >= 1, got {self.num_steps}"
            )
        for option, wanted in (
            ("adjust_scheduler", True),
            ("sync_with_dataloader", True),
            ("sync_each_batch", False),
        ):
            if getattr(self, option) != wanted:
                raise NotImplementedError(
                    f"GradientAccumulationPlugin({option}={not wanted}) is not supported: "
                    f"accelify's accumulation always runs with {option}={wanted}"
                )
        return self.num_steps
