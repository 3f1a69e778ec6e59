"""Engines that wrap a prepared model; each is one module behind `Backend`, chosen once.

DeepSpeed is imported only when ``--backend deepspeed`` is used (it is an optional extra).
"""

from __future__ import annotations

import os
from typing import Any

from accelify.runtime import backend_options
from accelify.runtime.backends.base import Backend
from accelify.runtime.gradient_state import GradientState
from accelify.runtime.state import ProcessState


def create_backend(
    name: str,
    state: ProcessState,
    mixed_precision: str = "no",
    options_json: str = "",
    gradient_state: GradientState | None = None,
    ddp_kwargs: dict[str, Any] | None = None,
) -> Backend:
    """``ddp_kwargs``: the script's `DistributedDataParallelKwargs` (DDP only, as in HF)."""
    options = backend_options.from_env(name, options_json)
    if name == "ddp":
        from accelify.runtime.backends.ddp import DDPBackend

        return DDPBackend(state, mixed_precision, **(ddp_kwargs or {}))
    if name == "fsdp":
        from accelify.runtime.backends.fsdp import FSDPBackend

        return FSDPBackend(state, mixed_precision, options)  # type: ignore[arg-type]
    if name == "deepspeed":
        if state.device.type == "cpu":
            # DeepSpeed would probe for GPUs and print a warning on stdout before choosing the
            # CPU; this run is on the CPU by decision, so say so.
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        from accelify.runtime.backends.deepspeed import DeepSpeedBackend

        return DeepSpeedBackend(state, mixed_precision, options, gradient_state)  # type: ignore[arg-type]
    raise ValueError(f"unknown backend {name!r}: expected ddp, fsdp or deepspeed")


__all__ = ["Backend", "create_backend"]
