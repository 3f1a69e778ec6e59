"""One training loop, three ways: raw DDP (torch's defaults unless flags say otherwise),
accelify and Hugging Face Accelerate (their own defaults). Run under torchrun.

Prints one JSON line on rank 0: steps per second over the timed steps, the CPU time rank 0's
process spent per step (all its threads; on a shared machine this moves far less with the load
than the wall time), and a checksum of the final parameters (the three must train the same model
on the same data).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def build(width: int, samples: int):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1)
    )
    data = TensorDataset(torch.randn(samples, width), torch.randn(samples, 1))
    return model, torch.optim.SGD(model.parameters(), lr=1e-3), data


def raw_ddp(args):
    dist.init_process_group("gloo")
    model, optimizer, data = build(args.width, args.samples)
    model = nn.parallel.DistributedDataParallel(model, **ddp_options(args))
    sampler = DistributedSampler(data, shuffle=False)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)

    def backward(loss):
        loss.backward()

    return model, optimizer, loader, backward, dist.get_rank() == 0, dist.barrier


def ddp_options(args):
    return {"gradient_as_bucket_view": args.bucket_view, "static_graph": args.static_graph}


def with_accelerator(package: str):
    """The same loop on accelify's or HF Accelerate's Accelerator (same API)."""

    def setup(args):
        accelerator_class = importlib.import_module(package).Accelerator
        accelerator = accelerator_class(cpu=True)
        model, optimizer, data = build(args.width, args.samples)
        loader = DataLoader(data, batch_size=args.batch_size)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        return (
            model,
            optimizer,
            loader,
            accelerator.backward,
            accelerator.is_main_process,
            accelerator.wait_for_everyone,
        )

    return setup


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--impl", choices=["ddp", "accelify", "accelerate"], required=True)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--samples", type=int, default=32 * 2 * 420)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--bucket-view", type=int, default=0)
    parser.add_argument("--static-graph", type=int, default=0)
    args = parser.parse_args()
    setups = {
        "ddp": raw_ddp,
        "accelify": with_accelerator("accelify"),
        "accelerate": with_accelerator("accelerate"),
    }
    setup = setups[args.impl]
    model, optimizer, loader, backward, is_main, barrier = setup(args)
    loss_fn = nn.MSELoss()
    started = cpu_started = 0.0
    steps = 0
    for step, (x, y) in enumerate(loader):
        if step == args.warmup:
            barrier()
            started = time.perf_counter()
            cpu_started = time.process_time()
            steps = 0
        optimizer.zero_grad()
        backward(loss_fn(model(x), y))
        optimizer.step()
        steps += 1
    barrier()
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    if is_main:
        checksum = sum(p.detach().double().sum().item() for p in model.parameters())
        print(
            json.dumps(
                {
                    "impl": args.impl,
                    "steps_per_s": steps / elapsed,
                    "cpu_ms_per_step": cpu / steps * 1000,
                    "checksum": checksum,
                    "pid": os.getpid(),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
