"""Files written so that a reader never sees half of one: a temporary name, then a rename."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

_UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def write_atomically(path: Path, write: Callable[[Path], Any]) -> None:
    """Written under the file's own name in a fresh folder beside it, then renamed into place:
    `torch.save` names its archive's root folder after the file it writes, so a temporary
    name of the file itself would make the bytes differ from a plain `torch.save` to the path
    (and from one save to the next, with the pid in it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    temporary = staging / path.name
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def parse_size(size: int | str) -> int:
    if isinstance(size, int):
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]I?B)\s*", size.upper())
    if match is None:
        raise ValueError(f"max_shard_size {size!r}: expected bytes or a size like '10GB'")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def save_model_files(
    state_dict: dict[str, torch.Tensor],
    directory: Path,
    max_shard_size: int | str,
    safe_serialization: bool,
) -> list[Path]:
    """Write ``model.safetensors`` (or ``pytorch_model.bin``), split into numbered shards with an
    index file when larger than ``max_shard_size``, as Transformers lays them out."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = unshare(state_dict) if safe_serialization else state_dict
    shards = _split_into_shards(tensors, parse_size(max_shard_size))
    stem, suffix = ("model", ".safetensors") if safe_serialization else ("pytorch_model", ".bin")
    names = (
        [f"{stem}{suffix}"]
        if len(shards) == 1
        else [f"{stem}-{i + 1:05d}-of-{len(shards):05d}{suffix}" for i in range(len(shards))]
    )
    for name, shard in zip(names, shards, strict=True):
        write_atomically(directory / name, _writer(shard, safe_serialization))
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": sum(_nbytes(t) for t in tensors.values())},
            "weight_map": {
                key: name for name, shard in zip(names, shards, strict=True) for key in shard
            },
        }
        write_atomically(
            directory / f"{stem}{suffix}.index.json",
            lambda tmp: tmp.write_text(json.dumps(index, indent=2, sort_keys=True)),
        )
    return [directory / name for name in names]


def _writer(shard: dict[str, torch.Tensor], safe: bool) -> Callable[[Path], None]:
    if safe:
        from safetensors.torch import save_file

        return lambda tmp: save_file(shard, str(tmp), metadata={"format": "pt"})
    return lambda tmp: torch.save(shard, tmp)


def unshare(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors that share storage (tied weights): give each its own copy."""
    seen: set[int] = set()
    result = {}
    for key, tensor in state_dict.items():
        storage = tensor.untyped_storage().data_ptr()
        copy_needed = storage in seen or not tensor.is_contiguous()
        seen.add(storage)
        result[key] = tensor.detach().contiguous().clone() if copy_needed else tensor.detach()
    return result


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _split_into_shards(
    tensors: dict[str, torch.Tensor], limit: int
) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, tensor in tensors.items():
        if shards[-1] and size + _nbytes(tensor) > limit:
            shards.append({})
            size = 0
        shards[-1][key] = tensor
        size += _nbytes(tensor)
    return shards
