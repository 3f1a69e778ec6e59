"""The run side of accelify: `Accelerator`, `set_seed`, and the launcher's counterpart.

Names are resolved on first use (PEP 562) so that importing a torch-free module of this package,
such as `accelify.runtime.launch.config`, does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accelify.runtime.accelerator import Accelerator
    from accelify.runtime.partial_state import AcceleratorState, PartialState
    from accelify.runtime.rng import set_seed, synchronize_rng_states

_LAZY = {
    "Accelerator": "accelify.runtime.accelerator",
    "PartialState": "accelify.runtime.partial_state",
    "AcceleratorState": "accelify.runtime.partial_state",
    "set_seed": "accelify.runtime.rng",
    "synchronize_rng_states": "accelify.runtime.rng",
}

__all__ = ["Accelerator", "AcceleratorState", "PartialState", "set_seed", "synchronize_rng_states"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        try:
            module = importlib.import_module(_LAZY[name])
        except ModuleNotFoundError as error:
            from accelify.requirements import RUNTIME_MODULES, runtime_import_error

            if error.name not in RUNTIME_MODULES:
                raise
            raise runtime_import_error(error) from None
        return getattr(module, name)
    raise AttributeError(f"module 'accelify.runtime' has no attribute {name!r}")
