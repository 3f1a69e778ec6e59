"""`Accelerator`: the object a converted script talks to, with Hugging Face Accelerate's names.

It holds the process state and delegates: models to the chosen backend, batches to
`PreparedDataLoader`, steps to `PreparedOptimizer`/`PreparedScheduler`, collectives to
`operations`, checkpoints to `checkpoint`. One process with no launcher is plain single-device
training: nothing is wrapped, nothing is communicated, and the losses are those of the
unprepared script, bit for bit.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from accelify.runtime import collective_record, operations, pending_work, tracking
from accelify.runtime import kwargs_handlers as kwargs_handlers_module
from accelify.runtime.accelerator_checkpoints import CheckpointMethods
from accelify.runtime.backends import create_backend
from accelify.runtime.backends.base import Backend
from accelify.runtime.data import PreparedDataLoader
from accelify.runtime.data_loader_api import skip_first_batches
from accelify.runtime.environment import LaunchSettings
from accelify.runtime.gradient_state import GradientState
from accelify.runtime.kwargs_handlers import (
    DistributedDataParallelKwargs,
    DistributedType,
    GradScalerKwargs,
    InitProcessGroupKwargs,
)
from accelify.runtime.optimizer import PreparedOptimizer
from accelify.runtime.partial_saves import refuse_one_ranks_part
from accelify.runtime.partial_state import AcceleratorState, ProcessMethods
from accelify.runtime.plugins import DataLoaderConfiguration, GradientAccumulationPlugin
from accelify.runtime.precision import Precision, restore_forward
from accelify.runtime.project import ProjectConfiguration
from accelify.runtime.scheduler import PreparedScheduler, repoint_scheduler
from accelify.runtime.serialization import save_model_files, write_atomically
from accelify.runtime.state import DEFAULT_TIMEOUT, destroy_process_groups, shared_state
from accelify.runtime.tracking import TrackerMethods

#: `Accelerator.backward` reads it at every step: a module's own name is one lookup. (Not the
#: token too: `pending_work.in_flight` counts its references beyond its module's own.)
_IN_BACKWARD = pending_work.IN_BACKWARD

_SCHEDULER_TYPES: tuple[type, ...] = (
    torch.optim.lr_scheduler.LRScheduler,
    torch.optim.lr_scheduler.ReduceLROnPlateau,
)


class Accelerator(ProcessMethods, CheckpointMethods, TrackerMethods):
    """Run the same training code on one device or on N processes.

    Example::

        accelerator = Accelerator()
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()

    Arguments left at their defaults take the launcher's settings (``ACCELIFY_*`` variables, see
    `accelify.runtime.environment`); explicit arguments win.
    """

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool = False,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int = 1,
        cpu: bool = False,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        project_dir: str | os.PathLike[str] | None = None,
        step_scheduler_with_optimizer: bool = True,
        even_batches: bool = True,
        log_with: Any = None,
        project_config: ProjectConfiguration | None = None,
        kwargs_handlers: list[Any] | None = None,
        dataloader_config: DataLoaderConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
    ) -> None:
        if deepspeed_plugin is not None or fsdp_plugin is not None:
            raise NotImplementedError(
                "deepspeed_plugin and fsdp_plugin are not supported: choose the engine at launch, "
                "accelify launch --backend fsdp|deepspeed (or in the config file)"
            )
        dataloader_config = dataloader_config or DataLoaderConfiguration(
            split_batches=split_batches, even_batches=even_batches
        )
        dataloader_config.check()
        if gradient_accumulation_plugin is not None:
            if gradient_accumulation_steps != 1:
                raise ValueError(
                    "give gradient_accumulation_steps or gradient_accumulation_plugin, not both"
                )
            gradient_accumulation_steps = gradient_accumulation_plugin.steps()
        sync_each_batch = bool(
            gradient_accumulation_plugin and gradient_accumulation_plugin.sync_each_batch
        )
        settings = LaunchSettings.from_env()
        if gradient_accumulation_steps == 1 and settings.gradient_accumulation_steps:
            gradient_accumulation_steps = settings.gradient_accumulation_steps
        if gradient_accumulation_steps < 1:
            raise ValueError(
                f"gradient_accumulation_steps must be >= 1, got {gradient_accumulation_steps}"
            )
        group = kwargs_handlers_module.of_type(kwargs_handlers, InitProcessGroupKwargs)
        self.process = shared_state(
            cpu=cpu or settings.use_cpu, timeout=group.get("timeout") or DEFAULT_TIMEOUT
        )
        self.state = AcceleratorState(cpu=cpu or settings.use_cpu)
        self.precision = Precision(mixed_precision or settings.mixed_precision or "no", self.device)
        self.process.mixed_precision = self.precision.mode
        self.gradient_state = GradientState(
            accumulation_steps=gradient_accumulation_steps, sync_each_batch=sync_each_batch
        )
        self.backend = create_backend(
            settings.backend,
            self.process,
            self.precision.mode,
            settings.backend_options,
            self.gradient_state,
            kwargs_handlers_module.of_type(kwargs_handlers, DistributedDataParallelKwargs),
        )
        scaler_options = kwargs_handlers_module.of_type(kwargs_handlers, GradScalerKwargs)
        self.scaler = (
            None if self.backend.scales_fp16 else self.precision.make_scaler(scaler_options)
        )
        self.device_placement = device_placement
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.dataloader_config = dataloader_config
        self.project_configuration = project_config or ProjectConfiguration()
        if project_dir is not None:
            self.project_configuration.set_directories(project_dir)
        self.log_with = tracking.requested(log_with)
        self.trackers: list[tracking.GeneralTracker] = []
        self._init_checkpoint_hooks()
        self._models: list[torch.nn.Module] = []
        #: how `backward` tracks its works: decided here, outside whatever block the script
        #: calls `backward` in, and not on the step (`_backward_tracking`)
        self._tracks_backward = _backward_tracking(self)
        #: the engine's backward is the loss's own: `backward` calls that, not the engine
        self._loss_backward = type(self.backend).backward is Backend.backward
        self._optimizers: list[PreparedOptimizer] = []
        self._schedulers: list[PreparedScheduler] = []
        self._dataloaders: list[PreparedDataLoader] = []
        self._custom_objects: list[Any] = []
        self._prepared: dict[int, Any] = {}
        self._rebound: dict[int, torch.optim.Optimizer] = {}  # user optimizer -> engine's
        self._companions: tuple[Any, ...] = ()  # the objects of the prepare call in progress
        self._trigger = torch.tensor(0.0, device=self.device)

    @property
    def project_dir(self) -> Path | None:
        directory = self.project_configuration.project_dir
        return None if directory is None else Path(directory)

    @property
    def logging_dir(self) -> Path | None:
        directory = self.project_configuration.logging_dir
        return None if directory is None else Path(directory)

    @property
    def even_batches(self) -> bool:
        return self.dataloader_config.even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self.dataloader_config.even_batches = value

    @property
    def split_batches(self) -> bool:
        return self.dataloader_config.split_batches

    @property
    def dispatch_batches(self) -> bool | None:
        return self.dataloader_config.dispatch_batches

    @property
    def mixed_precision(self) -> str:
        return self.precision.mode

    @property
    def sync_gradients(self) -> bool:
        return self.gradient_state.sync_gradients

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.gradient_state.accumulation_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, steps: int) -> None:
        self.gradient_state.accumulation_steps = steps

    @property
    def optimizer_step_was_skipped(self) -> bool:
        return any(opt.step_was_skipped for opt in self._optimizers)

    # --- prepare ------------------------------------------------------------------------------
    def prepare(self, *objects: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, DataLoaders and LR schedulers; returned in input order.

        Models come first so that optimizers and schedulers find their prepared partners,
        whatever order they were passed in. Anything else is returned unchanged, and so is an
        object prepared before.
        """
        self.state.check_current()
        placements = device_placement or [self.device_placement] * len(objects)
        if len(placements) != len(objects):
            raise ValueError("device_placement needs one entry per object passed to prepare()")
        results: list[Any] = list(objects)
        self._companions = objects
        # wrapping a model communicates (DDP checks and broadcasts its parameters)
        wraps_models = self.process.distributed and any(map(_is_model, objects))
        try:
            with collective_record.during("prepare" if wraps_models else None):
                for kind in (_is_model, _is_optimizer, _is_dataloader, _is_scheduler):
                    for index, obj in enumerate(objects):
                        if kind(obj):
                            results[index] = self._prepare_one(obj, placements[index])
        finally:
            self._companions = ()
        return results[0] if len(results) == 1 else tuple(results)

    def _prepare_one(self, obj: Any, device_placement: bool) -> Any:
        if id(obj) in self._prepared:
            return self._prepared[id(obj)]
        if isinstance(obj, (PreparedOptimizer, PreparedScheduler, PreparedDataLoader)):
            return obj
        if any(obj is model for model in self._models):
            return obj
        prepared = self._prepare_new(obj, device_placement)
        self._prepared[id(obj)] = prepared
        return prepared

    def _prepare_new(self, obj: Any, device_placement: bool) -> Any:
        if isinstance(obj, torch.nn.Module):
            if not self.backend.casts_model():
                self.precision.wrap_forward(obj)
            model = self.backend.wrap_model(obj, self._companions) if device_placement else obj
            self._models.append(model)
            return model
        if isinstance(obj, torch.optim.Optimizer):
            inner = self.backend.bind_optimizer(obj)
            if inner is not obj:
                self._rebound[id(obj)] = inner
            optimizer = PreparedOptimizer(
                inner,
                self.gradient_state,
                self.scaler,
                tracks_step=not self.backend.steps_locally(inner),
                loads=self.backend.load_optimizer_state_dict,
            )
            self._optimizers.append(optimizer)
            return optimizer
        if isinstance(obj, DataLoader):
            loader = PreparedDataLoader(
                obj,
                self.process,
                self.gradient_state,
                device_placement=device_placement,
                config=self.dataloader_config,
            )
            self._dataloaders.append(loader)
            return loader
        inner_optimizer = getattr(obj, "optimizer", None)
        if id(inner_optimizer) in self._rebound:
            inner_optimizer = self._rebound[id(inner_optimizer)]
            repoint_scheduler(obj, inner_optimizer)
        partners = [opt for opt in self._optimizers if opt.optimizer is inner_optimizer]
        scheduler = PreparedScheduler(
            obj,
            partners or list(self._optimizers),
            self.gradient_state,
            self.num_processes,
            step_with_optimizer=self.step_scheduler_with_optimizer,
            split_batches=self.split_batches,
        )
        self._schedulers.append(scheduler)
        return scheduler

    def prepare_model(self, model: torch.nn.Module, device_placement: bool | None = None) -> Any:
        placement = self.device_placement if device_placement is None else device_placement
        return self._prepare_one(model, placement)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> PreparedOptimizer:
        return self._prepare_one(optimizer, True)

    def prepare_data_loader(self, loader: DataLoader, device_placement: bool | None = None) -> Any:
        placement = self.device_placement if device_placement is None else device_placement
        return self._prepare_one(loader, placement)

    def prepare_scheduler(self, scheduler: Any) -> PreparedScheduler:
        return self._prepare_one(scheduler, True)

    # --- the training step ---------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward(**kwargs)``, divided for gradient accumulation and scaled for fp16.

        Every step runs it, so it is written for the step's cost: the state is read once, not
        through the properties, the pass is recorded (`collective_record`) in one call at each
        end and its works tracked (`pending_work`) inline, not through context managers, and
        an engine whose backward is the loss's own is not called (each a Python call or two
        more: callgrind's count of a step, docs/benchmarks.md)."""
        state, backend = self.gradient_state, self.backend
        steps = state.accumulation_steps
        if steps > 1 and not backend.scales_loss_for_accumulation:
            loss = loss / steps
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        sync = state.sync_gradients
        tracks = self._tracks_backward
        recorder = collective_record._recorder
        begun = (
            recorder.backward_begins(
                backend.reduces_in_backward(self._models, sync), sys._getframe(1)
            )
            if recorder is not None
            else None
        )
        marker = None
        try:  # from the pass's beginning: a failure anywhere in it still ends it
            if tracks == "context":
                marker = _IN_BACKWARD.set(pending_work.TOKEN)
            if tracks == "stash":
                with pending_work.tracked(True):
                    backend.backward(loss, sync, **kwargs)
            elif not self._loss_backward:
                backend.backward(loss, sync, **kwargs)
            elif kwargs:
                loss.backward(**kwargs)
            else:  # ``**{}`` would copy the empty dict and call through it
                loss.backward()
        finally:
            if marker is not None:
                _IN_BACKWARD.reset(marker)
            if begun is not None:
                recorder.backward_ends(begun)  # type: ignore[union-attr]

    @contextlib.contextmanager
    def accumulate(self, *models: torch.nn.Module) -> Iterator[None]:
        """One micro-batch: gradients are synchronised (and the optimizer steps) every
        ``gradient_accumulation_steps`` calls and on a DataLoader's last batch."""
        self.gradient_state.advance()
        with contextlib.ExitStack() as stack:
            if not self.sync_gradients and not self.gradient_state.sync_each_batch:
                for model in models:
                    stack.enter_context(self.backend.no_sync(model))
            yield

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        return self.backend.no_sync(model)

    def trigger_sync_in_backward(
        self, model: torch.nn.Module
    ) -> contextlib.AbstractContextManager[Any]:
        """Reduce the gradients in the backward inside, though its forward ran under `no_sync`
        (several forwards, then their backwards, the last one synced)."""
        return self.backend.sync_in_backward(model)

    @contextlib.contextmanager
    def join_uneven_inputs(
        self, joinables: list[Any], even_batches: bool | None = None
    ) -> Iterator[None]:
        """Let ranks with fewer batches finish early: DDP models in ``joinables`` shadow the
        collectives of the ranks that are done (`torch.distributed.algorithms.Join`).
        ``even_batches`` overrides the prepared map-style DataLoaders' setting inside."""
        ddp_kinds = (DistributedType.MULTI_GPU, DistributedType.MULTI_CPU)
        if self.distributed_type == DistributedType.NO:
            yield  # one process: nothing to join
            return
        if self.distributed_type not in ddp_kinds or not all(
            self.backend.joinable(model) for model in joinables
        ):
            warnings.warn(
                "Joining uneven inputs is only supported for multi-GPU and multi-CPU DDP "
                "training, as a result `join_uneven_inputs` will have no effect.",
                stacklevel=3,
            )
            yield
            return
        from torch.distributed.algorithms import Join

        restore = [
            (loader, loader.even_batches) for loader in self._dataloaders if loader.map_style
        ]
        if even_batches is not None:
            if len(restore) < len(self._dataloaders):
                warnings.warn(
                    "Overriding even_batches is only supported for map-style datasets, yet some "
                    "dataloaders given were iterable",
                    stacklevel=3,
                )
            for loader, _ in restore:
                loader.even_batches = even_batches
        try:
            with Join(joinables, enable=True, throw_on_early_termination=False):
                yield
        finally:
            for loader, value in restore:
                loader.even_batches = value

    def autocast(self, autocast_handler: Any = None) -> contextlib.AbstractContextManager[None]:
        return self.precision.autocast()

    def unscale_gradients(self, optimizer: Any = None) -> None:
        if self.scaler is None:
            return
        targets = [optimizer] if optimizer is not None else self._optimizers
        for opt in targets:
            inner = opt.optimizer if isinstance(opt, PreparedOptimizer) else opt
            with contextlib.suppress(RuntimeError):  # already unscaled since the last step
                self.scaler.unscale_(inner)

    def clip_grad_norm_(
        self, parameters: Any, max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        parameters = list(parameters)
        self.unscale_gradients()
        with pending_work.tracked(self.process.distributed):  # a norm over shards communicates
            return self.backend.clip_grad_norm_(parameters, max_norm, norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        parameters = list(parameters)
        self.unscale_gradients()
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    # --- collectives ---------------------------------------------------------------------------
    def gather(self, tensor: Any) -> Any:
        return operations.gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Gather for metrics: the samples repeated to even out the last round are dropped, so a
        metric over an evaluation loop counts every sample of the dataset exactly once."""
        tensors_only = _contains_only_tensors(input_data)
        if use_gather_object or not tensors_only:
            gathered = operations.gather_object(input_data)
        else:
            gathered = operations.gather(input_data)
        loader = self.gradient_state.active_loader
        if loader is None or not loader.at_last_batch or loader.padding == 0:
            return gathered
        if isinstance(gathered, list) and not tensors_only:
            return gathered[: len(gathered) - loader.padding]
        rows = operations.first_dim(gathered)
        if rows is None or rows <= loader.padding:
            return gathered
        return operations.truncate(gathered, rows - loader.padding)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        return operations.reduce(tensor, reduction, scale)

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False
    ) -> Any:
        return operations.pad_across_processes(tensor, dim, pad_index, pad_first)

    def set_trigger(self) -> None:
        """Raise a flag on this rank; `check_trigger` on every rank then sees it."""
        self._trigger.fill_(1.0)

    def check_trigger(self) -> bool:
        """True on every rank when any rank called `set_trigger` (a collective: call it on all)."""
        flag = operations.reduce(self._trigger, "sum")
        if flag.item() > 0:
            self._trigger.zero_()
            return True
        return False

    # --- models and saving ---------------------------------------------------------------------
    def unwrap_model(self, model: torch.nn.Module, keep_fp32_wrapper: bool = True) -> Any:
        inner = self.backend.unwrap_model(model)
        if not keep_fp32_wrapper:
            restore_forward(inner)
        return inner

    def get_state_dict(self, model: Any, unwrap: bool = True) -> dict[str, Any]:
        """The whole state of a prepared model (keys as in the user's module), or of a prepared
        optimizer (torch's one-process format: what ``optimizer.state_dict()`` gives on one
        process, and what the prepared optimizer's ``load_state_dict`` takes back under every
        engine). A collective under FSDP and DeepSpeed: call it on every rank; there only the
        main process gets the tensors (the others ``{}``), for ``accelerator.save`` to write.
        Hugging Face Accelerate's ``get_state_dict`` takes models only: given an optimizer it
        raises ``AttributeError`` (``'AcceleratedOptimizer' object has no attribute
        '_modules'``), on one process too."""
        if isinstance(model, torch.optim.Optimizer):
            if isinstance(model, PreparedOptimizer) and unwrap:
                return self.backend.optimizer_state_dict(model.optimizer, self._saves)
            return model.state_dict()
        if not unwrap:
            return model.state_dict()
        return self.backend.model_state_dict(model, self._saves)

    @property
    def _saves(self) -> bool:
        """Whether this process writes what `save` is given: the main process, or each
        node's local main process with ``save_on_each_node`` (which then keeps the gathered
        state too: the other ranks get ``{}``)."""
        if self.project_configuration.save_on_each_node:
            return self.is_local_main_process
        return self.is_main_process

    def save(
        self, obj: Any, f: str | os.PathLike[str] | IO[bytes], safe_serialization: bool = False
    ) -> None:
        """`torch.save` once, as HF's: on the main process, or on each node's local main process
        where the project configuration sets ``save_on_each_node``. A path is written to a
        temporary name and renamed (a crash never leaves half a file); a file object, which HF
        takes too (``torch.save`` writes to one), is written where it stands, the caller owning
        it; with ``safe_serialization`` it gets the safetensors bytes (``save_file`` takes only
        a path). An object holding one rank's part of a sharded tensor (a model's own state
        dict under FSDP or ZeRO-3) is refused on every rank (`partial_saves`)."""
        if self.num_processes > 1:
            refuse_one_ranks_part(obj, self.backend.partition_test())
        if not self._saves:
            return
        if not isinstance(f, (str, os.PathLike)):
            if safe_serialization:
                from safetensors.torch import save as safetensors_bytes

                f.write(safetensors_bytes(obj, metadata={"format": "pt"}))
            else:
                torch.save(obj, f)
            return
        if safe_serialization:
            from safetensors.torch import save_file

            write_atomically(
                Path(f), lambda tmp: save_file(obj, str(tmp), metadata={"format": "pt"})
            )
        else:
            write_atomically(Path(f), lambda tmp: torch.save(obj, tmp))

    def save_model(
        self,
        model: torch.nn.Module,
        save_directory: str | os.PathLike[str],
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """The model's whole weights as Transformers lays them out; a collective under the
        sharding engines. Written where `save` writes: on each node with
        ``save_on_each_node``, as HF's, which writes each shard through ``save``."""
        state_dict = self.get_state_dict(model)
        if self._saves:
            save_model_files(state_dict, Path(save_directory), max_shard_size, safe_serialization)

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """The loader, its next pass starting ``num_batches`` batches in (resuming mid-epoch)."""
        return skip_first_batches(dataloader, num_batches)

    def free_memory(self, *objects: Any) -> list[None]:
        """Forget every prepared object, collect garbage and empty the CUDA cache; returns one
        ``None`` per object given, to rebind them (``model, optimizer = free_memory(model,
        optimizer)``) as in Accelerate."""
        self._models.clear()
        self._optimizers.clear()
        self._schedulers.clear()
        self._dataloaders.clear()
        self._prepared.clear()
        self._rebound.clear()
        count = len(objects)
        del objects  # this call's references; the caller drops its own by rebinding
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return [None] * count

    @property
    def native_amp(self) -> bool:
        """Mixed precision through torch's autocast (HF's name)."""
        return self.mixed_precision in ("fp16", "bf16")

    def end_training(self) -> None:
        """Finish the trackers, wait for every rank, then close the process group."""
        for tracker in self.trackers:
            tracker.finish()
        self.trackers = []
        if self.process.distributed and dist.is_initialized():
            self.wait_for_everyone()
            destroy_process_groups()


def _backward_tracking(accelerator: Accelerator) -> str:
    """How `Accelerator.backward` tracks the works its pass launches (`pending_work`): "none" on
    one process (or a torch that cannot); "context" where every collective of the engine's
    backward is launched inside the autograd pass (DDP's gradient hooks) and this torch's
    backward copies the caller's context there; else "stash"."""
    if not accelerator.process.distributed or not pending_work.TRACKABLE:
        return "none"
    if accelerator.backend.collectives_in_autograd and pending_work.backward_copies_the_context():
        return "context"
    return "stash"


def _is_model(obj: Any) -> bool:
    return isinstance(obj, torch.nn.Module)


def _is_optimizer(obj: Any) -> bool:
    return isinstance(obj, torch.optim.Optimizer)


def _is_dataloader(obj: Any) -> bool:
    return isinstance(obj, (DataLoader, PreparedDataLoader))


def _is_scheduler(obj: Any) -> bool:
    return isinstance(obj, (*_SCHEDULER_TYPES, PreparedScheduler))


def _contains_only_tensors(data: Any) -> bool:
    if isinstance(data, torch.Tensor):
        return True
    if isinstance(data, (list, tuple)):
        return all(_contains_only_tensors(item) for item in data)
    if isinstance(data, dict):
        return all(_contains_only_tensors(item) for item in data.values())
    return False
