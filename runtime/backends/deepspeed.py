"""DeepSpeed ZeRO stages 0-3 (``deepspeed.initialize``), imported only when chosen.

``prepare(model, optimizer, loader)`` builds the engine from the model and the user's torch
optimizer; the DeepSpeed config is the user's JSON (``--deepspeed-config``) with its ``"auto"``
values (and missing ones) filled from what accelify knows: the prepared DataLoader's batch size,
the Accelerator's accumulation steps, the mixed precision and the ZeRO stage flag. Then
``accelerator.backward`` is ``engine.backward`` (DeepSpeed divides by its own accumulation
steps; accelify tells it where each accumulation boundary is), the prepared optimizer's ``step``
is ``engine.step`` and its ``zero_grad`` a no-op, ``clip_grad_norm_`` becomes the engine's
``gradient_clipping``, and checkpoints are the engine's own (``save_checkpoint``). The model's
whole state (``get_state_dict(model)``) is `zero_model_states`'s: the fp32 master weights of a
bf16/fp16 run, one tensor at a time, copied by the ranks that save it alone. The whole
optimizer state in torch's format (``get_state_dict(optimizer)``, and a load of it, also into an
optimizer that held a state when it was prepared) goes through DeepSpeed's
``safe_get_full_optimizer_state``/``safe_set_full_optimizer_state`` (`optimizer_states`), the
main process keeping what is gathered; at stage 0 in fp32 it is the torch optimizer's own, and
under stage 0's ``FP16_Optimizer``/``FP16_UnfusedOptimizer`` (fp16, bf16) it is refused,
naming ``save_state``.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from accelify.runtime.backends.base import Backend, BackendInputs
from accelify.runtime.full_state_loads import (
    accept_full_state_dicts_partitioned,
    refresh_masters_after_loads,
)
from accelify.runtime.gradient_state import GradientState
from accelify.runtime.optimizer_states import (
    UnassembledStates,
    ZeroOptimizerStates,
    is_whole_state,
)
from accelify.runtime.options import DeepSpeedOptions
from accelify.runtime.options.deepspeed import read_config as read_deepspeed_config
from accelify.runtime.state import ProcessState
from accelify.runtime.zero_model_states import whole_model_state

DEFAULT_STAGE = 2
QUIET = 2**31 - 1  # steps_per_print: DeepSpeed's own progress lines stay off unless asked for


def _storage(tensor: torch.Tensor) -> int:
    """The identity of ``tensor``'s storage, which its views and detached copies share (an
    empty partition has no data pointer to tell it apart)."""
    return tensor.untyped_storage()._cdata


def _import_deepspeed(state: ProcessState) -> Any:
    """DeepSpeed, imported for a run on ``state``'s device. On the CPU it is told so first:
    otherwise it probes for GPUs and prints a warning on stdout before choosing the CPU."""
    if state.device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    return deepspeed


class DeepSpeedBackend(Backend):
    name = "deepspeed"
    scales_loss_for_accumulation = True
    scales_fp16 = True

    def __init__(
        self,
        state: ProcessState,
        mixed_precision: str = "no",
        options: DeepSpeedOptions | None = None,
        gradient_state: GradientState | None = None,
    ) -> None:
        super().__init__(state, mixed_precision)
        self.deepspeed = _import_deepspeed(state)
        self.options = options or DeepSpeedOptions()
        self.gradient_state = gradient_state or GradientState()
        self._engines: dict[int, tuple[Any, Any, Any]] = {}  # id(user opt) -> engine, opt, whole
        self.engines: list[Any] = []

    @classmethod
    def create(cls, inputs: BackendInputs) -> Backend:
        return cls(inputs.state, inputs.mixed_precision, inputs.options, inputs.gradient_state)

    @property
    def owns_checkpoints(self) -> bool:  # type: ignore[override]
        return self.state.distributed

    def wrap_model(self, model: torch.nn.Module, companions: Sequence[Any]) -> torch.nn.Module:
        model = model.to(self.state.device)
        if not self.state.distributed:
            return model
        config = self._config(companions)
        optimizer = _optimizer_of(model, companions)
        if optimizer is None and "optimizer" not in config:
            raise RuntimeError(
                "with --backend deepspeed, prepare the model together with its optimizer: "
                "accelerator.prepare(model, optimizer, ...) (DeepSpeed builds one engine of both)"
            )
        if optimizer is not None and "optimizer" in config:
            raise RuntimeError(
                "the DeepSpeed config names an optimizer and the script prepares one too: "
                "remove one of them"
            )
        groups = [] if optimizer is None else [list(g["params"]) for g in optimizer.param_groups]
        held = None
        if optimizer is not None and optimizer.state:
            # loaded (or stepped) before prepare: DeepSpeed would keep it under parameters its
            # flat partitions replace; loaded again into the engine's optimizer below
            held = optimizer.state_dict()
            optimizer.state = collections.defaultdict(dict)
        engine, engine_optimizer, _, _ = self.deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            model_parameters=None if optimizer is not None else model.parameters(),
            config=config,
        )
        if optimizer is not None:
            whole = _whole_states(engine, optimizer, groups)
            self._engines[id(optimizer)] = (engine, engine_optimizer, whole)
            if held is not None:
                (whole or engine_optimizer).load_state_dict(held)
        self.engines.append(engine)
        refresh = getattr(engine.optimizer, "refresh_fp32_params", None)
        if engine.zero_optimization_stage() == 3:
            accept_full_state_dicts_partitioned(engine.module, refresh)
        else:
            refresh_masters_after_loads(engine.module, refresh)
        return engine

    def _config(self, companions: Sequence[Any]) -> dict[str, Any]:
        config = (
            read_deepspeed_config(self.options.config_file)
            if self.options.config_file is not None
            else {}
        )
        zero = config.setdefault("zero_optimization", {})
        if _auto(zero.get("stage")):
            zero["stage"] = (
                self.options.zero_stage if self.options.zero_stage is not None else DEFAULT_STAGE
            )
        if self.options.offload_optimizer:
            zero.setdefault("offload_optimizer", {"device": "cpu"})
        if self.options.offload_params:
            zero.setdefault("offload_param", {"device": "cpu"})
        if _auto(config.get("train_micro_batch_size_per_gpu")):
            config["train_micro_batch_size_per_gpu"] = _batch_size(companions)
        if _auto(config.get("gradient_accumulation_steps")):
            config["gradient_accumulation_steps"] = self.gradient_state.accumulation_steps
        else:  # the user's JSON wins: the Accelerator accumulates as DeepSpeed does
            self.gradient_state.accumulation_steps = int(config["gradient_accumulation_steps"])
        if _auto(config.get("train_batch_size")):
            config.pop("train_batch_size", None)  # DeepSpeed derives it
        if _auto(config.get("gradient_clipping")):
            # DeepSpeed's default is 1.0: every step of a script that never clips would be
            # clipped. Off, as in the script, unless --gradient-clipping asks;
            # accelerator.clip_grad_norm_ sets the limit.
            clipping = self.options.gradient_clipping
            config["gradient_clipping"] = 0.0 if clipping is None else float(clipping)
        for section, mode in (("bf16", "bf16"), ("fp16", "fp16")):
            wanted = self.mixed_precision == mode
            current = config.get(section, {}).get("enabled")
            if _auto(current):
                config[section] = {**config.get(section, {}), "enabled": wanted}
            elif bool(current) != wanted:
                raise RuntimeError(
                    f"the DeepSpeed config has {section}.enabled={current} but the run uses "
                    f"--mixed-precision {self.mixed_precision}: make them agree"
                )
        config.setdefault("zero_allow_untested_optimizer", True)  # the user's torch optimizer
        config.setdefault("steps_per_print", QUIET)
        return config

    def bind_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        found = self._engines.get(id(optimizer))
        if found is None:
            if self.state.distributed:
                raise RuntimeError(
                    "with --backend deepspeed, prepare this optimizer together with its model"
                )
            return optimizer
        engine, engine_optimizer, whole = found
        return EngineStepOptimizer(engine, engine_optimizer, optimizer, whole)

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer, keep: bool) -> dict[str, Any]:
        whole = getattr(optimizer, "whole", None)
        if whole is None:
            return optimizer.state_dict()
        return whole.state_dict(keep=keep)

    def load_optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]
    ) -> None:
        whole = getattr(optimizer, "whole", None)
        if whole is not None and is_whole_state(state_dict):
            whole.load_state_dict(state_dict)
        else:
            optimizer.load_state_dict(state_dict)

    def partition_test(self) -> Callable[[torch.Tensor], bool]:
        """The storages of this rank's partitions: under ZeRO-3 each parameter's data (empty
        until gathered; a module's ``state_dict()`` holds views of it), and at every stage the
        ZeRO optimizer's flat fp32 partitions and their moments (its ``state_dict()``)."""
        storages: set[int] = set()
        for engine in self.engines:
            stage = engine.zero_optimization_stage()
            if stage == 3:
                storages.update(
                    _storage(p.data)
                    for p in engine.module.parameters()
                    if p.numel() == 0 and getattr(p, "ds_numel", 0) > 0
                )
            inner = getattr(engine.optimizer, "optimizer", None) if stage > 0 else None
            if isinstance(inner, torch.optim.Optimizer):
                storages.update(_storage(p) for g in inner.param_groups for p in g["params"])
                storages.update(
                    _storage(value)
                    for state in inner.state.values()
                    for value in state.values()
                    if isinstance(value, torch.Tensor) and value.dim() > 0
                )
        return lambda tensor: bool(storages) and _storage(tensor) in storages

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        inner = model.module if isinstance(model, self.deepspeed.DeepSpeedEngine) else model
        return super().unwrap_model(inner)

    def backward(self, loss: torch.Tensor, sync: bool, **kwargs: Any) -> None:
        engine = self._engine_of(loss)
        if engine is None:
            loss.backward(**kwargs)
            return
        engine.set_gradient_accumulation_boundary(sync)
        engine.backward(loss, **kwargs)

    def reduces_in_backward(self, models: Sequence[torch.nn.Module], sync: bool) -> bool:
        return sync and bool(self.engines)

    def _engine_of(self, loss: torch.Tensor) -> Any:
        if len(self.engines) == 1:
            return self.engines[0]
        if not self.engines:
            return None
        raise RuntimeError(
            "with --backend deepspeed and several prepared models, each backward belongs to one "
            "engine; call engine.backward(loss) on the model's engine directly"
        )

    def clip_grad_norm_(
        self, parameters: Any, max_norm: float, norm_type: float
    ) -> torch.Tensor | None:
        """DeepSpeed clips inside ``engine.step`` (over the partitioned gradients): the limit goes
        to the engine, and the norm is not known before the step, so None is returned."""
        if not self.engines:
            return super().clip_grad_norm_(parameters, max_norm, norm_type)
        if float(norm_type) != 2.0:
            raise ValueError("DeepSpeed clips by the L2 norm only (norm_type=2)")
        for engine in self.engines:
            engine._config.gradient_clipping = float(max_norm)
            if hasattr(engine.optimizer, "clip_grad"):
                engine.optimizer.clip_grad = float(max_norm)
        return None

    def model_state_dict(self, model: torch.nn.Module, keep: bool) -> dict[str, torch.Tensor]:
        if not isinstance(model, self.deepspeed.DeepSpeedEngine):
            return super().model_state_dict(model, keep)
        return whole_model_state(model, keep)

    def save_checkpoint(
        self, models: Sequence[Any], optimizers: Sequence[Any], directory: Path
    ) -> None:
        for index, engine in enumerate(self.engines):
            engine.save_checkpoint(str(directory / f"deepspeed_{index}"), tag="state")

    def load_checkpoint(
        self, models: Sequence[Any], optimizers: Sequence[Any], directory: Path
    ) -> None:
        for index, engine in enumerate(self.engines):
            source = directory / f"deepspeed_{index}"
            if not source.is_dir():
                raise FileNotFoundError(
                    f"{source} is missing: the checkpoint was not written with --backend deepspeed"
                )
            loaded, _ = engine.load_checkpoint(
                str(source), tag="state", load_lr_scheduler_states=False
            )
            if loaded is None:
                raise FileNotFoundError(f"DeepSpeed found no checkpoint in {source}")


class EngineStepOptimizer(torch.optim.Optimizer):
    """The optimizer the script steps: ``step`` is ``engine.step`` (which steps at accumulation
    boundaries and zeroes the gradients), ``zero_grad`` does nothing. ``param_groups`` are the
    user optimizer's, so LR schedulers built on it keep working."""

    def __init__(
        self,
        engine: Any,
        engine_optimizer: Any,
        user_optimizer: Any,
        whole: ZeroOptimizerStates | UnassembledStates | None = None,
    ) -> None:
        self.engine = engine
        self.engine_optimizer = engine_optimizer
        self.user_optimizer = user_optimizer
        #: the whole state in torch's format, where DeepSpeed's wrapper keeps it its own way
        #: (`optimizer_states`); None where the torch optimizer steps itself
        self.whole = whole
        self.defaults = user_optimizer.defaults

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.user_optimizer.param_groups

    @param_groups.setter
    def param_groups(self, groups: list[dict[str, Any]]) -> None:
        self.user_optimizer.param_groups = groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.user_optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.user_optimizer.state = value

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        self.engine.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return self.engine_optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.engine_optimizer.load_state_dict(state_dict)


def _whole_states(
    engine: Any, optimizer: torch.optim.Optimizer, groups: Sequence[Sequence[torch.nn.Parameter]]
) -> ZeroOptimizerStates | UnassembledStates | None:
    """How the optimizer's whole state is gathered and loaded in torch's format: through each
    parameter's fragment (``safe_get_full_optimizer_state``) under every ZeRO stage and under
    ``BF16_Optimizer`` (DeepSpeed's at ZeRO-1 with bf16, and at stage 0 under pipeline
    parallelism), which partitions its fp32 state and maps each fragment the same way; by torch
    itself where the engine steps the user's optimizer (stage 0 in fp32); refused under another
    wrapper (``FP16_Optimizer``, ``FP16_UnfusedOptimizer``: fp16 or bf16 at stage 0)."""
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer

    wrapper = engine.optimizer
    if engine.zero_optimization_stage() > 0 or isinstance(wrapper, BF16_Optimizer):
        return ZeroOptimizerStates(groups, wrapper)
    if wrapper is optimizer:
        return None
    return UnassembledStates(type(wrapper).__name__)


def _auto(value: Any) -> bool:
    return value is None or value == "auto"


def _batch_size(companions: Sequence[Any]) -> int:
    for obj in companions:
        if isinstance(obj, DataLoader) and obj.batch_size is not None:
            return int(obj.batch_size)
    raise RuntimeError(
        "with --backend deepspeed, pass the training DataLoader to the same "
        "accelerator.prepare(...) call as the model (DeepSpeed needs its batch size), or set "
        "train_micro_batch_size_per_gpu in the DeepSpeed config"
    )


def _optimizer_of(model: torch.nn.Module, companions: Sequence[Any]) -> Any:
    ids = {id(p) for p in model.parameters()}
    for obj in companions:
        if isinstance(obj, torch.optim.Optimizer) and any(
            id(p) in ids for group in obj.param_groups for p in group["params"]
        ):
            return obj
    return None
