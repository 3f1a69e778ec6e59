"""``Accelerator(kwargs_handlers=[...])``: options for the objects the Accelerator builds, with
HF Accelerate's names. Each handler passes on only the fields set away from their defaults, so
accelify's own defaults (``gradient_as_bucket_view=True`` for DDP) hold unless overridden.
Torch-free: the handlers are plain dataclasses a script builds before anything runs."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any


class DistributedType(str, enum.Enum):
    """What `Accelerator.distributed_type` says: how this run is distributed."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    FSDP = "FSDP"
    DEEPSPEED = "DEEPSPEED"
    # Accelerate's names for hardware accelify does not run on; scripts compare against them
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"
    XLA = "XLA"
    TPU = "TPU"
    MEGATRON_LM = "MEGATRON_LM"


def distributed_type_of(backend: str, num_processes: int, device_type: str) -> DistributedType:
    if backend == "fsdp":
        return DistributedType.FSDP
    if backend == "deepspeed":
        return DistributedType.DEEPSPEED
    if num_processes == 1:
        return DistributedType.NO
    return DistributedType.MULTI_GPU if device_type == "cuda" else DistributedType.MULTI_CPU


@dataclass
class KwargsHandler:
    def to_kwargs(self) -> dict[str, Any]:
        """The fields set to something other than their default."""
        default = type(self)()
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        }


class DDPCommunicationHookType(str, enum.Enum):
    """How DDP communicates gradients (HF's names): compressed to fp16/bf16 for the all-reduce,
    or PowerSGD's low-rank approximation, or plainly (``NO``)."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


#: The handler's fields that are not DistributedDataParallel's arguments: the DDP backend
#: registers the communication hook they describe on the wrapped model.
COMM_HOOK_FIELDS = ("comm_hook", "comm_wrapper", "comm_state_option")


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Passed to ``torch.nn.parallel.DistributedDataParallel`` under the DDP backend;
    ``find_unused_parameters`` has no other way in. ``comm_hook`` (wrapped in ``comm_wrapper``'s
    compression, PowerSGD configured by ``comm_state_option``) is registered on the model."""

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # HF takes the plain strings too (comm_hook="fp16")
        self.comm_hook = DDPCommunicationHookType(self.comm_hook)
        self.comm_wrapper = DDPCommunicationHookType(self.comm_wrapper)
        if self.comm_wrapper not in (
            DDPCommunicationHookType.NO,
            DDPCommunicationHookType.FP16,
            DDPCommunicationHookType.BF16,
        ):
            raise ValueError(
                f"comm_wrapper={self.comm_wrapper.value!r}: a wrapper compresses to fp16 or bf16"
            )

    def to_kwargs(self) -> dict[str, Any]:
        found = super().to_kwargs()
        found.pop("check_reduction", None)  # deprecated in torch, ignored by DDP
        return found


@dataclass
class GradScalerKwargs(KwargsHandler):
    """Passed to ``torch.amp.GradScaler`` when training in fp16."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """``timeout`` for collectives (the time a rank waits for the others before failing).
    The process-group backend follows the device (gloo on CPU, NCCL on CUDA); ``init_method``
    is the launcher's."""

    backend: str | None = None
    init_method: str | None = None
    timeout: timedelta | None = None


def of_type(handlers: list[Any] | None, kind: type[KwargsHandler]) -> dict[str, Any]:
    """The options of the one handler of ``kind`` in ``handlers`` (empty when none)."""
    matching = [h for h in handlers or () if isinstance(h, kind)]
    if len(matching) > 1:
        raise ValueError(f"kwargs_handlers holds {len(matching)} {kind.__name__}; give one")
    unknown = [
        h
        for h in handlers or ()
        if not isinstance(
            h, (DistributedDataParallelKwargs, GradScalerKwargs, InitProcessGroupKwargs)
        )
    ]
    if unknown:
        raise TypeError(
            f"kwargs_handlers: {type(unknown[0]).__name__} is not one accelify reads "
            "(DistributedDataParallelKwargs, GradScalerKwargs, InitProcessGroupKwargs)"
        )
    return matching[0].to_kwargs() if matching else {}
