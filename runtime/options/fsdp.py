"""`--backend fsdp`: PyTorch FSDP2's options, their `accelify launch` flags, HF Accelerate's
``fsdp_config`` keys, the checks made before any rank starts, and `accelify config`'s questions.
An FSDP option is declared here and used in `accelify.runtime.backends.fsdp`, nowhere else."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import click

from accelify.errors import UserError
from accelify.runtime.options.base import BackendOptions, Flag, HFFlag, class_names, hf_bool


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


_RESHARD, _KEEP = "--fsdp-reshard-after-forward", "--fsdp-keep-after-forward"
_CHECKPOINT, _NO_CHECKPOINT = (
    "--fsdp-activation-checkpointing",
    "--fsdp-no-activation-checkpointing",
)

FLAGS = (
    Flag(
        "reshard_after_forward",
        (f"{_RESHARD}/{_KEEP}", "--fsdp_reshard_after_forward"),
        "FSDP: reshard parameters after forward (full shard, the default) or keep them "
        "gathered until backward (shard grad-op).",
        click={"default": None},
        # HF's FSDP1 spelling names the sharding strategy
        hf_values={
            "true": _RESHARD,
            "false": _KEEP,
            "full_shard": _RESHARD,
            "shard_grad_op": _KEEP,
        },
    ),
    Flag(
        "auto_wrap",
        ("--fsdp-auto-wrap",),
        "FSDP: comma-separated module class names to shard as their own units.",
    ),
    Flag(
        "min_num_params",
        ("--fsdp-min-num-params", "--fsdp_min_num_params"),
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
        (f"{_CHECKPOINT}/{_NO_CHECKPOINT}", "--fsdp_activation_checkpointing"),
        "FSDP: recompute the wrapped blocks' activations in backward.",
        click={"default": None},
        hf_values={"true": _CHECKPOINT, "false": _NO_CHECKPOINT},
    ),
)

#: `accelerate launch`'s --fsdp_* flags that are not among FLAGS: the translated ones are read as
#: the `fsdp_config` keys of the same name (`from_hf`); the others are accepted only when they ask
#: for what FSDP2 does anyway.
HF_FLAGS = (
    HFFlag("fsdp_offload_params", translated=True, help="true: as --fsdp-cpu-offload."),
    HFFlag(
        "fsdp_sharding_strategy",
        translated=True,
        help="FULL_SHARD or SHARD_GRAD_OP: as --fsdp-reshard-after-forward or "
        "--fsdp-keep-after-forward.",
    ),
    HFFlag(
        "fsdp_auto_wrap_policy",
        translated=True,
        help="TRANSFORMER_BASED_WRAP (with --fsdp_transformer_layer_cls_to_wrap), "
        "SIZE_BASED_WRAP (with --fsdp_min_num_params) or NO_WRAP.",
    ),
    HFFlag(
        "fsdp_transformer_layer_cls_to_wrap",
        translated=True,
        help="As --fsdp-auto-wrap.",
    ),
    HFFlag(
        "fsdp_version",
        "accelify's FSDP is FSDP2 (fully_shard); FSDP1 (FullyShardedDataParallel) is not "
        "available: drop the flag or give 2",
        accepts=("2",),
        help="2 (accelify runs FSDP2).",
    ),
    HFFlag(
        "fsdp_use_orig_params",
        "FSDP2 always keeps the original parameters (DTensor); there is no flat-parameter mode",
        accepts=("true",),
        help="true (FSDP2 always does).",
    ),
    HFFlag(
        "fsdp_backward_prefetch",
        "FSDP2 always prefetches the next unit's parameters before its backward "
        "(BACKWARD_PRE); other prefetch policies are not available",
        accepts=("backward_pre",),
        help="BACKWARD_PRE (what FSDP2 does).",
    ),
    HFFlag(
        "fsdp_forward_prefetch",
        "FSDP2 has no explicit forward prefetch to turn on",
        accepts=("false",),
        help="false (FSDP2 has none).",
    ),
    HFFlag(
        "fsdp_state_dict_type",
        "save_state writes sharded checkpoints (torch.distributed.checkpoint), and "
        "get_state_dict/save_model give the full state dict: other layouts are not available",
        accepts=("sharded_state_dict",),
        help="SHARDED_STATE_DICT (what save_state writes).",
    ),
    HFFlag(
        "fsdp_sync_module_states",
        "accelify's FSDP does not broadcast rank 0's weights at prepare: build the model the "
        "same on every rank (set_seed, or load the same weights) and drop the flag",
        accepts=("false",),
        help="false (weights are not broadcast at prepare).",
    ),
    HFFlag(
        "fsdp_cpu_ram_efficient_loading",
        "loading pretrained weights on rank 0 only is a transformers integration of HF "
        "Accelerate that accelify does not have",
        accepts=("false",),
        help="false (every rank loads its own weights).",
    ),
    HFFlag(
        "fsdp_activation_checkpointing_offload",
        "offloading checkpointed activations to CPU memory is not supported; "
        "--fsdp-activation-checkpointing recomputes them instead",
        accepts=("false",),
        help="false (not supported).",
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
_HF_UNSHARDED = {
    "NO_SHARD": "it replicates the model as DDP does: launch without FSDP",
    "3": "it replicates the model as DDP does: launch without FSDP",
    "HYBRID_SHARD": "sharding within a machine and replicating across machines is not available",
    "4": "sharding within a machine and replicating across machines is not available",
    "HYBRID_SHARD_ZERO2": "sharding within a machine and replicating across machines is not "
    "available",
    "5": "sharding within a machine and replicating across machines is not available",
}
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
                    f"fsdp_sharding_strategy {value!r} is not supported ("
                    + _HF_UNSHARDED.get(str(value), "unknown strategy")
                    + "); use FULL_SHARD or SHARD_GRAD_OP"
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


DECLARATION = BackendOptions(
    "fsdp", FSDPOptions, FLAGS, "fsdp_config", from_hf, check, ask, HF_FLAGS
)
