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

from accelify.runtime import collective_record, pending_work
from accelify.runtime.environment import LaunchSettings
from accelify.runtime.kwargs_handlers import DistributedType
from accelify.runtime.state import ProcessState, destroy_process_groups, shared_state


class ProcessMethods:
    """Mixed into `Accelerator`, `PartialState` and `AcceleratorState`; reads ``self.process``,
    the one `ProcessState` of this process."""

    process: ProcessState

    @property
    def distributed_type(self) -> DistributedType:
        return self.process.distributed_type

    @distributed_type.setter
    def distributed_type(self, kind: DistributedType) -> None:
        self.process.distributed_type = kind

    @property
    def debug(self) -> bool:
        return self.process.debug

    @debug.setter
    def debug(self, on: bool) -> None:
        self.process.debug = on

    @property
    def device(self) -> torch.device:
        return self.process.device

    @property
    def process_index(self) -> int:
        return self.process.process_index

    @property
    def local_process_index(self) -> int:
        return self.process.local_process_index

    @property
    def num_processes(self) -> int:
        return self.process.num_processes

    @property
    def is_main_process(self) -> bool:
        return self.process.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self.process.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

    @property
    def use_distributed(self) -> bool:
        return self.process.distributed

    @collective_record.collective("wait_for_everyone")
    @pending_work.tracks
    def wait_for_everyone(self) -> None:
        if self.process.distributed:
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
        """This rank's contiguous share of a list, tuple, dict of lists, tensor or
        ``datasets.Dataset`` (its rows); ``apply_padding`` repeats the last item on the ranks
        that get one fewer, so every rank holds as many."""
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
            raise TypeError(f"{type(self).__name__}() got unexpected arguments {sorted(unknown)}")
        settings = LaunchSettings.from_env()
        self.process = shared_state(cpu=cpu or settings.use_cpu)

    @property
    def backend(self) -> str | None:
        """The process group's backend (gloo, nccl), None on one process: HF's meaning."""
        return self.process.backend

    def destroy_process_group(self, group: Any = None) -> None:
        if dist.is_available() and dist.is_initialized():
            if group is None:
                destroy_process_groups()  # their handles are let go of at exit
            else:
                dist.destroy_process_group(group)

    def __repr__(self) -> str:
        backend = f"  Backend: {self.backend}" if self.backend else ""
        return (
            f"Distributed environment: {self.distributed_type}{backend}\n"
            f"Num processes: {self.num_processes}\n"
            f"Process index: {self.process_index}\n"
            f"Local process index: {self.local_process_index}\n"
            f"Device: {self.device}\n"
        )


class AcceleratorState(PartialState):
    """HF Accelerate's `AcceleratorState`: the process's place plus the Accelerator-level
    settings scripts read (``accelerator.state.mixed_precision``), one per process.

    `_reset_state()` is HF's way to build an Accelerator with other settings in the same process;
    an Accelerator from before the reset refuses to prepare anything, with HF's message, rather
    than run on settings that no longer hold.
    """

    _generation = 0

    def __init__(self, cpu: bool = False, **kwargs: Any) -> None:
        super().__init__(cpu=cpu, **kwargs)
        self.generation = AcceleratorState._generation

    @property
    def mixed_precision(self) -> str:
        return self.process.mixed_precision

    @property
    def use_fp16(self) -> bool:
        return self.mixed_precision == "fp16"

    @classmethod
    def _reset_state(cls, reset_partial_state: bool = False) -> None:
        cls._generation += 1

    def check_current(self) -> None:
        if self.generation != AcceleratorState._generation:
            raise AttributeError(
                "`AcceleratorState` object has no attribute `distributed_type`. This happens if "
                "`AcceleratorState._reset_state()` was called and an `Accelerator` or "
                "`PartialState` was not reinitialized."
            )

    def __repr__(self) -> str:
        return f"{super().__repr__()}Mixed precision type: {self.mixed_precision}\n"


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
    pad = bool(apply_padding and extra and rank >= extra and length)  # one fewer here: repeat
    if _is_hf_dataset(inputs):  # rows, not the columns its slicing returns
        return inputs.select([*range(start, end), *([length - 1] if pad else [])])
    share = inputs[start:end]
    if pad:
        last = inputs[-1:]
        share = torch.cat([share, last]) if isinstance(inputs, torch.Tensor) else share + last
    return share


def _is_hf_dataset(inputs: Any) -> bool:
    """A Hugging Face ``datasets.Dataset`` (checked without importing datasets)."""
    return type(inputs).__module__.startswith("datasets.") and hasattr(inputs, "select")
