"""One training loop under an engine, run by bench/backends.py through a launcher.

    engines_worker.py accelify|accelerate --width W --layers L --steps S

Under `accelify launch --backend ...` (accelify) or torchrun with Accelerate's environment
variables for FSDP/DeepSpeed (accelerate). Adam, so that optimizer state is a large part of the
memory, as in real training. Prints one JSON line per rank: steps/s over the timed steps, the
peak resident memory above what the process held before the model was built, and the resident
memory right after an optimizer step (parameters, gradients and optimizer state held), in MiB.
"""

from __future__ import annotations

import argparse
import importlib
import json
import resource
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def resident_mib() -> float:
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("package", choices=["accelify", "accelerate"])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()

    accelerator = importlib.import_module(args.package).Accelerator(cpu=True)
    baseline = resident_mib()
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(args.width, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    samples = args.batch_size * accelerator.num_processes * (args.steps + 2)
    data = TensorDataset(torch.randn(samples, args.width), torch.randn(samples, 1))
    loader = DataLoader(data, batch_size=args.batch_size)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    started = None
    for step, (x, y) in enumerate(loader):
        if step == 2:  # the first steps build optimizer state and warm up
            accelerator.wait_for_everyone()
            started = time.perf_counter()
        loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        held = resident_mib() - baseline  # parameters, gradients and optimizer state, after a step
        optimizer.zero_grad()
        if step + 1 == args.steps + 2:
            break
    accelerator.wait_for_everyone()
    elapsed = time.perf_counter() - started
    report = {
        "rank": accelerator.process_index,
        "steps_per_s": args.steps / elapsed,
        "peak_mib": peak_mib() - baseline,
        "held_mib": held,
        "model": type(model).__name__,  # what the engine made of it: a check that it ran
    }
    # One write per line: both ranks share the pipe, and print() writes the newline separately.
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
