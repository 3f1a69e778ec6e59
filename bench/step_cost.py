"""Where a training step's CPU time goes: raw DDP against accelify, in one process, per phase.

    python bench/step_cost.py [--widths 32 1024] [--rounds 30] [--block 25] [--recorded]

`runtime_overhead.py` compares whole runs, one after the other: on a shared machine the load
moves between them, and a few percent is noise. Here each rank builds every arm side by side on
the same process group and alternates them in blocks of steps, in a new order each round; each
arm's time is the main thread's CPU time (`time.thread_time`: what the training loop itself
spends, not the waits for the peer nor the time the machine gave to others), per step, per
phase (the loader's next batch, zero_grad, forward, loss, backward, step), and the Python
function calls one step makes (cProfile over one more block: a count, which the load does not
move, where the times move by several percent on a loaded machine). The ratios are the
medians of each round's own ratio against raw DDP with accelify's DDP options
(``gradient_as_bucket_view=True``). The arms:

- ``raw DDP``: the hand-written loop;
- ``accelify``: `Accelerator.prepare`'s model, optimizer and loader, `accelerator.backward`;
- ``accelify's objects, plain calls``: the same prepared objects, driven with
  ``loss.backward()`` and the wrapped optimizer's own ``step``/``zero_grad``: what the prepared
  model and loader cost, without the Accelerator's backward and the optimizer's wrapper;
- ``raw DDP + bookkeeping``: raw DDP, its backward inside the collective record's backward pass
  and the pending-work tracking `Accelerator.backward` puts around it; ``+ pending-work
  tracking`` and ``+ backward recorded``: each of the two alone.

``--recorded`` runs the ranks as `accelify launch` does (``ACCELIFY_FAILURE_DIR``: every rank
records its collectives). Run under torchrun by this script itself, 2 CPU ranks.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAW, ACCELIFY, PLAIN, BOOKKEEPING, TRACKING, RECORDING = (
    "raw DDP",
    "accelify",
    "accelify's objects, plain calls",
    "raw DDP + bookkeeping",
    "raw DDP + pending-work tracking",
    "raw DDP + backward recorded",
)
PHASES = ("next", "zero_grad", "forward", "loss", "backward", "step")


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.utils.data import DataLoader, DistributedSampler

    from accelify import Accelerator
    from accelify.runtime import collective_record, pending_work

    sys.path.insert(0, str(Path(__file__).parent))
    from overhead_worker import build

    if args.gc_off:
        import gc

        gc.disable()
    accelerator = Accelerator(cpu=True)
    samples = 32 * 2 * args.block * (args.rounds + 2)
    spent: dict[str, collections.Counter[str]] = {}
    loss_fn = nn.MSELoss()

    def timed(arm: str, phase: str, function, *arguments):
        started = time.thread_time()
        result = function(*arguments)
        spent[arm][phase] += time.thread_time() - started
        return result

    def raw_arm(name: str, recorded: bool, tracked: bool):
        model, optimizer, data = build(args.width, samples)
        model = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
        loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data, shuffle=False))

        def backward(loss):
            if not (recorded or tracked):
                return loss.backward()
            with (
                collective_record.backward_pass(lambda: True)
                if recorded
                else contextlib.nullcontext(),
                pending_work.tracked(tracked),
            ):
                return loss.backward()

        return name, model, optimizer.zero_grad, backward, optimizer.step, loader

    def accelify_arm(name: str, plain: bool):
        model, optimizer, data = build(args.width, samples)
        model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, 32))
        if plain:
            inner = optimizer.optimizer
            return name, model, inner.zero_grad, lambda loss: loss.backward(), inner.step, loader
        return name, model, optimizer.zero_grad, accelerator.backward, optimizer.step, loader

    arms = [
        raw_arm(RAW, recorded=False, tracked=False),
        accelify_arm(ACCELIFY, plain=False),
        accelify_arm(PLAIN, plain=True),
        raw_arm(BOOKKEEPING, recorded=True, tracked=True),
        raw_arm(TRACKING, recorded=False, tracked=True),
        raw_arm(RECORDING, recorded=True, tracked=False),
    ]
    batches = {name: iter(loader) for name, *_, loader in arms}
    per_step: dict[str, list[float]] = {name: [] for name, *_ in arms}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        order = list(arms)
        random.Random(round_).shuffle(order)  # the same order on every rank
        for name, model, zero_grad, backward, step, _ in order:
            spent[name] = spent.get(name) or collections.Counter()
            before = dict(spent[name])
            dist.barrier()
            started = time.thread_time()
            for _ in range(args.block):
                x, y = timed(name, "next", next, batches[name])
                timed(name, "zero_grad", zero_grad)
                output = timed(name, "forward", model, x)
                loss = timed(name, "loss", loss_fn, output, y)
                timed(name, "backward", backward, loss)
                timed(name, "step", step)
            if round_:
                per_step[name].append((time.thread_time() - started) / args.block * 1e6)
            else:
                spent[name] = collections.Counter(before)

    def step_of(arm):  # the loop above, untimed: one step of the arm
        name, model, zero_grad, backward, step, _ = arm

        def one_step() -> None:
            x, y = next(batches[name])
            zero_grad()
            backward(loss_fn(model(x), y))
            step()

        return one_step

    # the loaders hold one block beyond the rounds': counted in the same order on every rank
    calls = {arm[0]: python_calls(step_of(arm), args.block) for arm in arms}
    if dist.get_rank() == 0:
        steps = args.block * args.rounds
        print(
            json.dumps(
                {
                    name: {
                        "calls": calls[name],
                        "cpu_us": statistics.median(samples_),
                        "ratio": statistics.median(
                            mine / raw for mine, raw in zip(samples_, per_step[RAW], strict=True)
                        ),
                        "phases": {p: spent[name][p] / steps * 1e6 for p in PHASES},
                    }
                    for name, samples_ in per_step.items()
                }
            ),
            flush=True,
        )
    torch.distributed.barrier()


def python_calls(step, steps: int) -> float:
    """The Python function calls one step of an arm makes, counted by cProfile over ``steps``
    steps on every rank (the peers must step too): a count, which the machine's load does not
    move, where the times above move by several percent."""
    import cProfile
    import pstats

    import torch.distributed as dist

    dist.barrier()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(steps):
        step()
    profile.disable()
    dist.barrier()
    return sum(row[1] for row in pstats.Stats(profile).stats.values()) / steps  # type: ignore[attr-defined]


def run(width: int, args: argparse.Namespace) -> dict:
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
        "--rounds",
        str(args.rounds),
        "--block",
        str(args.block),
        *(["--gc-off"] if args.gc_off else []),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parent.parent)}
    env.pop(FAILURE_DIR, None)
    with tempfile.TemporaryDirectory() as records:
        if args.recorded:
            env[FAILURE_DIR] = records
        result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise SystemExit(f"width {width} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[32, 1024])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--block", type=int, default=25, help="steps per arm per round")
    parser.add_argument("--recorded", action="store_true")
    parser.add_argument(
        "--gc-off",
        action="store_true",
        help="Python's cyclic garbage collector off in the ranks: what the arms' allocations "
        "cost through the collections they set off",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.width = args.widths[0]
        return worker(args)
    for width in args.widths:
        load = os.getloadavg()[0]
        arms = run(width, args)
        print(
            f"\nMLP width {width}, 2 CPU ranks, {args.rounds} rounds of {args.block} steps per "
            f"arm, collectives {'recorded' if args.recorded else 'not recorded'}"
            f"{', GC off' if args.gc_off else ''}, "
            f"load {load:.1f} on {os.cpu_count()} cores"
        )
        header = "".join(f"{phase:>10}" for phase in PHASES)
        print(f"{'main thread CPU us/step':34} {'total':>8} {'/ raw':>7}{header} {'py calls':>9}")
        for name, arm in arms.items():
            phases = "".join(f"{arm['phases'][phase]:10.1f}" for phase in PHASES)
            print(f"{name:34} {arm['cpu_us']:8.1f} {arm['ratio']:7.3f}{phases} {arm['calls']:9.1f}")


if __name__ == "__main__":
    main()
