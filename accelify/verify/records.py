"""What the probe writes and the parent reads: one JSON line per optimizer step, per rank."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

ENV_OUT = "ACCELIFY_VERIFY_OUT"
ENV_STEPS = "ACCELIFY_VERIFY_STEPS"
ENV_SEED = "ACCELIFY_VERIFY_SEED"
ENV_PATH = "ACCELIFY_VERIFY_PATH"
ENV_DEADLINE = "ACCELIFY_VERIFY_DEADLINE"  # time.time() after which a rank stops itself
PROBE_FAILED = 86  # the probe's own failure, told apart from the script's exit codes
STOPPED_AT_DEADLINE = 87


def hang_marker(folder: Path, rank: int) -> Path:
    return folder / f"rank{rank}.hung"


@dataclass(frozen=True)
class StepRecord:
    step: int
    optimizer: int
    losses: tuple[float, ...]
    params: tuple[float, ...]
    step_line: int | None
    backward_line: int | None
    made: int | None = None  # the optimizer's number in the order the script made them
    lrs: tuple[float, ...] = ()  # its param groups' learning rates at this step


def record_file(folder: Path, rank: int) -> Path:
    return folder / f"rank{rank}.jsonl"


def passes_file(folder: Path, rank: int) -> Path:
    return folder / f"rank{rank}.passes.json"


@dataclass(frozen=True)
class LoaderPass:
    """One ``for`` over a DataLoader: where, how many batches, and what happened from its start
    to the start of the next pass (or the end): backward calls, gathers and reductions made by
    the script's code."""

    line: int
    batches: int
    backward: int
    collectives: int
    optimizers: tuple[OptimizerAtPass, ...] = ()
    #: of the collectives, those that join every rank's values (all_gather) made before the
    #: function that runs the loop returned: surely the pass's own (`loader_passes`)
    gathers: int = 0
    #: the module of the project the loop is in, relative to the script's folder
    #: (``src/engine.py``); "" for the script itself
    module: str = ""

    @property
    def place(self) -> tuple[str, int]:
        """Which loop: its module and line (the same line of two modules is two loops)."""
        return (self.module, self.line)

    @property
    def where(self) -> str:
        """``line 12`` (of the converted script), ``src/engine.py:58``: for a verdict."""
        return f"{self.module}:{self.line}" if self.module else f"line {self.line}"


@dataclass(frozen=True)
class OptimizerAtPass:
    """An optimizer as a pass starts: its number in the order the script made optimizers, the
    script's line that made it, the steps it has taken so far, its param groups' learning
    rates."""

    made: int
    line: int | None
    steps: int
    lrs: tuple[float, ...]


def read_passes(folder: Path, rank: int) -> list[LoaderPass]:
    path = passes_file(folder, rank)
    if not path.exists():
        return []
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return []
    return [
        LoaderPass(
            item["line"],
            item["batches"],
            item["backward"],
            item["collectives"],
            tuple(
                OptimizerAtPass(o["made"], o["line"], o["steps"], tuple(o["lrs"]))
                for o in item.get("optimizers", ())
            ),
            item.get("gathers", 0),
            item.get("module", ""),
        )
        for item in raw
    ]


def read_records(folder: Path, rank: int) -> list[StepRecord]:
    path = record_file(folder, rank)
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            raw = json.loads(line)
        except json.JSONDecodeError:
            break  # a line cut short by a kill
        records.append(
            StepRecord(
                raw["step"],
                raw["optimizer"],
                tuple(raw["losses"]),
                tuple(raw["params"]),
                raw["step_line"],
                raw["backward_line"],
                raw.get("made"),
                tuple(raw.get("lrs", ())),
            )
        )
    return records
