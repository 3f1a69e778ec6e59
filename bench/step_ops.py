"""The tensor work one training step does: raw DDP against accelify, op by op, counted.

    python bench/step_ops.py [--widths 128 1024 2048] [--steps 4]

A cost that grows with the model's width is not per-step Python (that is the same at every
width, and shows most at the smallest): it is work, an op one side runs that the other does not
(an extra copy or cast of the parameters or gradients, a bucket copied back into ``.grad``, a
zeroing pass). Times on a shared machine cannot find it; this lists it. Every arm is built in the
same process group from the same seeds, warmed up (DDP rebuilds its buckets after the first
backward), and ``torch.profiler`` records the ops (with their input shapes) of ``--steps`` steps
on each rank; rank 0 prints, per width, each op and shape whose count per step differs between
the arms, or that the arms run the same ops. The arms:

- ``raw DDP``: the hand-written loop, torch's DDP defaults (``DistributedSampler``);
- ``raw DDP, accelify's options``: the same with ``gradient_as_bucket_view=True``, which accelify
  sets (the bucket is the gradient: no copy back into ``.grad`` after the all-reduce);
- ``accelify``: `Accelerator.prepare`'s model, optimizer and loader, `Accelerator.backward`,
  collectives recorded as under `accelify launch` (``ACCELIFY_FAILURE_DIR`` set).

Run under torchrun by this script itself, 2 CPU ranks, one intra-op thread each.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

RAW, MINE, ACCELIFY = "raw DDP", "raw DDP, accelify's options", "accelify"


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.utils.data import DataLoader, DistributedSampler

    from accelify import Accelerator

    sys.path.insert(0, str(Path(__file__).parent))
    from overhead_worker import build

    accelerator = Accelerator(cpu=True)
    samples = 32 * 2 * (args.steps + 10)
    loss_fn = nn.MSELoss()

    def raw(view: bool):
        model, optimizer, data = build(args.width, samples)
        model = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=view)
        loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data, shuffle=False))
        return model, optimizer, loader, lambda loss: loss.backward()

    def prepared():
        model, optimizer, data = build(args.width, samples)
        model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, 32))
        return model, optimizer, loader, accelerator.backward

    arms = {RAW: raw(False), MINE: raw(True), ACCELIFY: prepared()}
    counts: dict[str, dict[str, float]] = {}
    threads: dict[str, int] = {}
    for name, (model, optimizer, loader, backward) in arms.items():
        batches = iter(loader)

        def step(model=model, optimizer=optimizer, backward=backward, batches=batches) -> None:
            x, y = next(batches)
            optimizer.zero_grad()
            backward(loss_fn(model(x), y))
            optimizer.step()

        for _ in range(5):  # the buckets' rebuild, the optimizer's first step
            step()
        dist.barrier()
        activities = [torch.profiler.ProfilerActivity.CPU]
        with torch.profiler.profile(activities=activities, record_shapes=True) as profile:
            for _ in range(args.steps):
                step()
        dist.barrier()
        ops: collections.Counter[str] = collections.Counter()
        for event in profile.events():
            ops[f"{event.name} {event.input_shapes}"] += 1
        counts[name] = {op: count / args.steps for op, count in ops.items()}
        threads[name] = torch.get_num_threads()
    if dist.get_rank() == 0:
        print(json.dumps({"ops": counts, "threads": threads}), flush=True)
    dist.barrier()


def run(width: int, steps: int) -> dict:
    from accelify.runtime.environment import FAILURE_DIR
    from accelify.runtime.launch.launcher import free_port

    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        __file__,
        "--worker",
        "--widths",
        str(width),
        "--steps",
        str(steps),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parent.parent)}
    with tempfile.TemporaryDirectory() as records:
        env[FAILURE_DIR] = records
        result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise SystemExit(f"width {width} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def differences(ops: dict[str, dict[str, float]]) -> list[tuple[str, list[float]]]:
    """Each op (with its input shapes) whose count per step is not the same in every arm."""
    names = sorted(set().union(*ops.values()))
    rows = [(name, [ops[arm].get(name, 0.0) for arm in ops]) for name in names]
    return [(name, row) for name, row in rows if len(set(row)) > 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[128, 1024, 2048])
    parser.add_argument("--steps", type=int, default=4, help="steps profiled per arm")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.width = args.widths[0]
        return worker(args)
    for width in args.widths:
        result = run(width, args.steps)
        ops = result["ops"]
        totals = ", ".join(f"{arm} {sum(row.values()):.0f}" for arm, row in ops.items())
        print(f"\nMLP width {width}, 2 CPU ranks, ops per step (rank 0): {totals}")
        print(f"intra-op threads: {result['threads']}")
        rows = differences(ops)
        if not rows:
            print("every arm runs the same ops, with the same input shapes, per step")
            continue
        print(f"{'op [input shapes]':70}" + "".join(f"{arm[:14]:>15}" for arm in ops))
        for name, row in rows:
            print(f"{name[:70]:70}" + "".join(f"{count:15.2f}" for count in row))
        same = "the same ops as" if ops[MINE] == ops[ACCELIFY] else "ops that differ from"
        print(f"accelify runs {same} raw DDP with accelify's options")


if __name__ == "__main__":
    main()
