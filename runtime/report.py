"""`accelify env`: what a maintainer needs to reproduce a bug, in one pasteable block."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys

from accelify import __version__
from accelify.errors import UserError
from accelify.runtime.config import default_config_path, load_config
from accelify.runtime.environment import DOCUMENTED


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def environment_report() -> str:
    import torch

    lines = [
        f"- accelify: {__version__}",
        f"- Python: {sys.version.split()[0]} ({sys.executable})",
        f"- platform: {platform.platform()}",
        f"- torch: {torch.__version__} (CUDA build: {torch.version.cuda or 'none'})",
        f"- libcst: {_version('libcst')}",
        f"- deepspeed: {_version('deepspeed')}",
        f"- CPU cores: {os.cpu_count()}",
    ]
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
    set_vars = {name: os.environ[name] for name in DOCUMENTED if name in os.environ}
    lines.append(f"- ACCELIFY_* set: {set_vars or 'none'}")
    return "\n".join(lines)
