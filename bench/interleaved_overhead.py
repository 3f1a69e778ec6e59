"""accelify's training step against hand-written DDP's, decided by paired, interleaved blocks.

    python bench/interleaved_overhead.py [--widths 32 512 2048] [--rounds 40] [--block 20]
                                         [--source SRC]

`runtime_overhead.py`'s whole runs, one after the other, could not tell 1 % apart on a shared
machine: the load moves between two runs by several percent. Here both ranks build every arm in
one process group and alternate them in short blocks of steps (A B, then B A, round after round,
so that neither always goes first), each block timed on each rank by its wall clock, its
process's CPU time (all threads: gloo's work threads included) and its main thread's CPU time.
Each round gives one ratio per measure (the arm's block over raw DDP's block of the same round:
the load they saw was the same within a few hundred milliseconds); the median of the rounds'
ratios is reported with a 95 % bootstrap interval, and the verdict on the issue's 1 % is
"within" only when the interval's top is at most 1.01, "OVER" when its bottom is above it.
Torch runs one intra-op thread in every arm (``torch.set_num_threads(1)``, the process is
shared: the pinning is the same on every side).

The arms, each its own model, optimizer and loader over the same data:

- ``raw DDP``: the hand-written loop, DDP with the option accelify sets
  (``gradient_as_bucket_view=True``): accelify against it is what accelify adds;
- ``accelify recorded``: `Accelerator.prepare`'s objects and `Accelerator.backward`, each
  collective recorded for the launcher's hang diagnosis as under `accelify launch`;
- ``accelify``: the same without the record (the recorder set aside while it runs);
- ``raw DDP, a copy``: the hand-written loop again, its own objects: the control. Two arms that
  run the same code still differ (where their tensors landed in memory, the caches): its ratio
  to raw DDP is how far this bench can see on this machine, and no verdict on accelify is
  finer than that.

Run under torchrun by this script itself, 2 CPU ranks. ``--source SRC`` runs another accelify (a
source tree laid out as installed: ``SRC/accelify/runtime``), to set a change beside the code
before it, run after run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAW, COPY, RECORDED, UNRECORDED = "raw DDP", "raw DDP, a copy", "accelify recorded", "accelify"
MEASURES = ("cpu", "wall", "thread")
WORDS = {
    "cpu": "process CPU",
    "wall": "wall clock",
    "thread": "main thread CPU",
}
#: What the issue asks: accelify's step within 1 % of hand-written DDP's.
TOLERANCE = 0.01


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.utils.data import DataLoader, DistributedSampler

    from accelify import Accelerator
    from accelify.runtime import collective_record

    sys.path.insert(0, str(Path(__file__).parent))
    from overhead_worker import build

    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    recorder = collective_record._recorder
    if not args.block:
        args.block = calibrated_block(args.width, args.seconds)
    samples = 32 * accelerator.num_processes * args.block
    loss_fn = nn.MSELoss()

    def raw_arm():
        model, optimizer, data = build(args.width, samples)
        model = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
        loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data, shuffle=False))
        return model, optimizer, loader, lambda loss: loss.backward()

    def accelify_arm():
        model, optimizer, data = build(args.width, samples)
        model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, 32))
        return model, optimizer, loader, accelerator.backward

    arms = {RAW: raw_arm()}
    arms[RECORDED] = accelify_arm()
    arms[COPY] = raw_arm()
    collective_record._recorder = None  # this arm's model and steps record nothing
    arms[UNRECORDED] = accelify_arm()
    collective_record._recorder = recorder
    if recorder is None and args.recorded:
        raise SystemExit("no collective record: run under this script, which sets the folder")

    def block(name: str) -> dict[str, float]:
        model, optimizer, loader, backward = arms[name]
        collective_record._recorder = None if name == UNRECORDED else recorder
        batches = iter(loader)  # a pass of the loader per block, begun before the clocks start
        dist.barrier()
        wall, cpu, thread = time.perf_counter(), time.process_time(), time.thread_time()
        for x, y in batches:
            optimizer.zero_grad()
            backward(loss_fn(model(x), y))
            optimizer.step()
        spent = {
            "wall": time.perf_counter() - wall,
            "cpu": time.process_time() - cpu,
            "thread": time.thread_time() - thread,
        }
        collective_record._recorder = recorder
        return {measure: seconds / args.block * 1e3 for measure, seconds in spent.items()}

    names = list(arms)
    samples_: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        order = names[::-1] if round_ % 2 else names  # A B C, then C B A
        for name in order:
            result = block(name)
            if round_:
                samples_[name].append(result)
    everyone: list[dict] = [{}] * dist.get_world_size()
    dist.all_gather_object(everyone, samples_)
    if dist.get_rank() == 0:
        print(json.dumps({"block": args.block, "ranks": everyone}), flush=True)
    dist.barrier()


def calibrated_block(width: int, seconds: float) -> int:
    """The steps a block runs so that it lasts about ``seconds`` (the same on every rank): a
    block of a few milliseconds is all noise, one of several seconds lets the load drift
    between an arm's block and the next arm's."""
    import torch
    import torch.distributed as dist
    from torch import nn

    sys.path.insert(0, str(Path(__file__).parent))
    from overhead_worker import build

    model, optimizer, _ = build(width, 1)
    model = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
    x, y = torch.randn(32, width), torch.randn(32, 1)
    for step in range(15):
        if step == 5:
            dist.barrier()
            started = time.perf_counter()
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    per_step = (time.perf_counter() - started) / 10
    steps = torch.tensor([min(max(round(seconds / per_step), 5), 500)])
    dist.all_reduce(steps, dist.ReduceOp.MAX)
    return int(steps.item())


def bootstrap(ratios: list[float], resamples: int = 4000, seed: int = 0) -> tuple[float, float]:
    """The 95 % interval of the median of ``ratios`` (percentiles of the resampled medians)."""
    rng = random.Random(seed)
    medians = sorted(
        statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples)
    )
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def paired(ranks: list[dict], name: str, measure: str, rank: int | None) -> list[float]:
    """Each round's ratio of the arm's block to raw DDP's, on one rank or (None) both together
    (the sum of the ranks' times)."""
    chosen = ranks if rank is None else [ranks[rank]]
    arm = [sum(r[name][i][measure] for r in chosen) for i in range(len(chosen[0][name]))]
    raw = [sum(r[RAW][i][measure] for r in chosen) for i in range(len(chosen[0][RAW]))]
    return [a / b for a, b in zip(arm, raw, strict=True)]


def verdict(low: float, high: float, tolerance: float = TOLERANCE) -> str:
    if high <= 1 + tolerance:
        return f"within {tolerance:.0%}"
    if low > 1 + tolerance:
        return f"OVER {tolerance:.0%}"
    return "NOT DECIDED (the interval spans the tolerance: more rounds)"


def run(width: int, args: argparse.Namespace) -> dict:
    from accelify.runtime.environment import FAILURE_DIR
    from accelify.runtime.launch.launcher import free_port

    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"),
        *("--master-addr", "127.0.0.1", "--master-port", str(free_port())),
        *(__file__, "--worker", "--widths", str(width)),
        *("--rounds", str(args.rounds), "--block", str(args.block)),
        *("--seconds", str(args.seconds)),
    ]
    source = args.source or str(Path(__file__).parent.parent)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": source}
    with tempfile.TemporaryDirectory() as records:
        env[FAILURE_DIR] = records  # as `accelify launch` sets it: every rank records
        result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise SystemExit(f"width {width} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def report(width: int, result: dict, args: argparse.Namespace, load: float) -> None:
    ranks = result["ranks"]
    print(
        f"\nMLP width {width}, 2 CPU ranks, {args.rounds} rounds of {result['block']} steps "
        f"per arm, arms alternated, load {load:.1f} -> {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} cores"
    )
    print(f"{'ms per step (median of rounds)':34}" + "".join(f"{WORDS[m]:>17}" for m in MEASURES))
    for name in ranks[0]:
        values = "".join(
            f"{statistics.median(s[measure] for r in ranks for s in r[name]):17.3f}"
            for measure in MEASURES
        )
        print(f"{name:34}{values}")
    for name in (RECORDED, UNRECORDED, COPY):
        print(f"{name} / {RAW}: median ratio of the rounds [95 % bootstrap interval]")
        for measure in MEASURES:
            cells = []
            for rank in (None, *range(len(ranks))):
                ratios = paired(ranks, name, measure, rank)
                low, high = bootstrap(ratios)
                who = "both ranks" if rank is None else f"rank {rank}"
                cells.append(f"{who} {statistics.median(ratios):.3f} [{low:.3f}, {high:.3f}]")
            print(f"  {WORDS[measure]:16} " + "; ".join(cells))
    for measure in MEASURES:
        ratios = paired(ranks, RECORDED, measure, None)
        low, high = bootstrap(ratios)
        control = paired(ranks, COPY, measure, None)
        print(
            f"verdict, {WORDS[measure]} per step of {RECORDED} / {RAW} (both ranks): "
            f"{verdict(low, high)}: median {statistics.median(ratios):.3f} "
            f"[{low:.3f}, {high:.3f}]; the control (a copy of raw DDP) "
            f"{statistics.median(control):.3f} {list(map(round3, bootstrap(control)))}",
            flush=True,
        )


def round3(value: float) -> float:
    return round(value, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[32, 512, 2048])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument(
        "--block", type=int, default=0, help="steps per arm per round (0: --seconds' worth)"
    )
    parser.add_argument("--seconds", type=float, default=0.3, help="a block's length")
    parser.add_argument("--source", help="another accelify's source tree, laid out as installed")
    parser.add_argument("--recorded", action="store_true", default=True, help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.width = args.widths[0]
        return worker(args)
    for width in args.widths:
        load = os.getloadavg()[0]
        report(width, run(width, args), args, load)


if __name__ == "__main__":
    main()
