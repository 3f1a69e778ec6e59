"""The one contract between `accelify launch` and the runtime: ``ACCELIFY_*`` environment variables.

The launcher writes them; `Accelerator` reads them when its own arguments are left at their
defaults. Because settings travel this way (and process placement through torchrun's standard
``RANK``/``WORLD_SIZE``/... variables), a converted script also runs under plain ``torchrun``.
This module must not import torch: the CLI imports it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

MIXED_PRECISION = "ACCELIFY_MIXED_PRECISION"
GRADIENT_ACCUMULATION_STEPS = "ACCELIFY_GRADIENT_ACCUMULATION_STEPS"
USE_CPU = "ACCELIFY_USE_CPU"
BACKEND = "ACCELIFY_BACKEND"
BACKEND_OPTIONS = "ACCELIFY_BACKEND_OPTIONS"
FAILURE_DIR = "ACCELIFY_FAILURE_DIR"
RANK_TRACEBACKS = "ACCELIFY_RANK_TRACEBACKS"
DEBUG_MODE = "ACCELIFY_DEBUG_MODE"

#: Every variable of the contract, with what it means; `accelify env` and docs/launch.md list these.
DOCUMENTED = {
    MIXED_PRECISION: "no | bf16 | fp16: precision when Accelerator(mixed_precision=None)",
    GRADIENT_ACCUMULATION_STEPS: "integer >= 1: when Accelerator(gradient_accumulation_steps=1)",
    USE_CPU: "true | false: force the CPU even where CUDA is available",
    BACKEND: "ddp | fsdp | deepspeed: the engine that wraps prepared models",
    BACKEND_OPTIONS: "JSON: the chosen backend's options (sharding, offload, ZeRO stage, ...)",
    FAILURE_DIR: "a directory: each rank records its exception and collectives there (by launch)",
    RANK_TRACEBACKS: "true: a rank prints its own traceback too (set by launch with --tee)",
    DEBUG_MODE: "true: collectives first check that every rank passes the same shapes",
}

MIXED_PRECISION_CHOICES = ("no", "bf16", "fp16")
BACKEND_CHOICES = ("ddp", "fsdp", "deepspeed")


def parse_bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


@dataclass(frozen=True)
class LaunchSettings:
    """What the launcher decided for the runtime; `None` means "the script's own choice"."""

    mixed_precision: str | None = None
    gradient_accumulation_steps: int | None = None
    use_cpu: bool = False
    backend: str = "ddp"
    backend_options: str = ""  # JSON, see accelify.runtime.options
    debug: bool = False
    # standard variables the launcher also sets for the ranks
    cpu_threads: int | None = None  # OMP_NUM_THREADS
    visible_gpus: str | None = None  # CUDA_VISIBLE_DEVICES

    def to_env(self) -> dict[str, str]:
        env = {
            USE_CPU: "true" if self.use_cpu else "false",
            BACKEND: self.backend,
            BACKEND_OPTIONS: self.backend_options,
        }
        if self.debug:
            env[DEBUG_MODE] = "true"
        if self.cpu_threads is not None:
            env["OMP_NUM_THREADS"] = str(self.cpu_threads)
        if self.visible_gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.visible_gpus
        if self.mixed_precision is not None:
            env[MIXED_PRECISION] = self.mixed_precision
        if self.gradient_accumulation_steps is not None:
            env[GRADIENT_ACCUMULATION_STEPS] = str(self.gradient_accumulation_steps)
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LaunchSettings:
        environ = os.environ if environ is None else environ
        mixed_precision = environ.get(MIXED_PRECISION) or None
        if mixed_precision is not None and mixed_precision not in MIXED_PRECISION_CHOICES:
            raise ValueError(
                f"{MIXED_PRECISION}={mixed_precision!r}: expected one of {MIXED_PRECISION_CHOICES}"
            )
        steps = environ.get(GRADIENT_ACCUMULATION_STEPS) or None
        backend = environ.get(BACKEND) or "ddp"
        if backend not in BACKEND_CHOICES:
            raise ValueError(f"{BACKEND}={backend!r}: expected one of {BACKEND_CHOICES}")
        return cls(
            mixed_precision=mixed_precision,
            gradient_accumulation_steps=int(steps) if steps is not None else None,
            use_cpu=parse_bool(environ.get(USE_CPU, "false")),
            backend=backend,
            backend_options=environ.get(BACKEND_OPTIONS, ""),
            debug=parse_bool(environ.get(DEBUG_MODE, "false")),
        )
