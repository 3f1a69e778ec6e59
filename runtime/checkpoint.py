"""`save_state`/`load_state`: everything a run needs to continue as if it had not stopped.

Layout of a checkpoint directory (one file per prepared object, in prepare order)::

    model.bin, model_1.bin, ...        state dicts of the unwrapped models
    optimizer.bin, ...                 optimizer state dicts
    fsdp_model_0/, deepspeed/          instead of the two above under FSDP or DeepSpeed: the
                                       engine's own sharded format, one part per rank
    scheduler.bin, ...                 LR scheduler state dicts
    dataloader.bin, ...                position in the current pass and the pass's shuffle seed
    scaler.bin                         fp16 gradient scaler
    custom_0.bin, ...                  objects given to register_for_checkpointing
    random_states_<rank>.bin           Python, NumPy and torch RNG states of every rank

Every rank writes into ``<dir>.accelify-tmp``; once all are done, the main process swaps it into
place, so a crash mid-save never leaves a half-written checkpoint under the real name. Everything
is read back with ``torch.load(weights_only=True)``; only a scheduler or custom object whose state
holds other Python objects falls back to a full unpickle (with a warning).
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


@dataclass
class Checkpointable:
    """One kind of object in a checkpoint: its file stem and how to get and set its state."""

    stem: str
    objects: Sequence[Any]
    get_state: Callable[[Any], Any]
    set_state: Callable[[Any, Any], None]
    main_process_only: bool = True
    trusted_pickle: bool = False


def file_name(stem: str, index: int) -> str:
    return f"{stem}.bin" if index == 0 else f"{stem}_{index}.bin"


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
            torch.save(part.get_state(obj), staging / file_name(part.stem, index))
    torch.save(rng.capture(), staging / f"random_states_{process_index}.bin")
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
            path = source / file_name(part.stem, index)
            if not path.exists():
                raise FileNotFoundError(
                    f"{path} is missing: the checkpoint holds fewer {part.stem}s than were prepared"
                )
            part.set_state(obj, _load(path, part.trusted_pickle))
    rng_path = source / f"random_states_{process_index}.bin"
    if rng_path.exists():
        rng.restore(_load(rng_path, trusted_pickle=False))
    else:
        warnings.warn(
            f"{rng_path.name} not in {source}: the checkpoint was written by fewer processes; "
            "this rank keeps its current RNG state",
            stacklevel=3,
        )


def _load(path: Path, trusted_pickle: bool) -> Any:
    try:
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
