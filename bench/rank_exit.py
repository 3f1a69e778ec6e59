"""Where a healthy rank's end goes: the exit guard, then the interpreter's own exit.

    python bench/rank_exit.py [--runs 4] [--baseline SRC]

Each run starts 2 CPU ranks as `accelify launch` starts them (``accelify.runtime.rank_entry``,
``ACCELIFY_FAILURE_DIR`` set) on a small DDP training script, and splits each rank's end into
the exit guard (`accelify.runtime.state._ExitGuard.close`: the wait for the peers, the engines
letting go of the groups, the groups' destruction) and what follows it (the other atexit
handlers and the interpreter's finalization), in wall time and in CPU time (the rank's own,
from ``wait4``: on a shared machine the steadier of the two). ``--baseline SRC``: another source
tree laid out as installed (``SRC/accelify/runtime``, e.g. ``git archive`` of another commit),
run in alternation with this checkout, each run in turn first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from accelify.runtime.environment import FAILURE_DIR
from accelify.runtime.launch.launcher import free_port

SCRIPT = """
import json, os, time
import torch
from accelify import Accelerator
from accelify.runtime import state

marks = {}
close = state._ExitGuard.close.__func__


def timed_close(cls, *args):
    marks["start"], marks["start_cpu"] = time.time(), time.process_time()
    close(cls, *args)
    marks["end"], marks["end_cpu"] = time.time(), time.process_time()
    with open(os.path.join(os.environ["MARKS"], os.environ["RANK"] + ".json"), "w") as out:
        json.dump(marks, out)


state._ExitGuard.close = classmethod(timed_close)
accelerator = Accelerator()
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.TensorDataset(torch.randn(512, 64), torch.randn(512, 1))
loader = torch.utils.data.DataLoader(data, batch_size=16)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for x, y in loader:
    accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
    optimizer.step()
    optimizer.zero_grad()
accelerator.print("done", accelerator.gather_for_metrics(torch.ones(4)).sum().item())
"""
KEYS = ("guard_wall", "guard_cpu", "after_wall", "after_cpu", "rank_cpu")


def one_run(script: Path, source: str | None) -> list[dict[str, float]]:
    """Each rank's times, from its exit guard's marks and its own ``wait4``."""
    port = free_port()
    with tempfile.TemporaryDirectory() as records, tempfile.TemporaryDirectory() as marks:
        ranks = {}
        for rank in range(2):
            env = {
                **os.environ,
                **{"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"},
                **{"LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
                **{FAILURE_DIR: records, "MARKS": marks, "OMP_NUM_THREADS": "1"},
            }
            if source:
                env["PYTHONPATH"] = source
            command = [sys.executable, "-m", "accelify.runtime.rank_entry", str(script)]
            # in the script's folder: ``-m`` puts the working directory first on the path, and
            # a checkout's own ``accelify`` folder there would hide the baseline's
            process = subprocess.Popen(
                command, env=env, cwd=script.parent, stdout=subprocess.DEVNULL
            )
            ranks[process.pid] = rank
        times = []
        while ranks:
            pid, status, usage = os.wait4(-1, 0)
            ended = time.time()
            rank = ranks.pop(pid)
            if status:
                raise SystemExit(f"rank {rank} ended with status {status}")
            mark = json.loads((Path(marks) / f"{rank}.json").read_text())
            cpu = usage.ru_utime + usage.ru_stime
            times.append(
                {
                    "guard_wall": mark["end"] - mark["start"],
                    "guard_cpu": mark["end_cpu"] - mark["start_cpu"],
                    "after_wall": ended - mark["end"],
                    "after_cpu": cpu - mark["end_cpu"],
                    "rank_cpu": cpu,
                }
            )
        return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--baseline", help="a source tree laid out as installed")
    args = parser.parse_args()
    arms: dict[str, str | None] = {"this checkout": None}
    if args.baseline:
        arms["baseline"] = str(Path(args.baseline).resolve())
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "healthy.py"
        script.write_text(SCRIPT)
        for run in range(args.runs):
            order = list(arms) if run % 2 == 0 else list(arms)[::-1]
            for name in order:
                samples[name] += one_run(script, arms[name])
    print(
        f"2 CPU ranks, {args.runs} runs per arm, medians over ranks and runs, "
        f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    print(f"{'seconds':16}" + "".join(f"{key:>12}" for key in KEYS))
    for name, rows in samples.items():
        medians = "".join(f"{statistics.median(r[k] for r in rows):12.3f}" for k in KEYS)
        print(f"{name:16}{medians}")


if __name__ == "__main__":
    main()
