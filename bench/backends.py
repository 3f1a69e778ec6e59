"""Engines side by side: steps/s and memory per rank for DDP, FSDP (one unit, and one unit per
layer) and ZeRO-1/2/3 on the same model, 2 CPU ranks, and through Hugging Face Accelerate where
it is installed and really runs the engine (on CPU it answers FSDP/DeepSpeed requests with DDP:
the row says so).

    python bench/backends.py [--width 1024] [--layers 8] [--steps 6]

Memory per rank, above what the process held before the model was built: the peak resident
memory (including the engines' transient gathers and buffers), and what is resident right after
an optimizer step (parameters, gradients and optimizer state held). Ratios are against
accelify's DDP.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from accelify.runtime.launch.launcher import LOOPBACK, free_port

WORKER = Path(__file__).resolve().parent / "engines_worker.py"
TIMEOUT = 600

ACCELIFY = {
    "DDP": ["--backend", "ddp"],
    "FSDP": ["--backend", "fsdp"],
    "FSDP/layer": ["--backend", "fsdp", "--fsdp-min-num-params", "1000000"],
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
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, env=env, check=False, timeout=TIMEOUT
        )
    except subprocess.TimeoutExpired:
        print(f"    no result within {TIMEOUT} s: {' '.join(command[:8])}", file=sys.stderr)
        return None
    reports = [
        json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"rank"')
    ]
    if result.returncode != 0 or not reports:
        tail = (result.stdout + result.stderr).strip().splitlines()[-3:]
        print(f"    failed: {' | '.join(tail)}", file=sys.stderr)
        return None
    return reports


def summarise(reports: list[dict] | None, engine: str) -> tuple[float, float, float] | str | None:
    """Slowest rank's steps/s and largest peak; a note instead when the package quietly ran
    another engine (Accelerate falls back to DDP for FSDP/DeepSpeed requests on CPU)."""
    if reports is None:
        return None
    wrapper = reports[0]["model"]
    if engine != "DDP" and wrapper == "DistributedDataParallel":
        return f"ran DDP instead ({wrapper})"
    steps = min(r["steps_per_s"] for r in reports)
    return steps, max(r["peak_mib"] for r in reports), max(r["held_mib"] for r in reports)


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
    results: dict[tuple[str, str], tuple[float, float, float] | str | None] = {}
    # glibc keeps freed blocks below its (self-raising) mmap threshold in the heap, so resident
    # memory would count tensors long gone; a fixed threshold returns them to the OS at once.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "131072"}
    for engine, flags in ACCELIFY.items():
        if engine.startswith("ZeRO") and not has_deepspeed:
            continue
        command = [sys.executable, "-m", "accelify", "launch", "--cpu", "-n", "2", *flags]
        results[("accelify", engine)] = summarise(
            run([*command, str(WORKER), "accelify", *sizes], env), engine
        )
        if not has_accelerate or engine not in ACCELERATE:
            continue
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
        torchrun += ["--master-addr", LOOPBACK, "--master-port", str(free_port())]
        hf_env = {**env, **ACCELERATE[engine], "ACCELERATE_USE_CPU": "true"}
        results[("accelerate", engine)] = summarise(
            run([*torchrun, str(WORKER), "accelerate", *sizes], hf_env), engine
        )
    reference = results.get(("accelify", "DDP"))
    if not isinstance(reference, tuple):
        reference = None
    header = ("engine", "package", "steps/s", "vs DDP", "peak MiB", "vs DDP", "held MiB", "vs DDP")
    print("{:10} {:11} {:>8} {:>7} {:>9} {:>7} {:>9} {:>7}".format(*header))
    for (package, engine), measured in results.items():
        if measured is None or isinstance(measured, str):
            print(f"{engine:10} {package:11} {measured or 'failed'}")
            continue
        cells = [f"{engine:10}", f"{package:11}"]
        for index, width in ((0, 8), (1, 9), (2, 9)):
            value = measured[index]
            ratio = value / reference[index] if reference else float("nan")
            shown = f"{value:{width}.2f}" if index == 0 else f"{value:{width}.0f}"
            cells += [shown, f"{ratio:7.2f}"]
        print(" ".join(cells))


if __name__ == "__main__":
    main()
