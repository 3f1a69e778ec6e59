"""Collectives and device moves over nested batches (tensors inside tuples, lists, dicts).

Every function here is a no-op on one process, so a prepared script on one device does exactly
what the unprepared one did.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from accelify.runtime import collective_record, pending_work
from accelify.runtime.state import debug_mode

Operation = TypeVar("Operation", bound=Callable[..., Any])


class DistributedOperationException(ValueError):
    """A collective given data the ranks disagree on (HF Accelerate's name): raised on every
    rank together, instead of a hang or a wrong result."""


def apply_to_tensors(fn: Callable[[torch.Tensor], Any], data: Any) -> Any:
    """Rebuild ``data`` with ``fn`` applied to every tensor, keeping containers' types."""
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*(apply_to_tensors(fn, item) for item in data))
    if isinstance(data, (list, tuple)):
        return type(data)(apply_to_tensors(fn, item) for item in data)
    if isinstance(data, Mapping):
        rebuilt = {key: apply_to_tensors(fn, value) for key, value in data.items()}
        try:
            return type(data)(rebuilt)
        except TypeError:
            return rebuilt
    return data


#: The device of a CPU run, whose batches `send_to_device` asks ``tensor.is_cpu`` of
_CPU = torch.device("cpu")
_TENSOR = torch.Tensor


def send_to_device(data: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """``data`` with its tensors on ``device``. A batch already there (a tensor, or a list, tuple
    or dict of tensors: what a DataLoader on the CPU hands a CPU run, every step) is handed back
    as it is, as the DataLoader made it, without rebuilding it (a prepared loader's
    rebuilding cost a 32-wide step 0.5 % of its instructions). On the CPU that is asked by
    ``is_cpu`` (`_to_the_cpu`), not by comparing ``tensor.device``, which builds a device
    object per tensor."""
    if device == _CPU:
        return _to_the_cpu(data, non_blocking)
    kind = type(data)
    if kind is list or kind is tuple or kind is dict:
        for item in data.values() if kind is dict else data:
            if type(item) is not _TENSOR or item.device != device:
                break
        else:
            return data
    elif kind is _TENSOR and data.device == device:
        return data
    return apply_to_tensors(_mover(device, non_blocking), data)


def _mover(device: torch.device, non_blocking: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    def move(tensor: torch.Tensor) -> torch.Tensor:
        # `to` returns the tensor itself when it is already there; asking first is cheaper
        # (this runs on every batch of a prepared DataLoader)
        if tensor.device == device:
            return tensor
        return tensor.to(device, non_blocking=non_blocking)

    return move


def placer(device: torch.device, non_blocking: bool = False) -> Callable[[Any], Any]:
    """`send_to_device` with its device fixed, for a prepared loader's pass: asked once a pass
    whether the device is the CPU, and called with the batch alone (each batch of a CPU run
    then costs no device comparison and two arguments fewer: bench/step_instructions.py)."""
    if device == _CPU and not non_blocking:
        return _to_the_cpu
    return functools.partial(send_to_device, device=device, non_blocking=non_blocking)


def _to_the_cpu(data: Any, non_blocking: bool = False) -> Any:
    """`send_to_device(data, cpu)`: a batch already on the CPU handed back as it is, else its
    tensors moved (the one check of both `send_to_device` and a CPU run's `placer`)."""
    kind = type(data)
    if kind is list or kind is tuple or kind is dict:
        for item in data.values() if kind is dict else data:
            if type(item) is not _TENSOR or not item.is_cpu:
                break
        else:
            return data
    elif kind is _TENSOR and data.is_cpu:
        return data
    return apply_to_tensors(_mover(_CPU, non_blocking), data)


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _gather_one(tensor: torch.Tensor, structure: int = 0) -> torch.Tensor:
    """all_gather along dim 0, allowing ranks to hold different numbers of rows.

    Each rank's whole shape and dtype are exchanged first, not only its rows: a rank whose
    tensor differs in another dimension (``(3, 2)`` on rank 0, ``(3,)`` on rank 1) would send
    fewer bytes than its peers expect, and gloo fills the rest with whatever memory held (a
    wrong result on one rank, an abort on the other). Every rank sees the same shapes, so every
    rank raises the same error instead. ``structure`` (`_structure_code`) does the same for the
    container the tensor came in: a key only one rank has would leave its peers in a gather
    that rank never makes."""
    if tensor.ndim == 0:
        tensor = tensor.unsqueeze(0)
    tensor = tensor.contiguous()
    header = _shape_header(tensor, structure)
    headers = [torch.zeros_like(header) for _ in range(_world())]
    dist.all_gather(headers, header)
    shapes = [[int(value) for value in row] for row in headers]
    if len({shape[0] for shape in shapes}) > 1:
        raise DistributedOperationException(
            "Cannot gather: the ranks passed containers that differ (other keys, lengths or "
            "nesting); every rank must gather the same tensors, in the same structure"
        )
    shapes = [shape[1:] for shape in shapes]
    if any(shape[:1] + shape[2:] != shapes[0][:1] + shapes[0][2:] for shape in shapes):
        raise DistributedOperationException(_shapes_differ(shapes))
    counts = [shape[1] for shape in shapes]
    longest = max(counts)
    padded = _pad_rows(tensor, longest)
    pieces = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(pieces, padded)
    return torch.cat([piece[:count] for piece, count in zip(pieces, counts, strict=True)])


#: Dimensions compared across ranks before a gather (a tensor with more compares its first ones
#: and its number of dimensions).
_HEADER_DIMS = 8


def _shape_header(tensor: torch.Tensor, structure: int) -> torch.Tensor:
    """[structure, dtype, rows, ndim, other dims...]: what the ranks must agree on, but the
    rows."""
    dtype = zlib.crc32(str(tensor.dtype).encode())
    dims = list(tensor.shape[1:_HEADER_DIMS]) + [-1] * (_HEADER_DIMS - tensor.ndim)
    return torch.tensor(
        [structure, dtype, tensor.shape[0], tensor.ndim, *dims], device=tensor.device
    )


def _structure_code(data: Any) -> int:
    """A number every rank computes alike for containers alike (0 for a bare tensor, the usual
    case, which costs nothing more): the container types, keys and lengths, not the tensors."""
    if isinstance(data, torch.Tensor):
        return 0
    return zlib.crc32(_structure(data).encode())


def _structure(data: Any) -> str:
    if isinstance(data, torch.Tensor):
        return "T"
    if isinstance(data, (list, tuple)):
        return f"{type(data).__name__}[{','.join(_structure(item) for item in data)}]"
    if isinstance(data, Mapping):
        items = ",".join(f"{_key(key)}:{_structure(value)}" for key, value in data.items())
        return f"{type(data).__name__}{{{items}}}"
    return "-"


def _key(key: Any) -> str:
    """A key as every rank writes it: an object's own repr may hold its address."""
    return repr(key) if isinstance(key, (str, int, float, bool, type(None))) else type(key).__name__


def _shapes_differ(headers: list[list[int]]) -> str:
    """Each rank's shape, as the user would print it (rows shown, dtype named when it differs),
    and what differs: the dtype alone is not a shape problem, and its fix is a cast."""
    shown = []
    dtypes_differ = len({header[0] for header in headers}) > 1
    dims_differ = len({(header[2], *header[3:]) for header in headers}) > 1
    for rank, (dtype, rows, ndim, *dims) in enumerate(headers):
        shape = (rows, *dims[: ndim - 1]) if ndim > 1 else (rows,)
        kind = f" {_DTYPE_NAMES.get(dtype, 'another dtype')}" if dtypes_differ else ""
        shown.append(f"rank {rank}: {tuple(shape)}{kind}")
    if not dims_differ:
        return (
            f"Cannot gather: the ranks' tensors have different dtypes ({'; '.join(shown)}); "
            "cast them to one dtype on every rank before gathering"
        )
    return (
        "Cannot gather: the ranks' tensors differ in more than their number of rows "
        f"({'; '.join(shown)}); only the first dimension may differ between ranks"
        + (", and every rank must pass the same dtype" if dtypes_differ else "")
    )


_DTYPE_NAMES = {
    zlib.crc32(str(dtype).encode()): str(dtype)
    for dtype in (getattr(torch, name) for name in dir(torch))
    if isinstance(dtype, torch.dtype)
}


def _pad_rows(
    tensor: torch.Tensor, rows: int, value: float = 0, first: bool = False
) -> torch.Tensor:
    missing = rows - tensor.shape[0]
    if missing == 0:
        return tensor
    filler = tensor.new_full((missing, *tensor.shape[1:]), value)
    return torch.cat([filler, tensor] if first else [tensor, filler])


def same_shapes_in_debug_mode(operation: Operation) -> Operation:
    """In debug mode (``ACCELIFY_DEBUG_MODE=1``, or ``state.debug = True``), first check that
    every rank passes tensors of the same shapes, as HF's debug mode does."""

    @functools.wraps(operation)
    def checked(data: Any, *args: Any, **kwargs: Any) -> Any:
        if _world() > 1 and debug_mode():
            shapes = apply_to_tensors(lambda tensor: tuple(tensor.shape), data)
            every: list[Any] = [None] * _world()
            dist.all_gather_object(every, shapes)
            if any(other != every[0] for other in every):
                listed = "\n  - ".join(f"Process {rank}: {s}" for rank, s in enumerate(every))
                raise DistributedOperationException(
                    f"Cannot apply {operation.__name__}: the ranks' tensors have different "
                    f"shapes.\nInput shapes:\n  - {listed}"
                )
        return operation(data, *args, **kwargs)

    return checked  # type: ignore[return-value]


@collective_record.collective("gather")
@pending_work.tracks
def gather(data: Any) -> Any:
    """Concatenate every rank's tensors along the first dimension, in rank order."""
    if _world() == 1:
        return apply_to_tensors(lambda t: t.unsqueeze(0) if t.ndim == 0 else t, data)
    structure = _structure_code(data)
    return apply_to_tensors(functools.partial(_gather_one, structure=structure), data)


@collective_record.collective("gather_object")
@pending_work.tracks
def gather_object(obj: Any) -> Any:
    """Every rank's picklable object; lists are flattened, like Accelerate's. On one process
    the object itself, as Accelerate returns it: a script that reads
    ``gather_for_metrics({"loss": loss.item()})["loss"]`` on one process runs on either."""
    if _world() == 1:
        return obj
    gathered: list[Any] = [None] * _world()
    dist.all_gather_object(gathered, obj)
    if all(isinstance(item, (list, tuple)) for item in gathered):
        return [element for item in gathered for element in item]
    return gathered


@collective_record.collective("reduce", same_shapes=True)
@pending_work.tracks
@same_shapes_in_debug_mode
def reduce(data: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
    """Every rank's tensors reduced over the ranks. ``scale`` is taken and not applied, as HF
    Accelerate applies it on XLA alone (no accelify backend), so one script gives one number on
    either runtime. "min" and "none" do as they say; HF Accelerate 1.15 sums both (ACC431
    reports them in its scripts)."""
    operations = {"sum": "SUM", "mean": "SUM", "max": "MAX", "min": "MIN", "none": None}
    if reduction not in operations:
        raise ValueError(
            f"reduction must be 'sum', 'mean', 'max', 'min' or 'none', got {reduction!r}"
        )

    def reduce_one(tensor: torch.Tensor) -> torch.Tensor:
        result = tensor.clone()
        if _world() > 1 and operations[reduction] is not None:
            dist.all_reduce(result, op=getattr(dist.ReduceOp, operations[reduction]))
        if reduction == "mean":
            result = result / _world()
        return result

    return apply_to_tensors(reduce_one, data)


@collective_record.collective("broadcast", same_shapes=True)
@pending_work.tracks
@same_shapes_in_debug_mode
def broadcast(data: Any, from_process: int = 0) -> Any:
    def broadcast_one(tensor: torch.Tensor) -> torch.Tensor:
        if _world() > 1:
            tensor = tensor.contiguous()
            dist.broadcast(tensor, src=from_process)
        return tensor

    return apply_to_tensors(broadcast_one, data)


@collective_record.collective("pad_across_processes")
@pending_work.tracks
def pad_across_processes(
    data: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False
) -> Any:
    """Pad ``dim`` of every tensor to the largest size any rank holds, so it can be gathered."""

    def pad_one(tensor: torch.Tensor) -> torch.Tensor:
        if _world() == 1:
            return tensor
        # every rank sends its rank (number of dims) with its size, so that all see a mismatch
        # together and raise together, instead of one skipping the collective the others wait in
        size = tensor.shape[dim] if dim < tensor.ndim else -1
        mine = torch.tensor([tensor.ndim, size], device=tensor.device)
        theirs = [torch.zeros_like(mine) for _ in range(_world())]
        dist.all_gather(theirs, mine)
        dims = [int(t[0].item()) for t in theirs]
        if len(set(dims)) > 1:
            raise DistributedOperationException(
                "pad_across_processes: the tensors have different numbers of dimensions on the "
                f"ranks ({', '.join(f'rank {r}: {d}' for r, d in enumerate(dims))}); they can "
                "only be padded along one dimension"
            )
        if dim >= tensor.ndim:
            return tensor
        longest = max(int(t[1].item()) for t in theirs)
        moved = tensor.movedim(dim, 0)
        return _pad_rows(moved, longest, pad_index, pad_first).movedim(0, dim)

    return apply_to_tensors(pad_one, data)


@collective_record.collective("broadcast_object_list")
@pending_work.tracks
def broadcast_object_list(objects: list[Any], from_process: int = 0) -> list[Any]:
    """Every rank's list replaced, in place, by the ``from_process`` rank's objects."""
    if _world() > 1:
        dist.broadcast_object_list(objects, src=from_process)
    return objects


def copy_tensor_to_devices(tensor: torch.Tensor | None = None) -> torch.Tensor:
    """The main process's tensor on every rank (the others pass None), HF's name."""
    if _world() == 1:
        assert tensor is not None
        return tensor
    meta = broadcast_object_list([None if tensor is None else (tensor.shape, tensor.dtype)])[0]
    if tensor is None:
        shape, dtype = meta
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if dist.get_backend() == "nccl"
            else torch.device("cpu")
        )
        tensor = torch.empty(shape, dtype=dtype, device=device)
    dist.broadcast(tensor, src=0)
    return tensor


def first_dim(data: Any) -> int | None:
    """Rows in the first tensor found: the batch size of a nested batch."""
    found: list[int] = []

    def note(tensor: torch.Tensor) -> torch.Tensor:
        if not found and tensor.ndim > 0:
            found.append(tensor.shape[0])
        return tensor

    apply_to_tensors(note, data)
    return found[0] if found else None


def truncate(data: Any, rows: int) -> Any:
    return apply_to_tensors(lambda t: t[:rows] if t.ndim > 0 else t, data)
