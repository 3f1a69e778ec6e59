"""Steps/s of one training loop on 2 CPU ranks: raw DDP, accelify, and HF Accelerate if installed.

    python bench/runtime_overhead.py [--rounds 3] [--widths 512 2048]

Each implementation runs under the same `torch.distributed.run` command, the rounds alternate the
implementations so that machine noise hits all alike, and the median of the rounds is reported
with the ratios accelify/DDP and accelify/Accelerate. The checksum column shows that the three
trained the same model. `--ddp-options` also measures DDP's own options on the raw loop.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from accelify.runtime.launch.launcher import free_port

WORKER = Path(__file__).with_name("overhead_worker.py")


def run(impl: str, width: int, extra: list[str]) -> dict:
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
        str(WORKER),
        "--impl",
        impl,
        "--width",
        str(width),
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(WORKER.parent.parent)}
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{impl} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure(variants: dict[str, tuple[str, list[str]]], width: int, rounds: int) -> dict:
    samples: dict[str, list[float]] = {name: [] for name in variants}
    checksums: dict[str, float] = {}
    for _ in range(rounds):
        for name, (impl, extra) in variants.items():
            result = run(impl, width, extra)
            samples[name].append(result["steps_per_s"])
            checksums[name] = result["checksum"]
    return {name: (statistics.median(v), checksums[name]) for name, v in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--widths", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--ddp-options", action="store_true")
    args = parser.parse_args()
    variants = {"raw DDP": ("ddp", []), "accelify": ("accelify", [])}
    if importlib.util.find_spec("accelerate") is not None:
        variants["HF Accelerate"] = ("accelerate", [])
    if args.ddp_options:
        variants["raw DDP, gradient_as_bucket_view"] = ("ddp", ["--bucket-view", "1"])
        variants["raw DDP, static_graph"] = ("ddp", ["--static-graph", "1"])
        variants["raw DDP, both"] = ("ddp", ["--bucket-view", "1", "--static-graph", "1"])
    for width in args.widths:
        results = measure(variants, width, args.rounds)
        print(f"\nMLP width {width}, 2 CPU ranks, median of {args.rounds} rounds")
        print(f"{'implementation':40} {'steps/s':>9} {'checksum':>14}")
        for name, (rate, checksum) in results.items():
            print(f"{name:40} {rate:9.1f} {checksum:14.6f}")
        accelify_rate = results["accelify"][0]
        print(f"accelify / raw DDP:      {accelify_rate / results['raw DDP'][0]:.3f}")
        if "HF Accelerate" in results:
            print(f"accelify / HF Accelerate: {accelify_rate / results['HF Accelerate'][0]:.3f}")


if __name__ == "__main__":
    main()
