"""What the Accelerator asks of an engine; everything engine-specific stays behind this.

The defaults are what plain data parallelism needs; DDP, FSDP and DeepSpeed override what they
do differently. One process with no launcher uses the same backend object, which then wraps
nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from accelify.runtime.gradient_state import GradientState
from accelify.runtime.state import ProcessState


@dataclass(frozen=True)
class BackendInputs:
    """What the Accelerator hands the engine it builds; each engine takes the parts it uses."""

    state: ProcessState
    mixed_precision: str
    options: Any  # the engine's options (`accelify.runtime.options`), None for DDP
    gradient_state: GradientState
    ddp_kwargs: dict[str, Any]  # the script's DistributedDataParallelKwargs (DDP only)


class Backend:
    name = ""
    #: The engine divides the loss by its own accumulation steps (the Accelerator must not).
    scales_loss_for_accumulation = False
    #: The engine scales fp16 losses itself (the Accelerator keeps no GradScaler).
    scales_fp16 = False

    def __init__(self, state: ProcessState, mixed_precision: str = "no") -> None:
        self.state = state
        self.mixed_precision = mixed_precision

    @classmethod
    def create(cls, inputs: BackendInputs) -> Backend:
        """Build from what the Accelerator has; each engine takes the parts it uses."""
        return cls(inputs.state, inputs.mixed_precision)

    @classmethod
    def at_exit(cls) -> None:
        """At exit, once the process group is destroyed and while the interpreter is still
        whole: let go of what still refers to the group (nothing, for most engines)."""

    def casts_model(self) -> bool:
        """The engine runs the model in the mixed-precision dtype itself (so no autocast)."""
        return False

    def wrap_model(self, model: torch.nn.Module, companions: Sequence[Any]) -> torch.nn.Module:
        """Place the model on the device and wrap it; ``companions`` are the other objects of
        the same ``prepare`` call (an engine that needs the optimizer finds it there)."""
        return model.to(self.state.device)

    def bind_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer to step: the user's, or one rebuilt on the engine's parameters."""
        return optimizer

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The user's module inside whatever `wrap_model` returned."""
        compiled = getattr(model, "_orig_mod", None)
        return compiled if isinstance(compiled, torch.nn.Module) else model

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Skip the gradient reduction for the backward passes inside."""
        return contextlib.nullcontext()

    def sync_in_backward(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Reduce the gradients in the backward passes inside, even under `no_sync` (for a
        backward of a forward that ran under it)."""
        return contextlib.nullcontext()

    def joinable(self, model: torch.nn.Module) -> bool:
        """Whether ``model`` can join uneven inputs (`torch.distributed.algorithms.Join`)."""
        return False

    def backward(self, loss: torch.Tensor, sync: bool, **kwargs: Any) -> None:
        loss.backward(**kwargs)

    def reduces_in_backward(self, models: Sequence[torch.nn.Module], sync: bool) -> bool:
        """Whether a backward now reduces gradients across ranks, so that every rank must
        reach it (`accelify.runtime.collective_record` records it as a collective then)."""
        return False

    def clip_grad_norm_(
        self, parameters: Any, max_norm: float, norm_type: float
    ) -> torch.Tensor | None:
        """Clip over every rank's gradients; returns the total norm before clipping."""
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def model_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """A full, unwrapped state dict (keys as in the user's module); a collective for the
        sharding engines, and then only the main process gets the tensors."""
        return self.unwrap_model(model).state_dict()

    # --- checkpoints -------------------------------------------------------------------------
    #: The engine writes models and optimizers into checkpoints itself (sharded, every rank).
    owns_checkpoints = False

    def save_checkpoint(
        self, models: Sequence[Any], optimizers: Sequence[Any], directory: Path
    ) -> None:
        raise NotImplementedError

    def load_checkpoint(
        self, models: Sequence[Any], optimizers: Sequence[Any], directory: Path
    ) -> None:
        raise NotImplementedError
