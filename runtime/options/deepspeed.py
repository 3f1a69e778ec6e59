"""`--backend deepspeed`: DeepSpeed ZeRO's options, their `accelify launch` flags, HF
Accelerate's ``deepspeed_config`` keys, the checks made before any rank starts (DeepSpeed
installed, a valid JSON config), and `accelify config`'s questions. A DeepSpeed option is
declared here and used in `accelify.runtime.backends.deepspeed`, nowhere else."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from accelify.errors import UserError
from accelify.runtime.options.base import BackendOptions, Flag, HFFlag

INSTALL = "pip install 'accelify[deepspeed]'"


@dataclass(frozen=True)
class DeepSpeedOptions:
    """DeepSpeed ZeRO (``deepspeed.initialize``)."""

    zero_stage: int | None = None
    offload_optimizer: bool | None = None  # to CPU memory
    offload_params: bool | None = None  # to CPU memory (ZeRO-3)
    config_file: str | None = None  # a DeepSpeed JSON; it wins over the options above
    #: clip every step to this L2 norm, as DeepSpeed's ``gradient_clipping`` (the JSON's wins)
    gradient_clipping: float | None = None


FLAGS = (
    Flag(
        "zero_stage",
        ("--zero-stage", "--zero_stage"),
        "DeepSpeed: ZeRO stage (default 2).",
        click={"type": click.IntRange(0, 3)},
    ),
    Flag(
        "offload_optimizer",
        ("--offload-optimizer",),
        "DeepSpeed: optimizer state in CPU memory (GPU runs).",
        click={"is_flag": True, "default": None},
    ),
    Flag(
        "offload_params",
        ("--offload-params",),
        "DeepSpeed: parameters in CPU memory (ZeRO-3, GPU runs).",
        click={"is_flag": True, "default": None},
    ),
    Flag(
        "config_file",
        ("--deepspeed-config", "--deepspeed_config_file", "--deepspeed-config-file"),
        'DeepSpeed: a DeepSpeed JSON config; its values win, "auto" ones are filled in.',
        dest="deepspeed_config_file",
        click={"type": click.Path(dir_okay=False)},
    ),
    Flag(
        "gradient_clipping",
        ("--gradient-clipping", "--gradient_clipping"),
        "DeepSpeed: clip the gradients to this L2 norm at every step (DeepSpeed's "
        "gradient_clipping; default: only where the script calls clip_grad_norm_).",
        click={"type": click.FloatRange(min=0)},
    ),
)

_LAUNCHER = (
    "configures DeepSpeed's own multi-machine launcher (pdsh, MPI); accelify starts each "
    "machine's ranks with torchrun: run accelify launch on every machine, or under Slurm"
)
_NVME = (
    "NVMe offload is set in the DeepSpeed JSON (zero_optimization.offload_optimizer/"
    "offload_param: device nvme, nvme_path): pass it with --deepspeed_config_file"
)

#: `accelerate launch`'s DeepSpeed flags that are not among FLAGS: the translated ones are read
#: as the `deepspeed_config` keys of the same name (`from_hf`); the others are accepted only when
#: they ask for what accelify does anyway.
HF_FLAGS = (
    HFFlag("offload_optimizer_device", translated=True, help="none or cpu."),
    HFFlag("offload_param_device", translated=True, help="none or cpu (ZeRO-3)."),
    HFFlag("offload_optimizer_nvme_path", _NVME),
    HFFlag("offload_param_nvme_path", _NVME),
    HFFlag(
        "zero3_init_flag",
        "building models already partitioned (deepspeed.zero.Init) is a transformers "
        "integration of HF Accelerate that accelify does not have",
        accepts=("false",),
        help="false (models are built whole, then partitioned at prepare).",
    ),
    HFFlag(
        "zero3_save_16bit_model",
        "expected true or false (either way, save_model gathers the full weights under ZeRO-3)",
        accepts=("true", "false"),
        help="true or false: save_model always gathers the full weights under ZeRO-3 (fp32).",
    ),
    HFFlag(
        "deepspeed_multinode_launcher",
        _LAUNCHER,
        accepts=("standard",),
        help="standard (torchrun on every machine, what accelify does).",
    ),
    HFFlag("deepspeed_hostfile", _LAUNCHER),
    HFFlag("deepspeed_exclusion_filter", _LAUNCHER),
    HFFlag("deepspeed_inclusion_filter", _LAUNCHER),
    HFFlag(
        "deepspeed_moe_layer_cls_names",
        "marking mixture-of-experts layers as ZeRO-3 leaf modules is not supported",
    ),
)


def installed() -> bool:
    return importlib.util.find_spec("deepspeed") is not None


def check(options: DeepSpeedOptions, on_cpu: bool) -> None:
    if not installed():
        raise UserError(f"--backend deepspeed needs DeepSpeed, which is not installed: {INSTALL}")
    stage = options.zero_stage
    if stage is not None and stage not in (0, 1, 2, 3):
        raise UserError(f"--zero-stage must be 0, 1, 2 or 3, got {stage}")
    if options.offload_params and stage is not None and stage != 3:
        raise UserError("--offload-params needs --zero-stage 3 (only ZeRO-3 partitions parameters)")
    if (options.offload_optimizer or options.offload_params) and on_cpu:
        raise UserError(
            "offloading to CPU memory needs a GPU run: this run is on the CPU already; "
            "drop --offload-optimizer/--offload-params"
        )
    if options.config_file is not None:
        _check_config(options, on_cpu)


def _check_config(options: DeepSpeedOptions, on_cpu: bool) -> None:
    """What the JSON says that cannot work here; its precision is compared with the script's
    own at prepare time (the script may set mixed_precision itself)."""
    path = str(options.config_file)
    config = read_config(path)
    stage = config.get("zero_optimization", {}).get("stage", "auto")
    if stage != "auto" and options.zero_stage is not None and stage != options.zero_stage:
        raise UserError(
            f"zero_optimization.stage is {stage} in the DeepSpeed config and --zero-stage is "
            f'{options.zero_stage}: make them agree (or set the config\'s stage to "auto")',
            path,
        )
    if config.get("fp16", {}).get("enabled") is True and on_cpu:
        raise UserError("fp16 needs CUDA GPUs, and this run is on the CPU; use bf16", path)


def read_config(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise UserError(f"cannot read DeepSpeed config: {error.strerror}", path) from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise UserError(f"invalid JSON: {error.msg}", path, error.lineno, error.colno) from None
    if not isinstance(config, dict):
        raise UserError("a DeepSpeed config is a JSON object", path, 1)
    return config


def ask() -> DeepSpeedOptions:
    return DeepSpeedOptions(
        zero_stage=click.prompt("DeepSpeed: ZeRO stage?", default=2, type=click.IntRange(0, 3)),
        config_file=click.prompt(
            "DeepSpeed: a DeepSpeed JSON config file (empty: none)?",
            default="",
            show_default=False,
        )
        or None,
    )


# --- Hugging Face Accelerate's deepspeed_config keys ---------------------------------------

_HF_IGNORED = {
    "zero3_init_flag",
    "zero3_save_16bit_model",
    "deepspeed_multinode_launcher",
}
_HF_OFFLOAD = {
    "offload_optimizer_device": "offload_optimizer",
    "offload_param_device": "offload_params",
}


def from_hf(values: Mapping[str, Any]) -> tuple[DeepSpeedOptions, dict[str, Any]]:
    """``deepspeed_config:`` of an Accelerate config file; also returns launch settings it
    carries (gradient accumulation steps)."""
    settings: dict[str, Any] = {}
    launch: dict[str, Any] = {}
    for key, value in values.items():
        if key in _HF_IGNORED:
            continue
        if key == "zero_stage":
            settings["zero_stage"] = int(value)
        elif key in _HF_OFFLOAD:
            if value not in ("none", "cpu", None):
                raise ValueError(f"{key} {value!r} is not supported; use none or cpu")
            settings[_HF_OFFLOAD[key]] = value == "cpu"
        elif key == "deepspeed_config_file":
            settings["config_file"] = str(value)
        elif key == "gradient_accumulation_steps":
            launch["gradient_accumulation_steps"] = int(value)
        elif key == "gradient_clipping":
            settings["gradient_clipping"] = float(value)
        else:
            raise ValueError(f"deepspeed_config: unknown key {key!r}")
    return DeepSpeedOptions(**settings), launch


DECLARATION = BackendOptions(
    "deepspeed", DeepSpeedOptions, FLAGS, "deepspeed_config", from_hf, check, ask, HF_FLAGS
)
