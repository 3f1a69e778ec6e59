"""The launch config file: accelify's own YAML keys, and Hugging Face Accelerate's.

Read with ``yaml.safe_load``; every error names the file, the key and its line. The module is
torch-free so that ``accelify config`` and ``accelify launch --help`` stay quick.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from accelify.errors import UserError
from accelify.runtime.environment import BACKEND_CHOICES, MIXED_PRECISION_CHOICES
from accelify.runtime.options import DECLARED, DeepSpeedOptions, FSDPOptions, parse_options

#: torchrun's rendezvous backends
RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")


@dataclass
class LaunchConfig:
    #: processes over all machines, as HF Accelerate's num_processes (each machine runs its share)
    num_processes: int | None = None
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str | None = None
    main_process_port: int | None = None
    mixed_precision: str | None = None
    gradient_accumulation_steps: int | None = None
    use_cpu: bool = False
    backend: str = "ddp"
    max_restarts: int = 0
    #: seconds a rank may wait in a collective while a peer is in none, before the launcher
    #: reports the hang and stops the run; 0 turns the watch off
    hang_timeout: float = 300.0
    #: HF's debug mode in every rank: collectives first check that all ranks pass the same shapes
    debug: bool = False
    #: OMP_NUM_THREADS of each rank (default: on the CPU, the cores shared out; else torch's)
    num_cpu_threads_per_process: int | None = None
    #: CUDA_VISIBLE_DEVICES of the ranks: "0,1,3" ("all" or None: every GPU)
    gpu_ids: str | None = None
    # torchrun's own settings, passed on as they are
    rdzv_backend: str = "static"
    rdzv_conf: str | None = None
    monitor_interval: float | None = None
    tee: str | None = None
    log_dir: str | None = None
    role: str | None = None
    # one field per backend with options (`accelify.runtime.options.DECLARED`), named after it
    fsdp: FSDPOptions = field(default_factory=FSDPOptions)
    deepspeed: DeepSpeedOptions = field(default_factory=DeepSpeedOptions)

    def backend_options(self) -> dict[str, Any]:
        """Each backend's options, by backend name."""
        return {backend: getattr(self, backend) for backend in DECLARED}

    def to_yaml(self) -> str:
        values: dict[str, Any] = {}
        for key, value in asdict(self).items():
            if isinstance(value, dict):  # backend options: only those given, as plain values
                value = {k: list(v) if isinstance(v, tuple) else v for k, v in value.items()}
                value = {k: v for k, v in value.items() if v is not None} or None
            if value is not None:
                values[key] = value
        return yaml.safe_dump(values, sort_keys=False)


def default_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "accelify" / "config.yaml"


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("expected an integer >= 1")
    return value


def _non_negative_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("expected an integer >= 0")
    return value


def _non_negative_seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError("expected a number of seconds >= 0 (0: off)")
    return float(value)


def _positive_seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError("expected a number of seconds > 0")
    return float(value)


def _optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``key: null`` (or ``~``) in the file means "not set", as if the key were absent."""
    return lambda value: None if value is None else check(value)


def _port(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 65536:
        raise ValueError("expected a port number between 1 and 65535 (0: a free one)")
    return value


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("expected true or false")
    return value


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("expected a string")
    return value


def _choice(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value is False:  # YAML 1.1 reads a bare `no` as false
            value = "no"
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value

    return check


_ACCELIFY_KEYS: dict[str, Callable[[Any], Any]] = {
    "num_processes": _optional(_positive_int),
    "num_machines": _positive_int,
    "machine_rank": _non_negative_int,
    "main_process_ip": _optional(_string),
    "main_process_port": _optional(_port),
    "mixed_precision": _optional(_choice(MIXED_PRECISION_CHOICES)),
    "gradient_accumulation_steps": _optional(_positive_int),
    "use_cpu": _boolean,
    "backend": _choice(BACKEND_CHOICES),
    "max_restarts": _non_negative_int,
    "hang_timeout": _non_negative_seconds,
    "debug": _boolean,
    "num_cpu_threads_per_process": _optional(_positive_int),
    "gpu_ids": _optional(lambda value: _string(str(value) if isinstance(value, int) else value)),
    "rdzv_backend": _choice(RDZV_BACKENDS),
    "rdzv_conf": _optional(_string),
    "monitor_interval": _optional(_positive_seconds),
    "tee": _optional(lambda value: _string(str(value) if isinstance(value, int) else value)),
    "log_dir": _optional(_string),
    "role": _optional(_string),
}

# Hugging Face Accelerate's `default_config.yaml`: keys with a meaning here, and keys that only
# concern features accelify does not have (accepted so that an Accelerate config loads as is).
_HF_DISTRIBUTED_TYPES = {
    "NO": "ddp",
    "MULTI_CPU": "ddp",
    "MULTI_GPU": "ddp",
    "FSDP": "fsdp",
    "DEEPSPEED": "deepspeed",
}
_HF_IGNORED_KEYS = {
    "compute_environment",
    "downcast_bf16",
    "enable_cpu_affinity",
    "main_training_function",
    "same_network",
    "tpu_env",
    "tpu_use_cluster",
    "tpu_use_sudo",
    "dynamo_config",
    "ipex_config",
    "mpirun_config",
}


def _hf_distributed_type(value: Any) -> str:
    if value not in _HF_DISTRIBUTED_TYPES:
        raise ValueError(
            f"distributed_type {value!r} is not supported; expected one of "
            f"{', '.join(_HF_DISTRIBUTED_TYPES)}"
        )
    return _HF_DISTRIBUTED_TYPES[value]


def load_config(path: Path) -> LaunchConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise UserError(f"cannot read config file: {error.strerror}", str(path)) from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        values = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        problem = getattr(error, "problem", None) or str(error)
        raise UserError(
            f"invalid YAML: {problem}", str(path), mark.line + 1 if mark else None
        ) from None
    if values is None:
        return LaunchConfig()
    if not isinstance(values, dict) or root is None:
        raise UserError("expected a mapping of keys to values", str(path), 1)
    lines = {key_node.value: key_node.start_mark.line + 1 for key_node, _ in root.value}
    settings: dict[str, Any] = {}
    for key, value in values.items():
        line = lines.get(key)
        try:
            if key in _ACCELIFY_KEYS:
                settings[key] = _ACCELIFY_KEYS[key](value)
            elif key == "distributed_type":
                settings["backend"] = _hf_distributed_type(value)
            elif key in DECLARED:
                settings[key] = parse_options(DECLARED[key].options, _mapping(value))
            elif key in _HF_SECTIONS:
                backend = _HF_SECTIONS[key]
                settings[backend], carried = DECLARED[backend].from_hf(_mapping(value))
                settings.update(carried)
            elif key in _HF_IGNORED_KEYS:
                continue
            else:
                known = ", ".join(sorted([*_ACCELIFY_KEYS, *DECLARED]))
                raise ValueError(f"unknown key; expected one of {known}")
        except ValueError as error:
            raise UserError(f"{key}: {error} (got {value!r})", str(path), line) from None
    return LaunchConfig(**settings)


#: HF Accelerate's per-backend sections: "fsdp_config" -> "fsdp"
_HF_SECTIONS = {declaration.hf_section: name for name, declaration in DECLARED.items()}


def _mapping(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError("expected a mapping")
    return value


def write_config(config: LaunchConfig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config.to_yaml(), encoding="utf-8")
    return path


CONFIG_KEYS = tuple(field.name for field in fields(LaunchConfig))
