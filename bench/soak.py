"""Soak: many consecutive 2-rank launches on a loaded machine, counting every failure.

    python bench/soak.py [--runs 200] [--no-hog] [--timeout 120]

Each round makes three launches: a save (fixtures/runtime/resume.py stops right after
`save_state`), a resume from that checkpoint to the end, and a plain script
(fixtures/examples/classify.py). `--runs N` makes N save/resume launches (N/2 rounds of save and
resume) and N plain ones. A busy-looping process runs beside them the whole time (two ranks and
the hog on a 2-core machine), because scheduling delays are what turn exit-time races into
failures. A launch fails when it exits non-zero, prints "terminate called", or runs past
`--timeout`. The report lists each failure with the lines that say why; the target is 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESUME = ROOT / "fixtures" / "runtime" / "resume.py"
PLAIN = ROOT / "fixtures" / "examples" / "classify.py"
HOG = "while True: pass"


@dataclass
class Tally:
    launches: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)


def launch(script: Path, args: list[str], cwd: Path, timeout: float) -> tuple[bool, str, float]:
    command = [sys.executable, "-m", "accelify", "launch", "--cpu", "-n", "2", str(script), *args]
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return False, f"timed out after {timeout:.0f}s\n{output}", time.monotonic() - started
    elapsed = time.monotonic() - started
    if process.returncode != 0 or "terminate called" in output:
        return False, f"exit {process.returncode}\n{output}", elapsed
    return True, "", elapsed


def why(output: str) -> str:
    keep = [
        line
        for line in output.splitlines()
        if any(word in line for word in ("exit ", "timed out", "terminate", "Error", "accelify"))
    ]
    return "\n      ".join(keep[:6])


def record(tally: Tally, name: str, result: tuple[bool, str, float]) -> None:
    ok, output, elapsed = result
    tally.launches += 1
    tally.seconds += elapsed
    if not ok:
        tally.failures.append(f"{name}: {why(output)}")
        print(f"  FAILED {name}: {why(output)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--no-hog", action="store_true")
    parser.add_argument("--timeout", type=float, default=120)
    options = parser.parse_args()

    hog = None if options.no_hog else subprocess.Popen([sys.executable, "-c", HOG])
    resumes, plains = Tally(), Tally()
    try:
        with tempfile.TemporaryDirectory(prefix="accelify-soak-") as folder:
            work = Path(folder)
            for round_index in range(options.runs // 2):
                checkpoint = work / f"checkpoint{round_index}"
                save = ["--total-steps", "30", "--save-at", "17", "--stop-after-save"]
                common = ["--checkpoint", str(checkpoint), "--out", str(work / "out.json")]
                for index, args in enumerate((save + common, ["--total-steps", "30", *common])):
                    name = f"round {round_index} {'save' if index == 0 else 'resume'}"
                    record(resumes, name, launch(RESUME, args, work, options.timeout))
                for index in range(2):
                    name = f"round {round_index} plain {index}"
                    record(plains, name, launch(PLAIN, [], work, options.timeout))
                if (round_index + 1) % 10 == 0:
                    print(
                        f"{resumes.launches + plains.launches} launches, "
                        f"{len(resumes.failures) + len(plains.failures)} failed",
                        flush=True,
                    )
    finally:
        if hog is not None:
            hog.kill()
    load = "none" if options.no_hog else "1 busy-looping process beside the 2 ranks"
    print(f"\nsoak on {os.cpu_count()} cores, load: {load}")
    for label, tally in (("save/resume", resumes), ("plain script", plains)):
        mean = tally.seconds / max(tally.launches, 1)
        print(
            f"  {label:13s} {len(tally.failures):3d} failed of {tally.launches} launches "
            f"(mean {mean:.1f} s a launch)"
        )
    sys.exit(1 if resumes.failures or plains.failures else 0)


if __name__ == "__main__":
    main()
