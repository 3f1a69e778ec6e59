"""State shared by the Accelerator and what it prepared: accumulation and the active loader.

One explicit object, handed to each prepared optimizer, scheduler and DataLoader, instead of a
global singleton: several Accelerators in one process (tests do this) never see each other's state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class GradientState:
    accumulation_steps: int = 1
    sync_gradients: bool = True
    step: int = 0
    sync_each_batch: bool = False  # reduce in every backward, though the step waits
    active_loaders: list[Any] = field(default_factory=list)

    @property
    def active_loader(self) -> Any | None:
        return self.active_loaders[-1] if self.active_loaders else None

    @property
    def active_dataloader(self) -> Any | None:
        """HF's name: the prepared DataLoader being iterated (the innermost), or None."""
        return self.active_loader

    @property
    def in_dataloader(self) -> bool:
        return bool(self.active_loaders)

    @property
    def num_steps(self) -> int:
        return self.accumulation_steps

    @property
    def remainder(self) -> int:
        """Samples the last batch repeated to even out the ranks (-1 before the last batch)."""
        loader = self.active_loader
        if loader is None or not loader.at_last_batch:
            return -1
        return loader.padding

    @classmethod
    def _reset_state(cls) -> None:
        """HF resets its process-wide singleton between Accelerators; each accelify Accelerator
        has its own GradientState, so there is nothing to reset."""

    @property
    def end_of_dataloader(self) -> bool:
        loader = self.active_loader
        return bool(loader is not None and loader.at_last_batch)

    def advance(self) -> None:
        """One `accumulate()` step: sync every `accumulation_steps`, and at a loader's end."""
        if self.end_of_dataloader:
            self.step = 0
            self.sync_gradients = True
            return
        self.step += 1
        self.sync_gradients = self.step % self.accumulation_steps == 0
