"""Engines that wrap a prepared model; each is one module behind `Backend`, chosen once from
`BACKENDS`. A backend's module is imported only when it is chosen (DeepSpeed is an optional
extra), and what an engine needs at exit is its own `Backend.at_exit`.
"""

from __future__ import annotations

import importlib
from typing import Any

from accelify.runtime import options as backend_options
from accelify.runtime.backends.base import Backend, BackendInputs
from accelify.runtime.gradient_state import GradientState
from accelify.runtime.state import ProcessState, on_exit

#: ``--backend`` name -> "module:class" of its engine
BACKENDS = {
    "ddp": "accelify.runtime.backends.ddp:DDPBackend",
    "fsdp": "accelify.runtime.backends.fsdp:FSDPBackend",
    "deepspeed": "accelify.runtime.backends.deepspeed:DeepSpeedBackend",
}


def create_backend(
    name: str,
    state: ProcessState,
    mixed_precision: str = "no",
    options_json: str = "",
    gradient_state: GradientState | None = None,
    ddp_kwargs: dict[str, Any] | None = None,
) -> Backend:
    """``ddp_kwargs``: the script's `DistributedDataParallelKwargs` (DDP only, as in HF)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}: expected {', '.join(BACKENDS)}")
    options = backend_options.from_env(name, options_json)
    module, _, class_name = BACKENDS[name].partition(":")
    engine: type[Backend] = getattr(importlib.import_module(module), class_name)
    backend = engine.create(
        BackendInputs(
            state, mixed_precision, options, gradient_state or GradientState(), ddp_kwargs or {}
        )
    )
    on_exit(engine.at_exit)
    return backend


__all__ = ["BACKENDS", "Backend", "create_backend"]
