"""HF Accelerate's ``accelerate.tracking`` names: the tracker base class for custom trackers and
the trackers accelify drives (see `accelify.runtime.tracking`)."""

from accelify.runtime.tracking import GeneralTracker, LoggerType, TensorBoardTracker, WandBTracker

__all__ = ["GeneralTracker", "LoggerType", "TensorBoardTracker", "WandBTracker"]
