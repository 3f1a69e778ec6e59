"""How long `accelify launch` takes to name a rank that left while its peer waits.

    python bench/leaver_report.py [--runs 10] [--shapes exit raise return raw_exit]

Each run launches 2 CPU ranks on a small script in which rank 1 leaves at step 3 (``sys.exit(3)``,
an exception, a ``return`` out of ``main`` with code 0, or ``sys.exit(3)`` in a script that uses
DDP itself) while rank 0 trains on. Rank 1 prints the wall-clock time just before it leaves;
this script times, from there, the launcher's first report line (``accelify launch: ...``) and
the launcher's exit. Prints the median, min and max per shape, and the machine's load average.
"""

from __future__ import annotations

import argparse
import os
import selectors
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MARKER = "LEAVING AT "

_ACCELERATOR = """\
import sys, time
import torch
from accelify import Accelerator


def main():
    accelerator = Accelerator()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    for step in range(100000):
        accelerator.backward(model(torch.randn(2, 4)).sum())
        optimizer.step()
        optimizer.zero_grad()
        if step == 3 and accelerator.process_index == 1:
            print(f"{MARKER}{time.time()!r}", file=sys.stderr, flush=True)
            LEAVE


main()
"""

_RAW = """\
import sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Linear(4, 1))
for step in range(100000):
    model(torch.randn(2, 4)).sum().backward()
    if dist.get_rank() == 1 and step == 3:
        print(f"{MARKER}{time.time()!r}", file=sys.stderr, flush=True)
        sys.exit(3)
"""

SHAPES = {
    "exit": _ACCELERATOR.replace("LEAVE", "sys.exit(3)"),
    "raise": _ACCELERATOR.replace("LEAVE", 'raise ValueError("bad batch")'),
    "return": _ACCELERATOR.replace("LEAVE", "return"),
    "raw_exit": _RAW,
}


def one_run(script: Path, timeout: float) -> tuple[float | None, float | None, int, str]:
    """(seconds from the leave to the first report line, to the launcher's exit, exit code,
    the report's first line)."""
    command = [sys.executable, "-m", "accelify", "launch", "--cpu", "-n", "2", str(script)]
    process = subprocess.Popen(
        command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, bufsize=1
    )
    assert process.stderr is not None
    left = reported = None
    first = ""
    selector = selectors.DefaultSelector()
    selector.register(process.stderr, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not selector.select(timeout=1.0):
            continue
        line = process.stderr.readline()
        if not line:
            break
        if line.startswith(MARKER):
            left = float(line[len(MARKER) :])
        elif line.startswith("accelify launch:") and reported is None:
            reported, first = time.time(), line.strip()
    code = process.wait(timeout=max(deadline - time.monotonic(), 1))
    ended = time.time()
    if left is None:
        return None, None, code, first
    return (reported - left if reported else None), ended - left, code, first


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--timeout", type=float, default=180.0)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as folder:
        for shape in args.shapes:
            script = Path(folder) / f"{shape}.py"
            script.write_text(SHAPES[shape].replace("{MARKER}", MARKER))
            to_report, to_end, firsts = [], [], set()
            for _ in range(args.runs):
                report, end, code, first = one_run(script, args.timeout)
                firsts.add((code, first[:110]))
                if report is not None and end is not None:
                    to_report.append(report)
                    to_end.append(end)
            for name, values in (("first report line", to_report), ("launcher exit", to_end)):
                if values:
                    print(
                        f"{shape:9} {name:18}: median {statistics.median(values):5.2f} s "
                        f"min {min(values):5.2f} max {max(values):5.2f} ({len(values)} runs)"
                    )
            for code, first in sorted(firsts):
                print(f"{shape:9} exit {code}: {first}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
