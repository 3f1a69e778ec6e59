"""The probe's view of evaluation: every ``for`` loop over a DataLoader is a *pass*; the probe
counts its batches, and the backward calls and the script's own gathers and reductions from its
start until the next pass starts. A pass with no backward is an evaluation; on N ranks over a
sharded loader it must gather or reduce something, or whatever it computes covers one shard.
A loop is the script's or one of its project's modules (``for x, y in loader:`` in
``src/engine.py``, which the script imports): the innermost frame of the project's files is the
one whose ``for`` line counts; a library's loops (torch's, accelify's runtime's) are not.
Each pass also records every optimizer's learning rates as it starts: the schedule a
conversion must keep (`learning_rates`).

Collectives are counted at torch.distributed's Python entry points, which accelify's runtime,
Hugging Face Accelerate and hand-written code all go through; those made while the script is on
a ``for`` line belong to the loader itself (shard bookkeeping), not to the metric.

Two windows: every collective up to the next pass (what may have gathered the pass's values:
an ``evaluate()`` that returns its predictions for the caller to gather), and the gathers made
while the function that runs the loop has not returned (``gathers``: surely the pass's own).
A pass that gathers nothing is told by the first; a whole loader's pass whose gather joins one
copy per rank by the second, so that a gather its caller makes afterwards of something else (the
training loss, summed over the ranks once ``evaluate()`` returned) is not taken for its own."""

from __future__ import annotations

import json
import linecache
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

COLLECTIVES = (
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "gather",
    "gather_object",
    "reduce",
    "reduce_scatter_tensor",
)
#: The collectives that join every rank's values into one longer result.
GATHERS = frozenset(
    {"all_gather", "all_gather_into_tensor", "all_gather_object", "gather", "gather_object"}
)


class _CountingIterator:
    def __init__(self, inner: Iterator[Any], record: dict[str, Any]) -> None:
        self._inner = inner
        self._record = record

    def __iter__(self) -> _CountingIterator:
        return self

    def __next__(self) -> Any:
        batch = next(self._inner)
        self._record["batches"] += 1
        return batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class LoaderPasses:
    def __init__(
        self,
        script: str,
        place: Callable[[], FrameType | None],
        optimizers: Callable[[], list[dict[str, Any]]] = list,
        label: Callable[[str], str] = lambda file: "",
    ) -> None:
        """``place``: the project's innermost frame running now (None outside the project's
        files); ``label``: how a pass's file is named in the records ("" for the script
        itself)."""
        self.script = script
        self.place = place
        self.label = label
        self.optimizers = optimizers
        self.backward = 0
        self.collectives = 0
        self.passes: list[dict[str, Any]] = []
        #: the passes whose window is open: one, or the loaders one ``for`` line reads together
        self._open: list[dict[str, Any]] = []
        #: the frame that runs the open passes' loop, until a collective is made outside it
        #: (it returned): held only while its passes are open
        self._scope: FrameType | None = None

    def install(self) -> None:
        loader_iter = torch.utils.data.DataLoader.__iter__
        passes = self

        def __iter__(loader: Any) -> Any:
            record = passes.start(passes.place())
            iterator = loader_iter(loader)
            return iterator if record is None else _CountingIterator(iterator, record)

        torch.utils.data.DataLoader.__iter__ = __iter__  # type: ignore[method-assign]
        for name in COLLECTIVES:
            entry = getattr(dist, name, None)
            if entry is not None:
                setattr(dist, name, self._counted(entry, name in GATHERS))

    def _counted(self, entry: Callable[..., Any], gathers: bool) -> Callable[..., Any]:
        def collective(*args: Any, **kwargs: Any) -> Any:
            frame = self.place()
            if frame is not None and not _is_for_line(frame):
                self.collectives += 1
                if gathers and self._open and self._in_scope(frame):
                    for record in self._open:
                        record["gathers"] += 1
            return entry(*args, **kwargs)

        return collective

    def _in_scope(self, frame: FrameType) -> bool:
        """Whether ``frame`` runs inside the open pass's loop's frame (that frame itself, or a
        function it called). Once a collective is made outside it, it has returned (or, a
        generator's, yielded to its caller): it is let go of, and nothing after counts."""
        if self._scope is None:
            return False
        caller: FrameType | None = frame
        while caller is not None:
            if caller is self._scope:
                return True
            caller = caller.f_back
        self._scope = None
        return False

    def start(self, frame: FrameType | None) -> dict[str, Any] | None:
        if frame is None or not _is_for_line(frame):
            return None  # ``next(iter(loader))`` peeks at a batch: not a pass
        record = {
            "line": frame.f_lineno,
            "module": self.label(frame.f_code.co_filename),
            "batches": 0,
            "backward": self.backward,
            "collectives": self.collectives,
            "gathers": 0,
            "optimizers": self.optimizers(),
        }
        if not self._read_together(record):
            self.close_last()
        self._open.append(record)
        self._scope = frame
        self.passes.append(record)
        return record

    def _read_together(self, record: dict[str, Any]) -> bool:
        """``for a, b in zip(loader_a, loader_b):`` starts both passes on one line before
        either yields a batch: they share one window (the backward of the step reading both
        belongs to each), else the first would look like an evaluation without a backward."""
        return bool(self._open) and all(
            (other["line"], other["module"]) == (record["line"], record["module"])
            and other["batches"] == 0
            for other in self._open
        )

    def close_last(self) -> None:
        """The open passes' window ends here: their counters become the counts since it began."""
        for record in self._open:
            record["backward"] = self.backward - record["backward"]
            record["collectives"] = self.collectives - record["collectives"]
        self._open = []
        self._scope = None

    def write(self, path: Path) -> None:
        self.close_last()
        path.write_text(json.dumps(self.passes), encoding="utf-8")


def _is_for_line(frame: FrameType) -> bool:
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    return line.lstrip().startswith(("for ", "async for "))
