"""HF Accelerate's free functions over DataLoaders: `prepare_data_loader` (what
`Accelerator.prepare` does to a DataLoader, without an Accelerator) and `skip_first_batches`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from accelify.runtime.data import PreparedDataLoader
from accelify.runtime.gradient_state import GradientState
from accelify.runtime.plugins import DataLoaderConfiguration
from accelify.runtime.state import shared_state


def prepare_data_loader(
    dataloader: DataLoader,
    device: torch.device | str | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: list[Any] | None = None,  # shuffles agree across ranks whatever it says
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Any = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: Any = None,
) -> PreparedDataLoader:
    """This rank's share of ``dataloader``, for the ranks of this run.

    accelify shards for the run's own process group, so ``num_processes`` and ``process_index``
    must be this process's (HF lets a test shard for ranks that do not exist).
    """
    if slice_fn_for_dispatch is not None or torch_device_mesh is not None:
        raise NotImplementedError(
            "slice_fn_for_dispatch and torch_device_mesh are not supported by accelify"
        )
    state = shared_state(cpu=device is not None and torch.device(device).type == "cpu")
    for given, actual, name in (
        (num_processes, state.num_processes, "num_processes"),
        (process_index, state.process_index, "process_index"),
    ):
        if given is not None and given != actual:
            raise ValueError(
                f"prepare_data_loader({name}={given}): this process is {name}={actual}; "
                "accelify shards only for the ranks of the running process group"
            )
    config = DataLoaderConfiguration(
        split_batches=split_batches,
        dispatch_batches=dispatch_batches,
        even_batches=even_batches,
        use_seedable_sampler=use_seedable_sampler,
        data_seed=data_seed,
        non_blocking=non_blocking,
        use_stateful_dataloader=use_stateful_dataloader,
    )
    config.check()
    return PreparedDataLoader(
        dataloader, state, GradientState(), device_placement=put_on_device, config=config
    )


def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
    """The loader, its next pass starting ``num_batches`` batches in (resuming mid-epoch)."""
    if isinstance(dataloader, PreparedDataLoader):
        return dataloader.skip_first_batches(num_batches)
    return _SkippingLoader(dataloader, num_batches)


class _SkippingLoader:
    def __init__(self, loader: Any, num_batches: int) -> None:
        self.loader = loader
        self.num_batches = num_batches

    def __iter__(self) -> Iterator[Any]:
        for index, batch in enumerate(self.loader):
            if index >= self.num_batches:
                yield batch

    def __len__(self) -> int:
        return max(len(self.loader) - self.num_batches, 0)
