"""What `accelify verify`'s probe costs per optimizer step, side by side with the script alone.

    python bench/verify_probe.py [--steps 400] [--width 256] [--rounds 3]

Runs one training loop (an MLP on random data, SGD, one backward and one step per iteration)
three ways, alternating over several rounds, and prints the median steps/s of each:
the script alone; the script computing the probe's fingerprint itself after every step (one
fp32 norm per parameter, the part of the probe's cost that buys information); and the
script run under the probe (`python -m accelify.verify.probe`). The last two should match: the
hooks add nothing measurable beyond the fingerprint.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = """
import sys, time, torch
width, steps, fingerprint = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)])
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
x, y = torch.randn(32, width), torch.randn(32, width)
for _ in range(20):  # warm-up
    optimizer.zero_grad(); torch.nn.functional.mse_loss(model(x), y).backward(); optimizer.step()
started = time.perf_counter()
for _ in range(steps):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    if fingerprint:
        with torch.no_grad():
            norms = [float(torch.linalg.vector_norm(p, dtype=torch.float32))
                     for p in model.parameters()]
        float(loss.detach().double())
print(steps / (time.perf_counter() - started))
"""


def steps_per_second(command: list[str], env: dict[str, str]) -> float:
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return float(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "loop.py"
        script.write_text(SCRIPT)
        env = {
            **os.environ,
            "ACCELIFY_VERIFY_OUT": str(Path(scratch) / "records"),
            "ACCELIFY_VERIFY_STEPS": str(10**9),  # never stop the loop
        }
        common = [str(args.width), str(args.steps)]
        ways = {
            "script alone": [sys.executable, str(script), *common, "0"],
            "script + fingerprint by hand": [sys.executable, str(script), *common, "1"],
            "under the probe": [
                sys.executable,
                "-m",
                "accelify.verify.probe",
                str(script),
                *common,
                "0",
            ],
        }
        rates: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, command in ways.items():
                rates[name].append(steps_per_second(command, env))
    alone = statistics.median(rates["script alone"])
    by_hand = statistics.median(rates["script + fingerprint by hand"])
    for name, values in rates.items():
        rate = statistics.median(values)
        print(
            f"{name:30} {rate:8.1f} steps/s   vs alone {rate / alone:5.2f}   "
            f"vs fingerprint by hand {rate / by_hand:5.2f}"
        )


if __name__ == "__main__":
    main()
