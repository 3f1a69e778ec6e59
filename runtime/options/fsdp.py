"""`--backend fsdp`: PyTorch FSDP2's options, their `accelify launch` flags, HF Accelerate's
``fsdp_config`` keys, the checks made before any rank starts, and `accelify config`'s questions.
An FSDP option is declared here and used in `accelify.runtime.backends.fsdp`, nowhere else."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import click

from accelify.errors import UserError
from accelify.runtime.options.base import BackendOptions, Flag, class_names, hf_bool


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


FLAGS = (
    Flag(
        "reshard_after_forward",
        ("--fsdp-reshard-after-forward/--fsdp-keep-after-forward",),
        "FSDP: reshard parameters after forward (full shard, the default) or keep them "
        "gathered until backward (shard grad-op).",
        click={"default": None},
    ),
    Flag(
        "auto_wrap",
        ("--fsdp-auto-wrap",),
        "FSDP: comma-separated module class names to shard as their own units.",
    ),
    Flag(
        "min_num_params",
        ("--fsdp-min-num-params",),
        "FSDP: shard every submodule with at least this many parameters as its own unit.",
        click={"type": click.IntRange(min=1)},
    ),
    Flag(
        "cpu_offload",
        ("--fsdp-cpu-offload",),
        "FSDP: parameters in CPU memory (GPU runs).",
        click={"is_flag": True, "default": None},
    ),
    Flag(
        "activation_checkpointing",
        ("--fsdp-activation-checkpointing",),
        "FSDP: recompute the wrapped blocks' activations in backward.",
        click={"is_flag": True, "default": None},
    ),
)


def check(options: FSDPOptions, on_cpu: bool) -> None:
    if options.min_num_params is not None and options.min_num_params < 1:
        raise UserError("--fsdp-min-num-params must be >= 1")
    if options.cpu_offload and on_cpu:
        raise UserError(
            "--fsdp-cpu-offload moves parameters from GPU to CPU memory, and this run is on "
            "the CPU already; drop it"
        )
    if options.activation_checkpointing and not (options.auto_wrap or options.min_num_params):
        raise UserError(
            "--fsdp-activation-checkpointing recomputes the wrapped blocks: name them with "
            "--fsdp-auto-wrap CLASS or --fsdp-min-num-params N"
        )


def ask() -> FSDPOptions:
    blocks = click.prompt(
        "FSDP: module class names to shard as their own units (comma-separated, empty: "
        "the whole model as one unit)?",
        default="",
        show_default=False,
    )
    return FSDPOptions(
        reshard_after_forward=click.confirm(
            "FSDP: reshard parameters after forward (full shard; no: shard grad-op)?",
            default=True,
        ),
        auto_wrap=class_names(blocks) or None,
        activation_checkpointing=click.confirm(
            "FSDP: recompute the blocks' activations in backward?", default=False
        )
        or None,
    )


# --- Hugging Face Accelerate's fsdp_config keys --------------------------------------------

_HF_SHARDING = {"FULL_SHARD": True, "1": True, "SHARD_GRAD_OP": False, "2": False}
_HF_IGNORED = {
    "fsdp_version",
    "fsdp_backward_prefetch",
    "fsdp_backward_prefetch_policy",
    "fsdp_forward_prefetch",
    "fsdp_state_dict_type",
    "fsdp_sync_module_states",
    "fsdp_use_orig_params",
    "fsdp_cpu_ram_efficient_loading",
}


def from_hf(values: Mapping[str, Any]) -> tuple[FSDPOptions, dict[str, Any]]:
    """``fsdp_config:`` of an Accelerate config file."""
    settings: dict[str, Any] = {}
    policy = values.get("fsdp_auto_wrap_policy")
    for key, value in values.items():
        if key in _HF_IGNORED or key == "fsdp_auto_wrap_policy":
            continue
        if key == "fsdp_sharding_strategy":
            if str(value) not in _HF_SHARDING:
                raise ValueError(
                    f"fsdp_sharding_strategy {value!r} is not supported; use FULL_SHARD or "
                    "SHARD_GRAD_OP"
                )
            settings["reshard_after_forward"] = _HF_SHARDING[str(value)]
        elif key == "fsdp_reshard_after_forward":
            settings["reshard_after_forward"] = hf_bool(key, value)
        elif key == "fsdp_transformer_layer_cls_to_wrap":
            names = ",".join(value) if isinstance(value, list) else str(value)
            settings["auto_wrap"] = class_names(names)
        elif key == "fsdp_min_num_params":
            settings["min_num_params"] = int(value)
        elif key == "fsdp_offload_params":
            settings["cpu_offload"] = hf_bool(key, value)
        elif key == "fsdp_activation_checkpointing":
            settings["activation_checkpointing"] = hf_bool(key, value)
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
    return FSDPOptions(**settings), {}


DECLARATION = BackendOptions("fsdp", FSDPOptions, FLAGS, "fsdp_config", from_hf, check, ask)
