"""HF Accelerate's ``accelerate.data_loader`` names at ``accelify.data_loader`` (imports torch)."""

from accelify.runtime.data import PreparedDataLoader
from accelify.runtime.data_loader_api import prepare_data_loader, skip_first_batches
from accelify.runtime.samplers import SeedableRandomSampler

#: HF's name for a prepared DataLoader
DataLoaderShard = PreparedDataLoader

__all__ = [
    "DataLoaderShard",
    "PreparedDataLoader",
    "SeedableRandomSampler",
    "prepare_data_loader",
    "skip_first_batches",
]
