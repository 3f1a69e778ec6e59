"""HF Accelerate's own outcome of each run, recorded: HF's side of the comparison is the same on
every suite run (its version is pinned in the test extra, torch's by the README), and running it
costs more than accelify's side (a relaunch after each of its failing cases, a 20 s wait for the
case it hangs in). The record names the versions it was made with, and the seed of the scripts'
data (case_runner.DATA_SEED); with any other installed, or another seed, the test runs HF live
instead.

    python tests/accelerate_compat/hf_record.py    # re-record, after a version change
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import asdict
from importlib.metadata import version
from pathlib import Path

RECORD = Path(__file__).with_name("hf_outcomes.json")

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from accelerate_compat.case_runner import DATA_SEED  # noqa: E402
from accelerate_compat.driver import CaseResult, ScriptRun  # noqa: E402


def versions() -> dict[str, str]:
    """What HF's outcomes were made with: its and torch's versions, and the scripts' data (drawn
    by numpy's generator from DATA_SEED)."""
    made_with = {name: version(name) for name in ("accelerate", "torch", "numpy")}
    return {**made_with, "data_seed": str(DATA_SEED)}


def recorded(run: str) -> ScriptRun | None:
    """HF's recorded outcome of ``run``, if it was recorded with the installed versions."""
    if not RECORD.exists():
        return None
    record = json.loads(RECORD.read_text())
    if record["versions"] != versions() or run not in record["runs"]:
        return None
    found = record["runs"][run]
    return ScriptRun([CaseResult(**case) for case in found["cases"]], found["problems"])


def main() -> None:
    from test_accelerate_scripts import RUNS, run_on

    runs = {}
    with tempfile.TemporaryDirectory() as folder:
        for run in RUNS:
            outcome = run_on("accelerate", run, Path(folder))
            runs[run] = {"cases": [asdict(case) for case in outcome.cases], "problems": []}
            print(f"{run}: {sum(c.ok for c in outcome.cases)}/{len(outcome.cases)} pass on HF")
    # HF's problems outside its cases (an abort at exit, some runs) are not asserted: not kept
    RECORD.write_text(json.dumps({"versions": versions(), "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
