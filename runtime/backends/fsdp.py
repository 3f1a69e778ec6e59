"""PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``): parameters, gradients and optimizer
state sharded across ranks.

``prepare(model, optimizer)`` shards the model first: the chosen blocks (by class name or
parameter count) become their own units, then the root. ``fully_shard`` replaces the parameters
with sharded ones, so an optimizer built on the originals is rebuilt, from its class, defaults and
``param_groups`` settings, on the sharded parameters (its LR scheduler is pointed at the new one).
bf16 runs through FSDP's ``MixedPrecisionPolicy`` (bf16 compute, fp32 gradient reduction) instead
of autocast. Checkpoints go through ``torch.distributed.checkpoint``: every rank writes its
shard, and a checkpoint loads into a different world size. The sharded model takes a whole state
dict in ``load_state_dict`` too (`accelify.runtime.full_state_loads`): what
``get_state_dict`` saved loads back as it does under DDP; so does the prepared optimizer, whose
whole state ``get_state_dict(optimizer)`` gathers (`accelify.runtime.optimizer_states`), and an
optimizer that holds a state when it is prepared (loaded from a checkpoint before ``prepare``)
has it loaded again once rebuilt.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor

from accelify.runtime import collective_record
from accelify.runtime.backends.base import Backend, BackendInputs
from accelify.runtime.full_state_loads import accept_full_state_dicts
from accelify.runtime.optimizer_states import gathered, shard_whole_state, whole_from_shards
from accelify.runtime.options import FSDPOptions
from accelify.runtime.state import ProcessState


class FSDPBackend(Backend):
    name = "fsdp"

    def __init__(
        self, state: ProcessState, mixed_precision: str = "no", options: FSDPOptions | None = None
    ) -> None:
        super().__init__(state, mixed_precision)
        self.options = options or FSDPOptions()
        self._names: dict[int, tuple[torch.nn.Module, str]] = {}  # id(original param) -> where
        self._bound: set[int] = set()  # ids of parameters held by optimizers already bound

    @classmethod
    def create(cls, inputs: BackendInputs) -> Backend:
        return cls(inputs.state, inputs.mixed_precision, inputs.options)

    @property
    def owns_checkpoints(self) -> bool:  # type: ignore[override]
        return self.state.distributed

    def casts_model(self) -> bool:
        return self.state.distributed and self.mixed_precision == "bf16"

    def wrap_model(self, model: torch.nn.Module, companions: Sequence[Any]) -> torch.nn.Module:
        model = model.to(self.state.device)
        if not self.state.distributed:
            return model
        if any(id(p) in self._bound for p in model.parameters()):
            raise RuntimeError(
                "with --backend fsdp, prepare a model together with its optimizer, "
                "accelerator.prepare(model, optimizer): this model's optimizer was prepared "
                "first, on parameters that sharding replaces"
            )
        for name, parameter in model.named_parameters():
            self._names[id(parameter)] = (model, name)
        mesh = init_device_mesh(self.state.device.type, (self.state.num_processes,))
        settings = {
            "mesh": mesh,
            "reshard_after_forward": self.options.reshard_after_forward is not False,
            "mp_policy": self._mixed_precision_policy(root=False),
            "offload_policy": CPUOffloadPolicy() if self.options.cpu_offload else OffloadPolicy(),
        }
        blocks = list(self._blocks(model))
        if self.options.activation_checkpointing:
            from torch.distributed._composable import checkpoint

            for block in blocks:
                checkpoint(block)  # recompute in backward; parameter names stay the same
        for block in blocks:
            fully_shard(block, **settings)
        fully_shard(model, **{**settings, "mp_policy": self._mixed_precision_policy(root=True)})
        accept_full_state_dicts(model)
        return model

    def _mixed_precision_policy(self, root: bool) -> MixedPrecisionPolicy:
        """bf16 compute and fp32 gradient reduction; only the root hands fp32 outputs back (a
        unit inside the model passes bf16 on to the next layer)."""
        if self.mixed_precision != "bf16":
            return MixedPrecisionPolicy()
        return MixedPrecisionPolicy(
            param_dtype=torch.bfloat16,
            reduce_dtype=torch.float32,
            output_dtype=torch.float32 if root else None,
        )

    def _blocks(self, model: torch.nn.Module) -> Iterator[torch.nn.Module]:
        """The submodules sharded as their own units, innermost first (the root comes last)."""
        names = set(self.options.auto_wrap or ())
        if names:
            found = [m for m in model.modules() if m is not model and type(m).__name__ in names]
            missing = names - {type(m).__name__ for m in found}
            if missing:
                raise ValueError(
                    f"--fsdp-auto-wrap: no submodule of class {', '.join(sorted(missing))} in "
                    f"{type(model).__name__}"
                )
            yield from reversed(found)
            return
        threshold = self.options.min_num_params
        if threshold is None:
            return
        # Size-based: a module becomes a unit when the parameters not already in a unit below it
        # reach the threshold (as torch's size_based_auto_wrap_policy decides).
        remaining: dict[int, int] = {}
        for module in _post_order(model):
            own = sum(p.numel() for p in module.parameters(recurse=False))
            below = sum(remaining[id(child)] for child in module.children())
            total = own + below
            if module is not model and total >= threshold:
                yield module
                total = 0
            remaining[id(module)] = total

    def bind_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        parameters = [p for group in optimizer.param_groups for p in group["params"]]
        self._bound.update(id(p) for p in parameters)
        if not self.state.distributed:
            return optimizer
        known = [id(p) in self._names for p in parameters]
        if not any(known):
            return optimizer  # built on the sharded parameters already
        if not all(known):
            raise RuntimeError(
                "with --backend fsdp, an optimizer must hold parameters of prepared models only"
            )
        # a state loaded (or stepped) before prepare is whole: loaded again once rebuilt
        held = optimizer.state_dict() if optimizer.state else None
        models = {id(model): model for model, _ in self._names.values()}.values()
        sharded = {
            (id(model), name): parameter
            for model in models
            for name, parameter in model.named_parameters()
        }
        groups = []
        for group in optimizer.param_groups:
            settings = {key: value for key, value in group.items() if key != "params"}
            places = [self._names[id(p)] for p in group["params"]]
            groups.append({**settings, "params": [sharded[(id(m), n)] for m, n in places]})
        try:
            rebuilt = type(optimizer)(groups, **_constructor_defaults(optimizer))
        except TypeError as error:
            raise RuntimeError(
                f"with --backend fsdp, {type(optimizer).__name__} could not be rebuilt on the "
                f"sharded parameters ({error}); create the optimizer after "
                "model = accelerator.prepare(model), from model.parameters()"
            ) from None
        self._bound.update(id(p) for group in groups for p in group["params"])
        if held is not None:
            self.load_optimizer_state_dict(rebuilt, held)
        return rebuilt

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer, keep: bool) -> dict[str, Any]:
        if not self.state.distributed:
            return optimizer.state_dict()
        # a collective when a state entry is sharded (none before the first step)
        sharded = any(
            isinstance(value, DTensor)
            for entries in optimizer.state.values()
            for value in entries.values()
        )
        with collective_record.during("get_state_dict" if sharded else None):
            return whole_from_shards(optimizer, keep=keep)

    def load_optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]
    ) -> None:
        if self.state.distributed:
            state_dict = shard_whole_state(optimizer, state_dict)
        optimizer.load_state_dict(state_dict)

    def reduces_in_backward(self, models: Sequence[torch.nn.Module], sync: bool) -> bool:
        return sync and any(isinstance(model, FSDPModule) for model in models)

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        if isinstance(model, FSDPModule):
            return _without_gradient_sync(model)
        return contextlib.nullcontext()

    def clip_grad_norm_(
        self, parameters: Any, max_norm: float, norm_type: float
    ) -> torch.Tensor | None:
        parameters = list(parameters)
        # over sharded gradients the norm is reduced across ranks (torch's DTensor collectives,
        # which `collective_record` does not see by themselves)
        sharded = self.state.distributed and any(isinstance(p, DTensor) for p in parameters)
        with collective_record.during("clip_grad_norm_" if sharded else None):
            total = torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)
            full = getattr(total, "full_tensor", None)  # a DTensor norm over sharded gradients
            return full() if full is not None else total

    def model_state_dict(self, model: torch.nn.Module, keep: bool) -> dict[str, torch.Tensor]:
        """Each shard gathered whole in turn (the state dict's order, the same on every rank),
        copied to the CPU by the ranks that ``keep`` it, as torch's ``get_model_state_dict``
        with ``full_state_dict`` and ``cpu_offload`` does for rank 0 alone (it cannot keep the
        state on another rank: with ``save_on_each_node`` every node's local main process
        writes it). A tensor under two keys (tied weights) is gathered once."""
        if not isinstance(model, FSDPModule):
            return super().model_state_dict(model, keep)
        # each shard's gather is a collective of torch's DTensor, which the record does not
        # see: recorded as one, at the script's line, so that a get_state_dict reached on the
        # main process only is named in seconds like any collective, not at --hang-timeout
        with collective_record.during("get_state_dict" if self.state.distributed else None):
            return self._whole_model_state(model, keep)

    def _whole_model_state(self, model: FSDPModule, keep: bool) -> dict[str, Any]:
        copies: dict[int, Any] = {}
        state: dict[str, Any] = {}
        for key, value in model.state_dict(keep_vars=True).items():  # tied: one object
            if id(value) not in copies:
                if isinstance(value, DTensor):
                    copies[id(value)] = gathered(value, keep)
                elif isinstance(value, torch.Tensor):
                    copies[id(value)] = value.detach().to("cpu", copy=True) if keep else None
                else:
                    copies[id(value)] = value
            if keep:
                state[key] = copies[id(value)]
        return state

    def save_checkpoint(
        self, models: Sequence[Any], optimizers: Sequence[Any], directory: Path
    ) -> None:
        # the whole save is recorded as one collective: dcp's planning gathers (through
        # torch.distributed's own functions) and its DTensor collectives inside it are not
        # recorded one by one
        with collective_record.during("save_state" if self.state.distributed else None):
            self._save_checkpoint(models, optimizers, directory)

    def _save_checkpoint(
        self, models: Sequence[Any], optimizers: Sequence[Any], directory: Path
    ) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        for index, (model, owned) in enumerate(_optimizers_by_model(models, optimizers)):
            model_state, optimizer_state = get_state_dict(model, owned)
            dcp.save(
                {"model": model_state, "optimizer": optimizer_state},
                checkpoint_id=directory / f"fsdp_model_{index}",
            )

    def load_checkpoint(
        self, models: Sequence[Any], optimizers: Sequence[Any], directory: Path
    ) -> None:
        with collective_record.during("load_state" if self.state.distributed else None):
            self._load_checkpoint(models, optimizers, directory)

    def _load_checkpoint(
        self, models: Sequence[Any], optimizers: Sequence[Any], directory: Path
    ) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        for index, (model, owned) in enumerate(_optimizers_by_model(models, optimizers)):
            source = directory / f"fsdp_model_{index}"
            if not source.is_dir():
                raise FileNotFoundError(
                    f"{source} is missing: the checkpoint holds fewer models than were prepared, "
                    "or was not written with --backend fsdp"
                )
            model_state, optimizer_state = get_state_dict(model, owned)
            state = {"model": model_state, "optimizer": optimizer_state}
            dcp.load(state, checkpoint_id=source)
            set_state_dict(
                model,
                owned,
                model_state_dict=state["model"],
                optim_state_dict=state["optimizer"],
            )


@contextlib.contextmanager
def _without_gradient_sync(model: FSDPModule) -> Iterator[None]:
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def _post_order(module: torch.nn.Module) -> Iterator[torch.nn.Module]:
    for child in module.children():
        yield from _post_order(child)
    yield module


def _optimizers_by_model(
    models: Sequence[Any], optimizers: Sequence[Any]
) -> list[tuple[Any, list[torch.optim.Optimizer]]]:
    """Each model with the (inner) optimizers that step its parameters."""
    pairs = []
    for model in models:
        ids = {id(p) for p in model.parameters()}
        owned = [
            opt.optimizer
            for opt in optimizers
            if any(id(p) in ids for group in opt.param_groups for p in group["params"])
        ]
        pairs.append((model, owned))
    return pairs


def _constructor_defaults(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's defaults that its class's constructor takes. torch's AdamW is an Adam
    whose defaults hold ``decoupled_weight_decay``, which ``AdamW()`` does not take; every group
    handed to the constructor carries its own value of each default anyway."""
    parameters = inspect.signature(type(optimizer).__init__).parameters.values()
    if any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters):
        return dict(optimizer.defaults)
    names = {parameter.name for parameter in parameters}
    return {key: value for key, value in optimizer.defaults.items() if key in names}
