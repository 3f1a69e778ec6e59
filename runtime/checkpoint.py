"""`save_state`/`load_state`: everything a run needs to continue as if it had not stopped.

A checkpoint directory has HF Accelerate's layout, so either library reads the other's (DDP):

    model.safetensors, model_1.safetensors, ...   the unwrapped models' weights (safetensors)
    optimizer.bin, optimizer_1.bin, ...           optimizer state dicts
    scheduler.bin, ...                            LR scheduler state dicts
    scaler.pt                                     the fp16 gradient scaler
    custom_checkpoint_0.pkl, ...                  objects given to register_for_checkpointing
    random_states_<rank>.pkl                      every rank's Python, NumPy, torch (CUDA) RNG
    dataloader.bin, ...                           accelify only: each prepared DataLoader's
                                                  position in its pass (Accelerate ignores it)
    fsdp_model_0/, deepspeed/                     instead of models and optimizers under FSDP or
                                                  DeepSpeed: the engine's own sharded format

Reading also accepts Accelerate's ``pytorch_model.bin`` and the names accelify 0.1 wrote
(``model.bin``, ``scaler.bin``, ``custom.bin``, ``random_states_<rank>.bin``).

Every rank writes into ``<dir>.accelify-tmp``; once all are done, the main process swaps it into
place, so a crash mid-save never leaves a half-written checkpoint under the real name. Everything
is read back with ``torch.load(weights_only=True)`` (NumPy's RNG arrays allowed); only a scheduler
or custom object whose state holds other Python objects falls back to a full unpickle (with a
warning).
"""

from __future__ import annotations

import os
import pickle
import shutil
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from accelify.runtime import rng
from accelify.runtime.serialization import unshare


@dataclass
class Checkpointable:
    """One kind of object in a checkpoint: what it is called, its files' names (the first is
    written, any is read) and how to get and set its state."""

    stem: str
    objects: Sequence[Any]
    get_state: Callable[[Any], Any]
    set_state: Callable[[Any, Any], None]
    main_process_only: bool = True
    trusted_pickle: bool = False

    def file_names(self, index: int) -> tuple[str, ...]:
        return FILE_NAMES.get(self.stem, _numbered(self.stem, ".bin"))(index)


def _numbered(stem: str, suffix: str) -> Callable[[int], tuple[str, ...]]:
    return lambda i: (f"{stem}{suffix}" if i == 0 else f"{stem}_{i}{suffix}",)


FILE_NAMES: dict[str, Callable[[int], tuple[str, ...]]] = {
    "model": lambda i: (
        *_numbered("model", ".safetensors")(i),
        *_numbered("pytorch_model", ".bin")(i),
        *_numbered("model", ".bin")(i),
    ),
    "scaler": lambda i: ("scaler.pt", "scaler.bin"),
    "custom": lambda i: (f"custom_checkpoint_{i}.pkl", *_numbered("custom", ".bin")(i)),
}


def rng_file_names(process_index: int) -> tuple[str, str]:
    return f"random_states_{process_index}.pkl", f"random_states_{process_index}.bin"


def save(
    output_dir: str | os.PathLike[str],
    parts: Sequence[Checkpointable],
    process_index: int,
    is_main_process: bool,
    barrier: Callable[[], None],
    engine_save: Callable[[Path], None] | None = None,
    before_write: Callable[[Path], None] | None = None,
) -> Path:
    """``engine_save`` writes what a sharding engine keeps itself (models and optimizers under
    FSDP or DeepSpeed), on every rank, into the same staging directory; ``before_write`` runs
    on every rank once that directory exists (the save pre-hooks: what they write there ends
    up in the checkpoint)."""
    final = Path(output_dir)
    staging = final.with_name(final.name + ".accelify-tmp")
    if is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    barrier()
    if before_write is not None:
        before_write(staging)
    if engine_save is not None:
        engine_save(staging)
    for part in parts:
        if part.main_process_only and not is_main_process:
            continue
        for index, obj in enumerate(part.objects):
            _write(part.get_state(obj), staging / part.file_names(index)[0])
    torch.save(rng.capture_as_accelerate(), staging / rng_file_names(process_index)[0])
    barrier()
    if is_main_process:
        _swap_into_place(staging, final)
    barrier()
    return final


def load(
    input_dir: str | os.PathLike[str],
    parts: Sequence[Checkpointable],
    process_index: int,
    engine_load: Callable[[Path], None] | None = None,
) -> None:
    source = Path(input_dir)
    if not source.is_dir():
        raise FileNotFoundError(f"no checkpoint directory at {source}")
    if engine_load is not None:
        engine_load(source)
    for part in parts:
        for index, obj in enumerate(part.objects):
            path = _first_existing(source, part.file_names(index))
            if path is None:
                raise FileNotFoundError(
                    f"{source / part.file_names(index)[0]} is missing: the checkpoint holds "
                    f"fewer {part.stem}s than were prepared"
                )
            part.set_state(obj, _load(path, part.trusted_pickle))
    rng_path = _first_existing(source, rng_file_names(process_index))
    if rng_path is not None:
        rng.restore_any(_load(rng_path, trusted_pickle=False))
    else:
        warnings.warn(
            f"{rng_file_names(process_index)[0]} not in {source}: the checkpoint was written by "
            "fewer processes; this rank keeps its current RNG state",
            stacklevel=3,
        )


def _write(state: Any, path: Path) -> None:
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(unshare(state), str(path), metadata={"format": "pt"})
    else:
        torch.save(state, path)


def _first_existing(folder: Path, names: Sequence[str]) -> Path | None:
    return next((folder / name for name in names if (folder / name).exists()), None)


def _load(path: Path, trusted_pickle: bool) -> Any:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path), device="cpu")
    try:
        with torch.serialization.safe_globals(rng.NUMPY_STATE_GLOBALS):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        if not trusted_pickle:
            raise
        warnings.warn(
            f"{path.name} holds Python objects beyond tensors; loading it with a full unpickle",
            stacklevel=4,
        )
        return torch.load(path, map_location="cpu", weights_only=False)


def _swap_into_place(staging: Path, final: Path) -> None:
    previous = final.with_name(final.name + ".accelify-old")
    shutil.rmtree(previous, ignore_errors=True)
    if final.exists():
        final.rename(previous)
    staging.rename(final)
    shutil.rmtree(previous, ignore_errors=True)
