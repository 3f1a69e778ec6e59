"""The prepared LR scheduler: it moves only when its optimizer really stepped.

With ``step_with_optimizer`` (Accelerate's ``step_scheduler_with_optimizer``, on by default) a call
is skipped on accumulation steps and on fp16 steps the scaler skipped, and otherwise steps the
schedule once per rank: a schedule sized in one-process steps (``len(loader) * epochs`` measured
before `prepare`) then ends on time when each rank sees 1/N of the batches, exactly as on
Hugging Face Accelerate. Per-epoch schedules are prepared with ``step_with_optimizer=False``.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import warnings
from collections.abc import Iterator
from types import FrameType
from typing import Any

import torch

from accelify.runtime.gradient_state import GradientState
from accelify.runtime.optimizer import PreparedOptimizer


class PreparedScheduler:
    def __init__(
        self,
        scheduler: Any,
        optimizers: list[PreparedOptimizer],
        gradient_state: GradientState,
        num_processes: int,
        step_with_optimizer: bool = True,
        split_batches: bool = False,
    ) -> None:
        self.scheduler = scheduler
        self.optimizers = optimizers
        self.gradient_state = gradient_state
        self.num_processes = num_processes
        self.step_with_optimizer = step_with_optimizer
        self.split_batches = split_batches

    def step(self, *args: Any, **kwargs: Any) -> None:
        # torch's schedulers warn on their first step (stepped before the optimizer) and when
        # handed an epoch; only those calls pay for re-pointing the warnings (a few µs)
        if args or kwargs or getattr(self.scheduler, "_step_count", 0) <= 1:
            with _warnings_at(sys._getframe(1)):
                self._step(*args, **kwargs)
        else:
            self._step()

    def _step(self, *args: Any, **kwargs: Any) -> None:
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            return
        if any(opt.step_was_skipped for opt in self.optimizers):
            return
        repeats = 1 if self.split_batches else self.num_processes
        for _ in range(repeats):
            total = getattr(self.scheduler, "total_steps", None)
            # OneCycleLR refuses to step past its end; rounding up the last round can ask for it.
            if total is not None and self.scheduler.last_epoch + 1 > total:
                break
            self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def get_lr(self) -> Any:
        return self.scheduler.get_lr()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "scheduler":
            raise AttributeError(name)
        return getattr(self.scheduler, name)


#: Where warnings re-issued at their own place (inside torch) were already shown once.
_SHOWN: dict[Any, Any] = {}


@contextlib.contextmanager
def _warnings_at(caller: FrameType) -> Iterator[None]:
    """torch's scheduler warns at the caller of its ``step()`` ("Detected call of
    `lr_scheduler.step()` before `optimizer.step()`", stacklevel 2), which is this wrapper: its
    warnings are re-issued at the script's line that stepped the prepared scheduler, where the
    plain scheduler shows them, under the script's own filters."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for warning in caught:
        if warning.filename == __file__:
            warnings.warn_explicit(
                warning.message,
                warning.category,
                caller.f_code.co_filename,
                caller.f_lineno,
                module=caller.f_globals.get("__name__"),
                registry=caller.f_globals.setdefault("__warningregistry__", {}),
            )
        else:
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno, registry=_SHOWN
            )


def repoint_scheduler(scheduler: Any, optimizer: torch.optim.Optimizer) -> None:
    """Point an LR scheduler at the optimizer an engine rebuilt (FSDP), which carries the old
    one's param_groups settings (``lr``, ``initial_lr``). torch's scheduler tracks whether the
    optimizer stepped through a wrapper on ``optimizer.step``; the new optimizer gets the same
    wrapper, or every scheduler step would warn that it ran before the optimizer's."""
    scheduler.optimizer = optimizer
    step = optimizer.step
    if hasattr(step, "_wrapped_by_lr_sched"):
        return

    @functools.wraps(step)
    def tracked(*args: Any, **kwargs: Any) -> Any:
        optimizer._opt_called = True  # type: ignore[attr-defined]
        return step(*args, **kwargs)

    tracked._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    optimizer.step = tracked  # type: ignore[method-assign]
