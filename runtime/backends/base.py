"""What the Accelerator asks of an engine; everything engine-specific stays behind this."""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

import torch


class Backend(Protocol):
    name: str

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Place the model on the device and wrap it for this engine."""

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The user's module inside whatever `wrap_model` returned."""

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Skip the gradient all-reduce for the backward passes inside."""

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float) -> torch.Tensor:
        """Clip over every rank's gradients; returns the total norm before clipping."""

    def model_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """A full, unwrapped state dict (keys as in the user's module)."""
