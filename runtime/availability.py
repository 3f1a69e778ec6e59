"""HF Accelerate's ``is_*_available`` probes, answered for accelify's runtime on this machine.

They answer "can this script use it with accelify here", which is what a script that branches
on them needs: ``is_fp16_available()`` is False without CUDA because accelify refuses fp16 on CPU
(HF accepts it there and trains in fp32), and the accelerators accelify does not run on (TPU,
HPU, XPU, NPU, MLU) are never available. Package probes look for the package without
importing it; torch is imported only by the device probes.
"""

from __future__ import annotations

import importlib.util


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def is_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def is_mps_available(min_version: str | None = None) -> bool:
    return False  # accelify runs on CUDA and CPU


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """bf16 autocast runs on CPU, and on GPUs that support it."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return True


def is_fp16_available() -> bool:
    """fp16 mixed precision needs CUDA in accelify (its GradScaler and autocast)."""
    return is_cuda_available()


def _never(*args: object, **kwargs: object) -> bool:
    return False


is_hpu_available = is_xpu_available = is_npu_available = is_mlu_available = _never
is_musa_available = is_sdaa_available = is_torch_xla_available = _never


def is_datasets_available() -> bool:
    return _installed("datasets")


def is_pytest_available() -> bool:
    return _installed("pytest")


def is_deepspeed_available() -> bool:
    return _installed("deepspeed")


def is_tensorboard_available() -> bool:
    return _installed("tensorboard") or _installed("tensorboardX")


def is_wandb_available() -> bool:
    return _installed("wandb")


def is_transformers_available() -> bool:
    return _installed("transformers")


def is_torchvision_available() -> bool:
    return _installed("torchvision")


PROBES = tuple(name for name in dir() if name.startswith("is_") and name.endswith("_available"))
