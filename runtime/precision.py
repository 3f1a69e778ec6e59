"""Mixed precision: which dtype the forward runs in, and the gradient scaler fp16 needs.

A precision the device cannot honour is an error, not a silent fp32 run: fp16 autocast on a CPU
would either fail deep inside a kernel or (as Accelerate does) quietly train in fp32.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from accelify.runtime.operations import apply_to_tensors

CHOICES = ("no", "bf16", "fp16")


class PrecisionError(ValueError):
    pass


class Precision:
    def __init__(self, mode: str, device: torch.device) -> None:
        if mode not in CHOICES:
            raise PrecisionError(f"mixed_precision must be one of {CHOICES}, got {mode!r}")
        if mode == "fp16" and device.type == "cpu":
            raise PrecisionError(
                "mixed_precision='fp16' needs a CUDA device; this process runs on the CPU. "
                "Use mixed_precision='bf16' on CPU, or 'no'."
            )
        if mode == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise PrecisionError("mixed_precision='bf16' is not supported by this GPU; use 'fp16'")
        self.mode = mode
        self.device = device

    @property
    def dtype(self) -> torch.dtype | None:
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.mode)

    def make_scaler(self, options: dict[str, Any] | None = None) -> torch.amp.GradScaler | None:
        """``options``: the script's `GradScalerKwargs`."""
        if self.mode != "fp16":
            return None
        return torch.amp.GradScaler(self.device.type, **(options or {}))

    @contextlib.contextmanager
    def autocast(self, enabled: bool = True) -> Iterator[None]:
        if self.dtype is None or not enabled:
            yield
            return
        with torch.autocast(device_type=self.device.type, dtype=self.dtype):
            yield

    def wrap_forward(self, model: torch.nn.Module) -> None:
        """Run ``model.forward`` under autocast and hand fp32 outputs back, like Accelerate."""
        if self.dtype is None or hasattr(model, "_accelify_original_forward"):
            return
        original = model.forward
        model._accelify_original_forward = original  # type: ignore[attr-defined]
        model.forward = _autocast_forward(original, self)  # type: ignore[method-assign]


def _autocast_forward(forward: Callable[..., Any], precision: Precision) -> Callable[..., Any]:
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        with precision.autocast():
            outputs = forward(*args, **kwargs)
        return apply_to_tensors(_to_fp32, outputs)

    return run


def _to_fp32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


def restore_forward(model: torch.nn.Module) -> None:
    original = model.__dict__.pop("_accelify_original_forward", None)
    if original is not None:
        model.forward = original  # type: ignore[method-assign]
