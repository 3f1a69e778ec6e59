"""PyTorch DistributedDataParallel; on one process the model is left unwrapped.

``gradient_as_bucket_view=True``: gradients live in DDP's all-reduce buckets instead of being
copied out of them after every backward; results are bit-identical (bench/runtime_overhead.py).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from accelify.runtime import collective_record, ddp_collectives
from accelify.runtime.backends.base import Backend, BackendInputs
from accelify.runtime.kwargs_handlers import COMM_HOOK_FIELDS, DDPCommunicationHookType
from accelify.runtime.state import ProcessState


class DDPBackend(Backend):
    name = "ddp"
    #: the reducer's all-reduces start in its gradient hooks and end in the pass's final
    #: callback; a comm hook runs there too
    collectives_in_autograd = True

    def __init__(self, state: ProcessState, mixed_precision: str = "no", **ddp_kwargs: Any):
        super().__init__(state, mixed_precision)
        self.comm_hook = {k: ddp_kwargs.pop(k) for k in COMM_HOOK_FIELDS if k in ddp_kwargs}
        self.ddp_kwargs = {"gradient_as_bucket_view": True, **ddp_kwargs}

    @classmethod
    def create(cls, inputs: BackendInputs) -> Backend:
        return cls(inputs.state, inputs.mixed_precision, **inputs.ddp_kwargs)

    @classmethod
    def at_exit(cls) -> None:
        """DDP wrappers that are module globals outlive `destroy_process_group` and free the
        group during interpreter finalization, where gloo's worker threads can no longer take
        the GIL to drop the tensors they hold (SIGABRT). Each wrapper's reducer and logger own
        the group in C++, out of `let_go_of_groups`'s sight: they are dropped first, then every
        Python reference to a group (the wrappers', a script's own ``dist.new_group``), so that
        the exit guard frees the groups (through their Python handles: see
        `accelify.runtime.state._ExitGuard`)."""
        for model in list(WRAPPED_MODELS):
            for attribute in ("reducer", "logger"):
                model.__dict__.pop(attribute, None)
        super().at_exit()

    @classmethod
    def group_holders(cls) -> list[torch.nn.Module]:
        """The wrappers keep their group (``process_group``)."""
        return list(WRAPPED_MODELS)

    def wrap_model(self, model: torch.nn.Module, companions: Sequence[Any]) -> torch.nn.Module:
        model = model.to(self.state.device)
        if not self.state.distributed or not has_trainable_parameters(model):
            return model
        device_ids = [self.state.device.index] if self.state.device.type == "cuda" else None
        with ddp_collectives.built_by_the_runtime():
            wrapped = DistributedDataParallel(model, device_ids=device_ids, **self.ddp_kwargs)
        WRAPPED_MODELS.add(wrapped)
        register_comm_hook(wrapped, **self.comm_hook)
        if collective_record.recording():
            ddp_collectives.record_forwards(wrapped)
        return wrapped

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        while isinstance(model, (DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        return super().unwrap_model(model)

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        if isinstance(model, DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()

    def sync_in_backward(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        if isinstance(model, DistributedDataParallel):
            return _synced_backward(model)
        return contextlib.nullcontext()

    def steps_locally(self, optimizer: torch.optim.Optimizer) -> bool:
        """DDP leaves the optimizer to the script: torch.optim's own optimizers update each
        rank's replica alone. Another one may communicate (torch.distributed.optim's
        ZeroRedundancyOptimizer broadcasts the new parameters, a subclass may all-reduce)."""
        return type(optimizer).__module__.startswith("torch.optim.")

    def joinable(self, model: torch.nn.Module) -> bool:
        return isinstance(model, DistributedDataParallel)

    def reduces_in_backward(self, models: Sequence[torch.nn.Module], sync: bool) -> bool:
        """DDP reduces unless its `no_sync` is on, whatever the accumulation state says. (A
        loop, not ``any`` over a generator: asked at every recorded backward.)"""
        for model in models:
            if isinstance(model, DistributedDataParallel) and model.require_backward_grad_sync:
                return True
        return False

    # clip_grad_norm_: DDP gradients are already averaged across ranks, so the local norm is the
    # global one (the default).


def register_comm_hook(
    model: DistributedDataParallel,
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO,
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO,
    comm_state_option: dict[str, Any] | None = None,
) -> None:
    """The script's `DistributedDataParallelKwargs` communication hook, as HF registers it:
    torch's own hooks, PowerSGD with its state built from ``comm_state_option``."""
    if comm_hook is DDPCommunicationHookType.NO:
        return
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    hooks = {
        DDPCommunicationHookType.FP16: default_hooks.fp16_compress_hook,
        DDPCommunicationHookType.BF16: default_hooks.bf16_compress_hook,
        DDPCommunicationHookType.POWER_SGD: powerSGD_hook.powerSGD_hook,
        DDPCommunicationHookType.BATCHED_POWER_SGD: powerSGD_hook.batched_powerSGD_hook,
    }
    wrappers = {
        DDPCommunicationHookType.FP16: default_hooks.fp16_compress_wrapper,
        DDPCommunicationHookType.BF16: default_hooks.bf16_compress_wrapper,
    }
    hook = hooks[comm_hook]
    if comm_wrapper in wrappers:
        hook = wrappers[comm_wrapper](hook)
    power_sgd = comm_hook in (
        DDPCommunicationHookType.POWER_SGD,
        DDPCommunicationHookType.BATCHED_POWER_SGD,
    )
    state = powerSGD_hook.PowerSGDState(None, **(comm_state_option or {})) if power_sgd else None
    model.register_comm_hook(state=state, hook=hook)


#: DDP wrappers created by this process (weakly held), released at exit.
WRAPPED_MODELS: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def has_trainable_parameters(model: torch.nn.Module) -> bool:
    return any(p.requires_grad for p in model.parameters())


@contextlib.contextmanager
def _synced_backward(model: DistributedDataParallel) -> Iterator[None]:
    """DDP reduces in a backward only when its forward ran with sync on; this turns sync on
    and readies the reducer for a backward whose forward ran under `no_sync` (HF's
    `trigger_sync_in_backward`)."""
    saved = model.require_backward_grad_sync, model.require_forward_param_sync
    model.require_backward_grad_sync = model.require_forward_param_sync = True
    model.reducer.prepare_for_backward([])
    ddp_collectives.REDUCED.add(model)
    try:
        yield
    finally:
        model.require_backward_grad_sync, model.require_forward_param_sync = saved
