"""HF Accelerate's ``accelerate.state`` names at ``accelify.state`` (imports torch)."""

from accelify.runtime.gradient_state import GradientState
from accelify.runtime.partial_state import AcceleratorState, PartialState

__all__ = ["AcceleratorState", "GradientState", "PartialState"]
