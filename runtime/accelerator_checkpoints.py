"""The Accelerator's checkpoint methods: ``save_state``/``load_state`` with their pre-hooks,
numbered project checkpoints and ``register_for_checkpointing``. The files themselves are
`checkpoint`'s; where numbered checkpoints go is `project`'s."""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch.utils.hooks import RemovableHandle

from accelify.runtime import checkpoint, operations, project

if TYPE_CHECKING:
    import torch

    from accelify.runtime.backends.base import Backend
    from accelify.runtime.data import PreparedDataLoader
    from accelify.runtime.optimizer import PreparedOptimizer
    from accelify.runtime.scheduler import PreparedScheduler


class CheckpointMethods:
    """Mixed into `Accelerator`, whose state these read."""

    backend: Backend
    scaler: Any
    project_configuration: project.ProjectConfiguration
    _models: list[torch.nn.Module]
    _optimizers: list[PreparedOptimizer]
    _schedulers: list[PreparedScheduler]
    _dataloaders: list[PreparedDataLoader]
    _custom_objects: list[Any]
    is_main_process: bool
    process_index: int
    num_processes: int
    get_state_dict: Callable[..., Any]
    unwrap_model: Callable[..., Any]
    wait_for_everyone: Callable[[], None]

    def _init_checkpoint_hooks(self) -> None:
        # OrderedDict: torch's RemovableHandle holds its dict by weak reference
        self._save_state_pre_hooks: OrderedDict[int, Callable[..., None]] = OrderedDict()
        self._load_state_pre_hooks: OrderedDict[int, Callable[..., None]] = OrderedDict()

    def register_for_checkpointing(self, *objects: Any) -> None:
        for obj in objects:
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise TypeError(
                    f"{type(obj).__name__} cannot be checkpointed: it needs state_dict() and "
                    "load_state_dict()"
                )
        self._custom_objects.extend(objects)

    def _checkpoint_parts(
        self, model_states: list[Any] | None = None, models: list[Any] | None = None
    ) -> list[checkpoint.Checkpointable]:
        """Saving: ``model_states`` are filled in once the pre-hooks ran. Loading: ``models``
        are those the pre-hooks left to `load_state`."""
        engine_parts = ("model", "optimizer") if self.backend.owns_checkpoints else ()
        if model_states is not None:
            model_part = checkpoint.Checkpointable("model", model_states, _itself, _not_loaded)
        else:
            model_part = checkpoint.Checkpointable(
                "model",
                self._models if models is None else models,
                self.get_state_dict,
                lambda model, state: self.unwrap_model(model).load_state_dict(state),
            )
        parts = [
            model_part,
            checkpoint.Checkpointable("optimizer", self._optimizers, _state_dict, _load_state_dict),
            checkpoint.Checkpointable(
                "scheduler", self._schedulers, _state_dict, _load_state_dict, trusted_pickle=True
            ),
            checkpoint.Checkpointable(
                "dataloader", self._dataloaders, _state_dict, _load_state_dict
            ),
            checkpoint.Checkpointable(
                "custom", self._custom_objects, _state_dict, _load_state_dict, trusted_pickle=True
            ),
        ]
        if self.scaler is not None:
            parts.append(
                checkpoint.Checkpointable("scaler", [self.scaler], _state_dict, _load_state_dict)
            )
        return [part for part in parts if part.stem not in engine_parts]

    def _engine_checkpoint(self, save: bool) -> Callable[[Path], None] | None:
        if not self.backend.owns_checkpoints:
            return None
        method = self.backend.save_checkpoint if save else self.backend.load_checkpoint
        return lambda directory: method(self._models, self._optimizers, directory)

    def save_state(self, output_dir: str | os.PathLike[str] | None = None) -> str:
        """Save models, optimizers, schedulers, scaler, data positions, custom objects and every
        rank's RNG states; a collective: call it on every rank. With
        ``ProjectConfiguration(automatic_checkpoint_naming=True)`` (or no ``output_dir`` and a
        project directory) it writes ``<project_dir>/checkpoints/checkpoint_<iteration>``."""
        output_dir = self._agreed_directory(
            project.checkpoint_to_write(
                self.project_configuration, output_dir, self.is_main_process
            ),
            "save_state",
            "saves into",
        )
        model_states: list[Any] = []
        saved = checkpoint.save(
            output_dir,
            self._checkpoint_parts(model_states),
            self.process_index,
            self.is_main_process,
            self.wait_for_everyone,
            self._engine_checkpoint(save=True),
            before_write=lambda staging: self._run_save_hooks(staging, model_states),
        )
        return str(saved)

    def _agreed_directory(self, directory: Path, operation: str, verb: str) -> Path:
        """The main process's directory, on every rank: a rank given another one (a path built
        from its rank, a clock, a `tempfile.TemporaryDirectory()` of its own) would write its
        part where no one reads it, or read a checkpoint that is not there."""
        if self.num_processes == 1:
            return directory
        chosen = Path(operations.gather_object(str(directory))[0])
        if chosen != directory:
            warnings.warn(
                f"{operation}: rank {self.process_index} was given {directory}, the main process "
                f"{chosen}; every rank {verb} {chosen}",
                stacklevel=3,
            )
        return chosen

    def _run_save_hooks(self, staging: Path, model_states: list[Any]) -> None:
        """The state dicts to save, after the pre-hooks had their say: a hook that saves a
        model its own way pops its entry from ``weights``. Under FSDP and DeepSpeed the engine
        saves the models and ``weights`` is empty."""
        if self.backend.owns_checkpoints:
            weights: list[Any] = []
        elif self.is_main_process or self._save_state_pre_hooks:
            weights = [self.get_state_dict(model) for model in self._models]
        else:
            weights = []
        for hook in self._save_state_pre_hooks.values():
            hook(list(self._models), weights, str(staging))
        model_states[:] = weights

    def load_state(self, input_dir: str | os.PathLike[str] | None = None) -> None:
        """Restore what `save_state` wrote; prepared DataLoaders resume the interrupted pass."""
        if input_dir is None:
            input_dir = project.latest_checkpoint(self.project_configuration)
        input_dir = self._agreed_directory(Path(input_dir), "load_state", "reads")
        models = list(self._models)
        for hook in self._load_state_pre_hooks.values():
            hook(models, str(input_dir))
        checkpoint.load(
            input_dir,
            self._checkpoint_parts(models=models),
            self.process_index,
            self._engine_checkpoint(save=False),
        )
        self.wait_for_everyone()

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """``hook(models, weights, output_dir)`` runs in `save_state` before anything is written
        (on every rank); popping from ``weights`` leaves that model to the hook."""
        handle = RemovableHandle(self._save_state_pre_hooks)
        self._save_state_pre_hooks[handle.id] = hook
        return handle

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """``hook(models, input_dir)`` runs in `load_state` before anything is read; popping
        from ``models`` leaves that model to the hook."""
        handle = RemovableHandle(self._load_state_pre_hooks)
        self._load_state_pre_hooks[handle.id] = hook
        return handle


def _itself(state: Any) -> Any:
    return state


def _not_loaded(obj: Any, state: Any) -> None:  # pragma: no cover - a saving part only
    raise AssertionError("a part built for saving was asked to load")


def _state_dict(obj: Any) -> Any:
    return obj.state_dict()


def _load_state_dict(obj: Any, state: Any) -> None:
    obj.load_state_dict(state)
