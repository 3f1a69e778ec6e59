"""Ranks that passed one collective tensors of different shapes or dtypes, found in their records.

An all-reduce or a broadcast must see the same shapes on every rank; a gather, the shapes its
outputs hold for each rank (named only once a rank aborted inside it). Gloo does not check: the
rank sent more bytes than its tensor holds aborts (SIGABRT, "Received data size doesn't match
expected size" on stderr from C++), while the rank sent fewer takes a wrong result and goes on,
and its peer waits for bytes that never come; NCCL hangs. Checking before each collective costs a
collective more per call (HF Accelerate's debug mode, ``accelify launch --debug``). Instead each
rank's record keeps the shapes it passed its last such collective
(`accelify.runtime.collective_record.shapes_of`), written with the rest of the record at no
extra system call, and the launcher compares them only once a rank has aborted inside one or
waits there alone: the normal run pays nothing more.
"""

from __future__ import annotations

from collections.abc import Callable

from accelify.runtime.collective_record import CRASHED, IN_COLLECTIVE, Record

PREFIX = "accelify launch:"


def other_shapes(ranks: dict[int, Record], stuck: Record) -> dict[int, Record]:
    """The peers that passed ``stuck``'s collective (the one it is in, or aborted in) other
    shapes or dtypes than it did: none when that collective keeps no shapes, or when a peer's
    record no longer holds the shapes of that collective (it went on to another). A peer whose
    collective of that number was another operation is elsewhere in the script (the watcher's
    mismatch of collectives says where), whatever it passed."""
    if stuck.shaped != stuck.sequence or not stuck.shapes or not stuck.sequence:
        return {}
    return {
        rank: record
        for rank, record in ranks.items()
        if rank != stuck.rank
        and record.shaped == stuck.sequence
        and record.shaped_operation == stuck.shaped_operation
        and record.shapes
        and record.shapes != stuck.shapes
    }


def shapes_words(
    ranks: dict[int, Record], stuck: Record, place: Callable[[Record], str]
) -> list[str]:
    """The report: each rank's shapes in the collective, and what came of it (``place``: a
    record's ``file:line`` words, the watcher's)."""
    others = other_shapes(ranks, stuck)
    lines = [
        f"{PREFIX} the ranks passed {stuck.operation} (collective #{stuck.sequence}) tensors of "
        "different shapes or dtypes; it cannot give every rank the right result:"
    ]
    for rank, record in sorted({stuck.rank: stuck, **others}.items()):
        lines.append(f"  rank {rank}: {record.shapes}{_after(record, stuck, place)}")
    if stuck.operation in _GATHERS:
        lines.append(
            f"{PREFIX} each rank's tensor must have the shape and dtype that the {stuck.operation}"
            "'s output list holds for that rank, on every rank that holds one: " + _GATHER_ADVICE
        )
        return lines
    lines.append(
        f"{PREFIX} every rank must pass {stuck.operation} the same shapes and dtypes: "
        + _ADVICE.get(stuck.operation, _TORCH_ADVICE)
    )
    return lines


#: torch's gathers, whose ranks may pass different shapes when the outputs say so (their
#: shapes are compared only after an abort: `collective_record.SHAPES_ON_ABORT`)
_GATHERS = frozenset({"gather", "all_gather"})
_GATHER_ADVICE = (
    "all_gather each rank's length first and size the outputs by it, or pad every rank's "
    "tensor to the longest (accelerator.gather takes different row counts)"
)


#: What to do instead, for the runtime's collectives (the script has an Accelerator)
_ADVICE = {
    operation: "a tensor whose length differs between ranks can be padded to the longest first "
    "(accelerator.pad_across_processes), or gathered (accelerator.gather takes different row "
    "counts)"
    for operation in ("reduce", "broadcast")
}
_TORCH_ADVICE = (
    "a tensor whose length differs between ranks can be padded to the longest first (all_reduce "
    "its length with ReduceOp.MAX, then pad)"
)


def _after(record: Record, stuck: Record, place: Callable[[Record], str]) -> str:
    """Where the rank passed its shapes, and what it did after."""
    if record.rank == stuck.rank or record.state == CRASHED:
        return f" at {place(record)}" if record.sequence == stuck.sequence else ""
    # a rank that sent its part of a gather got no result to be wrong
    went_on = "went on" if stuck.operation in _GATHERS else "went on with a wrong result"
    if record.sequence == stuck.sequence:
        still = "still in it" if record.state == IN_COLLECTIVE else went_on
        return f" at {place(record)} ({still})"
    return (
        f", and {went_on}: it is at collective #{record.sequence}, "
        f"{record.operation} at {place(record)}"
    )
