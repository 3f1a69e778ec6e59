"""`accelify env`: what a maintainer needs to reproduce a bug, in one pasteable block."""

from __future__ import annotations

import os
import platform
import sys

from accelify import __version__
from accelify.errors import UserError
from accelify.requirements import INSTALL_RUNTIME, installed_version, missing_runtime_modules
from accelify.runtime.environment import DOCUMENTED
from accelify.runtime.launch.config import default_config_path, load_config


def _version(package: str) -> str:
    return installed_version(package) or "not installed"


def environment_report() -> str:
    lines = [
        f"- accelify: {__version__}",
        f"- Python: {sys.version.split()[0]} ({sys.executable})",
        f"- platform: {platform.platform()}",
    ]
    if "torch" in missing_runtime_modules():
        lines.append(f"- torch: not installed (launch and verify need {INSTALL_RUNTIME})")
    else:
        lines += _torch_lines()
    lines += [
        f"- libcst: {_version('libcst')}",
        f"- deepspeed: {_version('deepspeed')}",
        f"- CPU cores: {os.cpu_count()}",
    ]
    lines += _config_lines()
    set_vars = {name: os.environ[name] for name in DOCUMENTED if name in os.environ}
    lines.append(f"- ACCELIFY_* set: {set_vars or 'none'}")
    return "\n".join(lines)


def _torch_lines() -> list[str]:
    import torch

    lines = [f"- torch: {torch.__version__} (CUDA build: {torch.version.cuda or 'none'})"]
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        lines.append(f"- GPUs: {len(names)} ({', '.join(names)})")
        lines.append(f"- bf16 on GPU: {torch.cuda.is_bf16_supported()}")
    else:
        lines.append("- GPUs: none (CPU runs use gloo)")
    lines.append(
        f"- distributed backends: gloo={torch.distributed.is_gloo_available()}, "
        f"nccl={torch.distributed.is_nccl_available()}"
    )
    return lines


def _config_lines() -> list[str]:
    lines = []
    path = default_config_path()
    if path.exists():
        try:
            config = load_config(path)
            lines.append(f"- config ({path}):")
            lines += [f"    {line}" for line in config.to_yaml().splitlines()]
        except UserError as error:
            lines.append(f"- config ({path}): invalid: {error}")
    else:
        lines.append(f"- config: none ({path} does not exist)")
    return lines
