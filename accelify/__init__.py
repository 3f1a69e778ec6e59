"""accelify: make a single-device PyTorch training script distributed, and keep it correct.

``from accelify import Accelerator`` is what converted scripts import. It is resolved lazily
(PEP 562) so that ``accelify lint`` and ``accelify --help`` start without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from accelify.runtime.accelerator import Accelerator
    from accelify.runtime.rng import set_seed

__all__ = ["Accelerator", "__version__", "set_seed"]


def __getattr__(name: str) -> Any:
    if name in ("Accelerator", "set_seed"):
        from accelify import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'accelify' has no attribute {name!r}")
