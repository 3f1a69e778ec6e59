"""Engines side by side: steps/s and peak memory per rank for DDP, FSDP and ZeRO-1/2/3 on the
same model, 2 CPU ranks, and the same through Hugging Face Accelerate where it is installed.

    python bench/backends.py [--width 1024] [--layers 8] [--steps 6]

Memory is the peak resident memory of each rank above what it held before the model was built
(parameters, gradients, Adam state, activations, communication buffers): sharding engines should
cut it as they promise. The ratios are against accelify's DDP.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).resolve().parent / "engines_worker.py"

ACCELIFY = {
    "DDP": ["--backend", "ddp"],
    "FSDP": ["--backend", "fsdp"],
    "ZeRO-1": ["--backend", "deepspeed", "--zero-stage", "1"],
    "ZeRO-2": ["--backend", "deepspeed", "--zero-stage", "2"],
    "ZeRO-3": ["--backend", "deepspeed", "--zero-stage", "3"],
}
# Hugging Face Accelerate reads its launcher's choices from these variables.
ACCELERATE = {
    "DDP": {},
    "FSDP": {
        "ACCELERATE_USE_FSDP": "true",
        "FSDP_VERSION": "2",
        "FSDP_RESHARD_AFTER_FORWARD": "true",
        "FSDP_AUTO_WRAP_POLICY": "NO_WRAP",
    },
    **{
        f"ZeRO-{stage}": {
            "ACCELERATE_USE_DEEPSPEED": "true",
            "ACCELERATE_DEEPSPEED_ZERO_STAGE": str(stage),
        }
        for stage in (1, 2, 3)
    },
}


def run(command: list[str], env: dict[str, str]) -> list[dict] | None:
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    reports = [
        json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"rank"')
    ]
    if result.returncode != 0 or not reports:
        tail = (result.stdout + result.stderr).strip().splitlines()[-3:]
        print(f"    failed: {' | '.join(tail)}", file=sys.stderr)
        return None
    return reports


def summarise(reports: list[dict] | None) -> tuple[float, float] | None:
    if reports is None:
        return None
    steps = min(r["steps_per_s"] for r in reports)
    memory = max(r["peak_mib"] for r in reports)
    return steps, memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    sizes = ["--width", str(args.width), "--layers", str(args.layers), "--steps", str(args.steps)]
    has_deepspeed = importlib.util.find_spec("deepspeed") is not None
    has_accelerate = importlib.util.find_spec("accelerate") is not None
    parameters = args.layers * (args.width * args.width + args.width) + args.width + 1
    print(f"model: {parameters / 1e6:.1f}M parameters (fp32, Adam), 2 CPU ranks")
    results: dict[tuple[str, str], tuple[float, float] | None] = {}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for engine, flags in ACCELIFY.items():
        if engine.startswith("ZeRO") and not has_deepspeed:
            continue
        command = [sys.executable, "-m", "accelify", "launch", "--cpu", "-n", "2", *flags]
        results[("accelify", engine)] = summarise(
            run([*command, str(WORKER), "accelify", *sizes], env)
        )
        if not has_accelerate:
            continue
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
        torchrun += ["--master-addr", "127.0.0.1", "--master-port", "0"]
        hf_env = {**env, **ACCELERATE[engine], "ACCELERATE_USE_CPU": "true"}
        results[("accelerate", engine)] = summarise(
            run([*torchrun, str(WORKER), "accelerate", *sizes], hf_env)
        )
    reference = results.get(("accelify", "DDP"))
    header = ("engine", "package", "steps/s", "peak MiB/rank", "vs DDP", "memory vs DDP")
    print("{:8} {:11} {:>8} {:>14} {:>7} {:>14}".format(*header))
    for (package, engine), measured in results.items():
        if measured is None:
            print(f"{engine:8} {package:11} {'failed':>8}")
            continue
        steps, memory = measured
        speed = steps / reference[0] if reference else float("nan")
        share = memory / reference[1] if reference else float("nan")
        print(f"{engine:8} {package:11} {steps:8.2f} {memory:14.0f} {speed:7.2f} {share:14.2f}")


if __name__ == "__main__":
    main()
