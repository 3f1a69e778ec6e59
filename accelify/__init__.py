"""accelify: make a single-device PyTorch training script distributed, and keep it correct.

``from accelify import Accelerator`` is what converted scripts import. It is resolved lazily
(PEP 562) so that ``accelify lint`` and ``accelify --help`` start without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.3.0"

if TYPE_CHECKING:
    from accelify.runtime.accelerator import Accelerator
    from accelify.runtime.kwargs_handlers import (
        DDPCommunicationHookType,
        DistributedDataParallelKwargs,
        DistributedType,
        GradScalerKwargs,
        InitProcessGroupKwargs,
    )
    from accelify.runtime.memory import find_executable_batch_size
    from accelify.runtime.partial_state import AcceleratorState, PartialState
    from accelify.runtime.plugins import DataLoaderConfiguration, GradientAccumulationPlugin
    from accelify.runtime.project import ProjectConfiguration
    from accelify.runtime.rng import set_seed, synchronize_rng_states

#: Configuration names HF Accelerate exports at its top level too (torch-free, from accelify.utils)
_CONFIGURATION = (
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "ProjectConfiguration",
    "find_executable_batch_size",
)
_RUNTIME = ("Accelerator", "AcceleratorState", "PartialState", "set_seed", "synchronize_rng_states")

__all__ = [
    "Accelerator",
    "AcceleratorState",
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "PartialState",
    "ProjectConfiguration",
    "__version__",
    "find_executable_batch_size",
    "set_seed",
    "synchronize_rng_states",
]


def __getattr__(name: str) -> Any:
    if name in _CONFIGURATION:
        from accelify import utils

        return getattr(utils, name)
    if name in _RUNTIME:
        try:
            from accelify import runtime
        except ImportError as error:
            raise _explain(error) from None
        return getattr(runtime, name)
    raise AttributeError(f"module 'accelify' has no attribute {name!r}")


def _explain(error: ImportError) -> ImportError:
    """In a source checkout `runtime/` sits beside this folder and is mapped into the package at
    install; a script run from the checkout's root imports this folder instead of the installed
    package (its directory comes first on sys.path), and finds no runtime in it."""
    from pathlib import Path

    here = Path(__file__).resolve().parent
    if (here / "runtime").is_dir() or not (here.parent / "runtime" / "accelerator.py").is_file():
        return error
    return ImportError(
        f"{here} is accelify's source folder, imported instead of the installed package because "
        "the script runs from the checkout's root: install the checkout with `pip install -e .` "
        "(its runtime/ folder is then found), or run the script from another directory"
    )
