"""Where this process stands and what depends only on that: rank, world, device, barriers,
main-process-first blocks, per-rank decorators, splitting inputs. `PartialState` is HF
Accelerate's name for it without an Accelerator; `Accelerator` has the same members.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from accelify.runtime import pending_work
from accelify.runtime.environment import LaunchSettings
from accelify.runtime.kwargs_handlers import DistributedType, distributed_type_of
from accelify.runtime.state import ProcessState, shared_state


class ProcessMethods:
    """Mixed into `Accelerator` and `PartialState`; reads ``self.state``."""

    state: ProcessState
    backend_name: str  # the engine chosen at launch: ddp, fsdp or deepspeed

    @property
    def distributed_type(self) -> DistributedType:
        return distributed_type_of(self.backend_name, self.num_processes, self.device.type)

    @property
    def device(self) -> torch.device:
        return self.state.device

    @property
    def process_index(self) -> int:
        return self.state.process_index

    @property
    def local_process_index(self) -> int:
        return self.state.local_process_index

    @property
    def num_processes(self) -> int:
        return self.state.num_processes

    @property
    def is_main_process(self) -> bool:
        return self.state.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self.state.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

    @property
    def use_distributed(self) -> bool:
        return self.state.distributed

    @pending_work.tracks
    def wait_for_everyone(self) -> None:
        if self.state.distributed:
            dist.barrier()

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """The main process runs the block first (downloads, caches); the others follow."""
        with self._first(self.is_main_process):
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        with self._first(self.is_local_main_process):
            yield

    @contextlib.contextmanager
    def _first(self, leads: bool) -> Iterator[None]:
        if not leads:
            self.wait_for_everyone()
        yield
        if leads:
            self.wait_for_everyone()

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """This rank's contiguous share of a list, tuple, dict of lists or tensor."""
        yield _split(inputs, self.process_index, self.num_processes, apply_padding)

    def print(self, *args: Any, **kwargs: Any) -> None:
        if self.is_local_main_process:
            print(*args, **kwargs)

    def on_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return _only_where(function, lambda: self.is_main_process)

    def on_local_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return _only_where(function, lambda: self.is_local_main_process)

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return _only_where(function, lambda: self.is_last_process)

    def on_process(
        self, function: Callable[..., Any] | None = None, process_index: int | None = None
    ) -> Any:
        """``@accelerator.on_process(process_index=1)``: run on that rank only."""
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        if process_index is None:
            raise ValueError("on_process needs a process_index")
        return _only_where(function, lambda: self.process_index == process_index)

    def on_local_process(
        self, function: Callable[..., Any] | None = None, local_process_index: int | None = None
    ) -> Any:
        """``@accelerator.on_local_process(local_process_index=0)``: that rank of each node."""
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        if local_process_index is None:
            raise ValueError("on_local_process needs a local_process_index")
        return _only_where(function, lambda: self.local_process_index == local_process_index)


class PartialState(ProcessMethods):
    """This process's place in the run, shared with any `Accelerator` (the process group is
    started once). Scripts and libraries read it where no Accelerator is at hand."""

    def __init__(self, cpu: bool = False, **kwargs: Any) -> None:
        unknown = set(kwargs) - {"backend", "timeout"}
        if unknown:
            raise TypeError(f"PartialState() got unexpected arguments {sorted(unknown)}")
        settings = LaunchSettings.from_env()
        self.state = shared_state(cpu=cpu or settings.use_cpu)
        self.backend_name = settings.backend

    def destroy_process_group(self) -> None:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _only_where(function: Callable[..., Any], here: Callable[[], bool]) -> Callable[..., Any]:
    """``function``, run only where ``here()`` holds (None elsewhere)."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs) if here() else None

    return run


def _split(inputs: Any, rank: int, world: int, apply_padding: bool) -> Any:
    if isinstance(inputs, dict):
        return {key: _split(value, rank, world, apply_padding) for key, value in inputs.items()}
    length = len(inputs)
    per_rank, extra = divmod(length, world)
    start = rank * per_rank + min(rank, extra)
    end = start + per_rank + (1 if rank < extra else 0)
    share = inputs[start:end]
    if apply_padding and extra and rank >= extra and length:
        last = inputs[-1:]
        share = torch.cat([share, last]) if isinstance(inputs, torch.Tensor) else share + last
    return share
