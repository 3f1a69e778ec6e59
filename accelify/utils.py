"""HF Accelerate's ``accelerate.utils`` names that scripts import, at ``accelify.utils``.

The configuration classes are plain dataclasses (no torch); the functions that need torch are
resolved on first use (PEP 562), so ``import accelify.utils`` stays as light as the rest of the
static side.
"""

from __future__ import annotations

from typing import Any

from accelify.runtime.availability import PROBES
from accelify.runtime.kwargs_handlers import (
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    DistributedType,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
)
from accelify.runtime.memory import find_executable_batch_size
from accelify.runtime.plugins import DataLoaderConfiguration, GradientAccumulationPlugin
from accelify.runtime.project import ProjectConfiguration
from accelify.runtime.tracking import LoggerType

_LAZY = {
    "set_seed": "accelify.runtime.rng",
    "synchronize_rng_states": "accelify.runtime.rng",
    "gather": "accelify.runtime.operations",
    "gather_object": "accelify.runtime.operations",
    "reduce": "accelify.runtime.operations",
    "broadcast": "accelify.runtime.operations",
    "pad_across_processes": "accelify.runtime.operations",
    "send_to_device": "accelify.runtime.operations",
    "broadcast_object_list": "accelify.runtime.operations",
    "copy_tensor_to_devices": "accelify.runtime.operations",
    "DistributedOperationException": "accelify.runtime.operations",
    **dict.fromkeys(PROBES, "accelify.runtime.availability"),
}

__all__ = [
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "LoggerType",
    "ProjectConfiguration",
    "find_executable_batch_size",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'accelify.utils' has no attribute {name!r}")
