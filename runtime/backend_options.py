"""What `--backend fsdp` and `--backend deepspeed` can be told, checked before any rank starts.

Torch-free: the CLI, the config file reader and the launcher use it; the runtime reads the same
options back from ``ACCELIFY_BACKEND_OPTIONS`` (JSON). Every option is ``None`` when not given, so
that an option meant for another backend is an error rather than silently ignored.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from accelify.errors import UserError

DEEPSPEED_INSTALL = "pip install 'accelify[deepspeed]'"


@dataclass(frozen=True)
class FSDPOptions:
    """PyTorch FSDP2 (``fully_shard``)."""

    #: True: parameters are resharded after forward (full shard, ZeRO-3 style); False: kept
    #: gathered until backward (shard grad-op, ZeRO-2 style).
    reshard_after_forward: bool | None = None
    #: Submodule class names to shard as their own unit (transformer blocks).
    auto_wrap: tuple[str, ...] | None = None
    #: Shard as its own unit every submodule holding at least this many parameters.
    min_num_params: int | None = None
    cpu_offload: bool | None = None
    activation_checkpointing: bool | None = None


@dataclass(frozen=True)
class DeepSpeedOptions:
    """DeepSpeed ZeRO (``deepspeed.initialize``)."""

    zero_stage: int | None = None
    offload_optimizer: bool | None = None  # to CPU memory
    offload_params: bool | None = None  # to CPU memory (ZeRO-3)
    config_file: str | None = None  # a DeepSpeed JSON; it wins over the options above


OPTIONS = {"fsdp": FSDPOptions, "deepspeed": DeepSpeedOptions}
#: Each option's `accelify launch` flag: its click destination -> (backend, option, flag).
FLAGS = {
    "reshard_after_forward": ("fsdp", "reshard_after_forward", "--fsdp-reshard-after-forward"),
    "auto_wrap": ("fsdp", "auto_wrap", "--fsdp-auto-wrap"),
    "min_num_params": ("fsdp", "min_num_params", "--fsdp-min-num-params"),
    "cpu_offload": ("fsdp", "cpu_offload", "--fsdp-cpu-offload"),
    "activation_checkpointing": (
        "fsdp",
        "activation_checkpointing",
        "--fsdp-activation-checkpointing",
    ),
    "zero_stage": ("deepspeed", "zero_stage", "--zero-stage"),
    "offload_optimizer": ("deepspeed", "offload_optimizer", "--offload-optimizer"),
    "offload_params": ("deepspeed", "offload_params", "--offload-params"),
    "deepspeed_config_file": ("deepspeed", "config_file", "--deepspeed-config"),
}
_FLAG_OF = {(backend, option): flag for backend, option, flag in FLAGS.values()}


def class_names(text: str) -> tuple[str, ...]:
    """``"BertLayer, Block"`` -> ``("BertLayer", "Block")``."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


def parse_options(options: type[Any], values: Mapping[str, Any]) -> Any:
    """An options object from a mapping of option names (config file section, environment)."""
    names = {item.name for item in fields(options)}
    unknown = set(values) - names
    if unknown:
        raise ValueError(f"unknown option {sorted(unknown)[0]!r}; expected one of {sorted(names)}")
    if "auto_wrap" in values:
        values = {**values, "auto_wrap": tuple(values["auto_wrap"])}
    return options(**values)


def given(options: FSDPOptions | DeepSpeedOptions) -> dict[str, Any]:
    return {key: value for key, value in asdict(options).items() if value is not None}


def to_env(backend: str, fsdp: FSDPOptions, deepspeed: DeepSpeedOptions) -> str:
    chosen = {"fsdp": fsdp, "deepspeed": deepspeed}.get(backend)
    values = given(chosen) if chosen is not None else {}
    return json.dumps({key: list(v) if isinstance(v, tuple) else v for key, v in values.items()})


def from_env(backend: str, text: str | None) -> FSDPOptions | DeepSpeedOptions | None:
    options = OPTIONS.get(backend)
    if options is None:
        return None
    return parse_options(options, json.loads(text) if text else {})


def deepspeed_installed() -> bool:
    return importlib.util.find_spec("deepspeed") is not None


def check(
    backend: str,
    fsdp: FSDPOptions,
    deepspeed: DeepSpeedOptions,
    on_cpu: bool,
) -> None:
    """Refuse what the chosen backend cannot honour, with the flag to change."""
    for name, options in (("fsdp", fsdp), ("deepspeed", deepspeed)):
        if name != backend and given(options):
            flags = ", ".join(_FLAG_OF[(name, key)] for key in given(options))
            raise UserError(f"{flags} applies to --backend {name}, and this run uses {backend}")
    if backend == "fsdp":
        if fsdp.min_num_params is not None and fsdp.min_num_params < 1:
            raise UserError("--fsdp-min-num-params must be >= 1")
        if fsdp.cpu_offload and on_cpu:
            raise UserError(
                "--fsdp-cpu-offload moves parameters from GPU to CPU memory, and this run is on "
                "the CPU already; drop it"
            )
        if fsdp.activation_checkpointing and not (fsdp.auto_wrap or fsdp.min_num_params):
            raise UserError(
                "--fsdp-activation-checkpointing recomputes the wrapped blocks: name them with "
                "--fsdp-auto-wrap CLASS or --fsdp-min-num-params N"
            )
        return
    if backend != "deepspeed":
        return
    if not deepspeed_installed():
        raise UserError(
            f"--backend deepspeed needs DeepSpeed, which is not installed: {DEEPSPEED_INSTALL}"
        )
    stage = deepspeed.zero_stage
    if stage is not None and stage not in (0, 1, 2, 3):
        raise UserError(f"--zero-stage must be 0, 1, 2 or 3, got {stage}")
    if deepspeed.offload_params and stage is not None and stage != 3:
        raise UserError("--offload-params needs --zero-stage 3 (only ZeRO-3 partitions parameters)")
    if (deepspeed.offload_optimizer or deepspeed.offload_params) and on_cpu:
        raise UserError(
            "offloading to CPU memory needs a GPU run: this run is on the CPU already; "
            "drop --offload-optimizer/--offload-params"
        )
    if deepspeed.config_file is not None:
        _check_deepspeed_config(deepspeed, on_cpu)


def _check_deepspeed_config(options: DeepSpeedOptions, on_cpu: bool) -> None:
    """What the JSON says that cannot work here; its precision is compared with the script's
    own at prepare time (the script may set mixed_precision itself)."""
    path = str(options.config_file)
    config = read_deepspeed_config(path)
    stage = config.get("zero_optimization", {}).get("stage", "auto")
    if stage != "auto" and options.zero_stage is not None and stage != options.zero_stage:
        raise UserError(
            f"zero_optimization.stage is {stage} in the DeepSpeed config and --zero-stage is "
            f'{options.zero_stage}: make them agree (or set the config\'s stage to "auto")',
            path,
        )
    if config.get("fp16", {}).get("enabled") is True and on_cpu:
        raise UserError("fp16 needs CUDA GPUs, and this run is on the CPU; use bf16", path)


def read_deepspeed_config(path: str) -> dict[str, Any]:
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


# --- Hugging Face Accelerate's fsdp_config / deepspeed_config keys ----------------------------

_HF_SHARDING = {"FULL_SHARD": True, "1": True, "SHARD_GRAD_OP": False, "2": False}
_HF_FSDP_IGNORED = {
    "fsdp_version",
    "fsdp_backward_prefetch",
    "fsdp_backward_prefetch_policy",
    "fsdp_forward_prefetch",
    "fsdp_state_dict_type",
    "fsdp_sync_module_states",
    "fsdp_use_orig_params",
    "fsdp_cpu_ram_efficient_loading",
}
_HF_DEEPSPEED_IGNORED = {
    "zero3_init_flag",
    "zero3_save_16bit_model",
    "deepspeed_multinode_launcher",
}
_HF_OFFLOAD = {
    "offload_optimizer_device": "offload_optimizer",
    "offload_param_device": "offload_params",
}


def fsdp_from_hf(values: Mapping[str, Any]) -> FSDPOptions:
    """``fsdp_config:`` of an Accelerate config file."""
    settings: dict[str, Any] = {}
    policy = values.get("fsdp_auto_wrap_policy")
    for key, value in values.items():
        if key in _HF_FSDP_IGNORED or key == "fsdp_auto_wrap_policy":
            continue
        if key == "fsdp_sharding_strategy":
            if str(value) not in _HF_SHARDING:
                raise ValueError(
                    f"fsdp_sharding_strategy {value!r} is not supported; use FULL_SHARD or "
                    "SHARD_GRAD_OP"
                )
            settings["reshard_after_forward"] = _HF_SHARDING[str(value)]
        elif key == "fsdp_reshard_after_forward":
            settings["reshard_after_forward"] = _bool(key, value)
        elif key == "fsdp_transformer_layer_cls_to_wrap":
            names = ",".join(value) if isinstance(value, list) else str(value)
            settings["auto_wrap"] = class_names(names)
        elif key == "fsdp_min_num_params":
            settings["min_num_params"] = int(value)
        elif key == "fsdp_offload_params":
            settings["cpu_offload"] = _bool(key, value)
        elif key == "fsdp_activation_checkpointing":
            settings["activation_checkpointing"] = _bool(key, value)
        else:
            raise ValueError(f"fsdp_config: unknown key {key!r}")
    if policy == "NO_WRAP":
        settings.pop("auto_wrap", None)
        settings.pop("min_num_params", None)
    elif policy == "SIZE_BASED_WRAP":
        settings.pop("auto_wrap", None)
    elif policy == "TRANSFORMER_BASED_WRAP":
        settings.pop("min_num_params", None)
    elif policy is not None:
        raise ValueError(f"fsdp_config: fsdp_auto_wrap_policy {policy!r} is not supported")
    return FSDPOptions(**settings)


def deepspeed_from_hf(values: Mapping[str, Any]) -> tuple[DeepSpeedOptions, dict[str, Any]]:
    """``deepspeed_config:`` of an Accelerate config file; also returns launch settings it
    carries (gradient accumulation steps)."""
    settings: dict[str, Any] = {}
    launch: dict[str, Any] = {}
    for key, value in values.items():
        if key in _HF_DEEPSPEED_IGNORED:
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
            continue  # accelerator.clip_grad_norm_ sets it
        else:
            raise ValueError(f"deepspeed_config: unknown key {key!r}")
    return DeepSpeedOptions(**settings), launch


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "false"):
        return str(value).lower() == "true"
    raise ValueError(f"{key}: expected true or false")
