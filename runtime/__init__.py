"""The run side of accelify: `Accelerator`, `set_seed`, and the launcher's counterpart.

Names are resolved on first use (PEP 562) so that importing a torch-free module of this package,
such as `accelify.runtime.config`, does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accelify.runtime.accelerator import Accelerator
    from accelify.runtime.rng import set_seed

_LAZY = {
    "Accelerator": "accelify.runtime.accelerator",
    "set_seed": "accelify.runtime.rng",
}

__all__ = ["Accelerator", "set_seed"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'accelify.runtime' has no attribute {name!r}")
