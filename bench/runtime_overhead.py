"""Steps/s of one training loop on 2 CPU ranks: raw DDP, accelify, and HF Accelerate if installed.

    python bench/runtime_overhead.py [--rounds 5] [--widths 128 1024 2048] [--steps 420]
                                     [--no-launch]

Each implementation runs under the same `torch.distributed.run` command, the rounds alternate the
implementations so that machine noise hits all alike, and the median of the rounds is reported with
the ratios of steps/s (above 1: accelify is faster) and of rank 0's CPU time per step (above 1:
accelify costs more), each the median of the rounds' own ratios. On a shared machine the CPU time is
the steadier of the two. Width 32 is a model whose step is mostly fixed costs (the all-reduce's
latency, Python), where accelify's per-step bookkeeping would show; 2048 is compute-bound. "raw DDP,
accelify's options" is the raw loop with the DDP options accelify sets
(`gradient_as_bucket_view=True`): accelify against it measures what accelify does beyond DDP. The
checksum column shows that all trained the same model. `--ddp-options` also measures DDP's other
options on the raw loop. "accelify launch" is accelify as users run it: the same worker started by
`accelify launch --cpu` (its rank entry, the collective record, the launcher's watcher reading the
records beside the ranks) instead of torchrun; `--no-launch` leaves it out.

The run ends with the ratios at every width side by side (the median of each round's own ratio,
with the rounds' range): a cost that grows with the width is work a step does beyond DDP's, not
per-step Python, which shows most at the smallest width.

Each width ends with a verdict on what the issue asks (accelify, its collectives recorded as under
`accelify launch`, within 1 % of raw DDP with accelify's options, in CPU time per step): "within"
or "OVER" only when the rounds can tell, "NOT DECIDED" when their own ratios spread wider than
twice the tolerance (a loaded machine moves a run's CPU time by more than 1 %), with the load
average before and after.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from accelify.runtime.environment import FAILURE_DIR
from accelify.runtime.launch.launcher import free_port

WORKER = Path(__file__).with_name("overhead_worker.py")
RECORDED = "accelify, collectives recorded"
LAUNCHED = "accelify launch"
RAW, MINE = "raw DDP", "raw DDP, accelify's options"


def run(
    impl: str, width: int, extra: list[str], records: str | None = None, launch: bool = False
) -> dict:
    if launch:  # as users run it: the launcher's rank entry, its record and its watcher
        starter = ["accelify", "launch", "--cpu", "--num_processes", "2"]
        starter += ["--main_process_port", str(free_port())]
    else:
        starter = ["torch.distributed.run", "--nproc-per-node", "2"]
        starter += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    command = [
        sys.executable,
        "-m",
        *starter,
        str(WORKER),
        "--impl",
        impl,
        "--width",
        str(width),
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(WORKER.parent.parent)}
    env.pop(FAILURE_DIR, None)
    if records is not None:  # what accelify launch sets: each rank records its collectives
        env[FAILURE_DIR] = records
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{impl} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure(
    variants: dict[str, tuple[str, list[str]]], width: int, rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, float]]:
    """Each variant's steps/s and CPU ms per step in each round, and its checksum."""
    rates: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    checksums: dict[str, float] = {}
    for _ in range(rounds):
        for name, (impl, extra) in variants.items():
            with tempfile.TemporaryDirectory() as records:
                recording = name == RECORDED
                result = run(impl, width, extra, records if recording else None, name == LAUNCHED)
            rates[name].append(result["steps_per_s"])
            cpu[name].append(result["cpu_ms_per_step"])
            checksums[name] = result["checksum"]
    return rates, cpu, checksums


def ratios(samples: dict[str, list[float]], name: str, other: str) -> list[float]:
    """Each round's ratio of name's sample over other's in the same round."""
    return [a / b for a, b in zip(samples[name], samples[other], strict=True)]


def ratio(samples: dict[str, list[float]], name: str, other: str) -> float:
    """The median over rounds of name's steps/s over other's in the same round."""
    return statistics.median(ratios(samples, name, other))


#: What the issue asks: accelify's step within 1 % of hand-written DDP's.
TOLERANCE = 0.01


def verdict(cost: list[float], tolerance: float = TOLERANCE) -> str:
    """Whether accelify's CPU time per step (``cost``: each round's ratio to raw DDP's, above 1:
    accelify costs more) is within ``tolerance``, said only when the rounds can tell: a median
    inside the tolerance means nothing when the rounds themselves spread wider than it (a
    shared machine's load moves a run's CPU time by several percent). Every round over it is a
    cost; a spread wider than twice the tolerance decides nothing."""
    low, high, middle = min(cost), max(cost), statistics.median(cost)
    spread = f"median {middle:.3f}, rounds {low:.3f} to {high:.3f}"
    if low > 1 + tolerance:
        return f"OVER {tolerance:.0%}: every round costs more ({spread})"
    if high - low > 2 * tolerance:
        return (
            f"NOT DECIDED: the rounds spread wider than the {tolerance:.0%} asked ({spread}); "
            "bench/interleaved_overhead.py alternates short blocks of every arm in one process "
            "group and decides by a bootstrap interval; bench/step_cost.py times each phase"
        )
    if middle <= 1 + tolerance:
        return f"within {tolerance:.0%} ({spread})"
    return f"OVER {tolerance:.0%} ({spread})"


#: The comparisons the closing table prints, side by side across the widths.
SUMMARY = (
    ("accelify", RAW),
    ("accelify", MINE),
    (RECORDED, MINE),
    (LAUNCHED, MINE),
    (LAUNCHED, RAW),
    ("raw DDP, a copy", RAW),
    ("accelify", "HF Accelerate"),
)


def summary(
    results: dict[int, tuple[dict[str, list[float]], dict[str, list[float]]]],
) -> list[str]:
    """The ratios at every width side by side: for each comparison, the median over rounds of
    its steps/s ratio (above 1: faster) and of its CPU-per-step ratio (above 1: costs more),
    with the rounds' range of the latter."""
    widths = list(results)
    present = results[widths[0]][0]
    rows = [(n, o) for n, o in SUMMARY if n in present and o in present]
    label = max(len(f"{n} / {o}") for n, o in rows) + 2
    cell = 28
    lines = [
        "",
        "accelify / raw DDP at every width: steps/s ratio (above 1: faster), CPU per step "
        "ratio (above 1: costs more) [rounds' range]",
        " " * label + "".join(f"{f'width {width}':>{cell}}" for width in widths),
    ]
    for name, other in rows:
        cells = []
        for width in widths:
            rates, cpu = results[width]
            cost = ratios(cpu, name, other)
            cells.append(
                f"{ratio(rates, name, other):.3f} {statistics.median(cost):.3f} "
                f"[{min(cost):.3f}-{max(cost):.3f}]"
            )
        lines.append(f"{f'{name} / {other}':{label}}" + "".join(f"{c:>{cell}}" for c in cells))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--widths", type=int, nargs="+", default=[128, 1024, 2048])
    parser.add_argument("--ddp-options", action="store_true")
    parser.add_argument(
        "--no-launch", action="store_true", help="leave out the arm run by `accelify launch`"
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="a second raw DDP arm: how far two runs of the same loop differ here",
    )
    parser.add_argument(
        "--steps", type=int, default=420, help="steps per rank per run (batch 32 per rank)"
    )
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start")
    length = ["--samples", str(32 * 2 * args.steps)]
    variants = {
        RAW: ("ddp", []),
        MINE: ("ddp", ["--bucket-view", "1"]),
        "accelify": ("accelify", []),
        RECORDED: ("accelify", []),
    }
    if not args.no_launch:
        variants[LAUNCHED] = ("accelify", [])
    if args.control:
        variants["raw DDP, a copy"] = ("ddp", [])
    if importlib.util.find_spec("accelerate") is not None:
        variants["HF Accelerate"] = ("accelerate", [])
    if args.ddp_options:
        variants["raw DDP, static_graph"] = ("ddp", ["--static-graph", "1"])
        variants["raw DDP, both"] = ("ddp", ["--bucket-view", "1", "--static-graph", "1"])
    results: dict[int, tuple[dict[str, list[float]], dict[str, list[float]]]] = {}
    for width in args.widths:
        sized = {name: (impl, [*extra, *length]) for name, (impl, extra) in variants.items()}
        rates, cpu, checksums = measure(sized, width, args.rounds)
        results[width] = rates, cpu
        print(
            f"\nMLP width {width}, 2 CPU ranks, {args.steps} steps per run, "
            f"median of {args.rounds} rounds"
        )
        print(f"{'implementation':40} {'steps/s':>9} {'CPU ms/step':>12} {'checksum':>14}")
        for name in variants:
            print(
                f"{name:40} {statistics.median(rates[name]):9.1f} "
                f"{statistics.median(cpu[name]):12.3f} {checksums[name]:14.6f}"
            )
        print(f"{'accelify / ...':40} {'steps/s':>9} {'CPU ms/step':>12}")
        for other in ("raw DDP", "raw DDP, accelify's options", "HF Accelerate"):
            if other in variants:
                print(
                    f"{'  ' + other:40} {ratio(rates, 'accelify', other):9.3f} "
                    f"{ratio(cpu, 'accelify', other):12.3f}"
                )
        mine = "raw DDP, accelify's options"
        print(
            f"{'accelify recorded / ' + mine:40} {ratio(rates, RECORDED, mine):9.3f} "
            f"{ratio(cpu, RECORDED, mine):12.3f}"
        )
        print(
            f"{'accelify recorded / accelify':40} {ratio(rates, RECORDED, 'accelify'):9.3f} "
            f"{ratio(cpu, RECORDED, 'accelify'):12.3f}"
        )
        for name in (RECORDED, LAUNCHED):
            if name in variants:
                print(
                    f"verdict, CPU per step of {name} / {mine}: "
                    f"{verdict(ratios(cpu, name, mine))} "
                    f"(load average {os.getloadavg()[0]:.1f} at the end)",
                    flush=True,
                )
    print("\n".join(summary(results)), flush=True)


if __name__ == "__main__":
    main()
