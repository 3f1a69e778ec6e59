"""Instructions per training step: hand-written DDP against accelify, counted, not timed.

    python bench/step_instructions.py [--widths 32 512 2048] [--rounds 3] [--block 20]
                                      [--phases] [--counter callgrind|calls] [--source SRC]

Times on a shared machine cannot see 1 % (`interleaved_overhead.py` needs tens of rounds to
decide it, and the load still moves its medians); a count of instructions can. Rank 0 runs under
valgrind's callgrind (``--separate-threads``: its main thread's count, not gloo's work threads'),
rank 1 natively beside it; every arm is built in the same process group from the same seeds,
with one intra-op thread, and the arms run in blocks of ``--block`` steps, alternated (A B C,
then C B A), round after round. Around each block callgrind's client requests (a few lines of C
built here with the system's ``valgrind/callgrind.h``; no-ops outside valgrind) zero the counts
and dump them, so each block's file holds that block's instructions alone, and one step's count
is the block's over its steps. ``--pass-steps N`` starts each arm's pass over the data anew
every N steps, so that what a loader does once a pass is counted with the steps (a hand-written
`DistributedSampler` makes every index of the data set at its pass's start, where accelify's
sharded loader makes its rank's indices batch by batch). ``--phases`` dumps per phase of the
step too (the loader's next batch, zero_grad, forward, loss, backward, optimizer step), to say
where a gap is.

The arms:

- ``raw DDP``: the hand-written loop, DDP with the option accelify sets
  (``gradient_as_bucket_view=True``): accelify against it is what accelify adds;
- ``accelify``: `Accelerator.prepare`'s model, optimizer and loader, `Accelerator.backward`,
  each collective recorded as under `accelify launch` (``ACCELIFY_FAILURE_DIR`` set);
- ``raw DDP, a copy``: the control, the hand-written loop on its own objects: how far two runs
  of the same code differ here (memory placement, caches), the resolution of the bench.

Where valgrind or a C compiler is missing (or ``--counter calls``), the count is a deterministic
proxy: the Python function calls a step makes (C functions included), from ``sys.setprofile``
on rank 0's main thread; it sees Python-level bookkeeping but not its C cost.

Printed per width: each arm's instructions per step (the median of its blocks, with the
blocks' spread), the ratio to raw DDP, and with ``--phases`` the per-phase counts and their
differences to raw DDP.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

RAW, ACCELIFY, COPY = "raw DDP", "accelify", "raw DDP, a copy"
PHASES = ("next", "zero_grad", "forward", "loss", "backward", "step")
CLIENT_C = r"""
#include <valgrind/callgrind.h>
void instrument(void) { CALLGRIND_START_INSTRUMENTATION; }
void zero(void) { CALLGRIND_ZERO_STATS; }
void dump(const char *label) { CALLGRIND_DUMP_STATS_AT(label); }
"""


class Counter:
    """Counts what one labelled stretch of rank 0's main thread did; ``label`` ends a stretch
    and starts the next (the stretch before the first ``start`` is not counted)."""

    def instrument(self) -> None:
        """From here on the code is counted (callgrind runs uninstrumented until then: the
        imports and the set-up cost minutes under its instrumentation)."""

    def start(self) -> None:
        raise NotImplementedError

    def label(self, name: str) -> None:
        raise NotImplementedError

    def results(self) -> dict[str, list[int]]:
        raise NotImplementedError


class Callgrind(Counter):
    """Callgrind's client requests: zero before, dump (which zeroes again) after each stretch;
    the counts are read back from the dump files by the parent, which knows their folder."""

    def __init__(self, library: str) -> None:
        self.client = ctypes.CDLL(library)
        self.client.dump.argtypes = [ctypes.c_char_p]

    def instrument(self) -> None:
        self.client.instrument()

    def start(self) -> None:
        self.client.zero()

    def label(self, name: str) -> None:
        self.client.dump(name.encode())

    def results(self) -> dict[str, list[int]]:
        return {}  # in the dump files


class PythonCalls(Counter):
    """The proxy: function calls (Python and C) seen by ``sys.setprofile`` on this thread."""

    def __init__(self) -> None:
        self.calls = 0
        self.counts: dict[str, list[int]] = {}

    def _profile(self, frame, event: str, arg) -> None:
        if event == "call" or event == "c_call":
            self.calls += 1

    def start(self) -> None:
        self.calls = 0
        sys.setprofile(self._profile)

    def label(self, name: str) -> None:
        sys.setprofile(None)
        self.counts.setdefault(name, []).append(self.calls)
        self.calls = 0
        sys.setprofile(self._profile)

    def results(self) -> dict[str, list[int]]:
        sys.setprofile(None)
        return self.counts


class Idle(Counter):
    """Rank 1: nothing counted."""

    def start(self) -> None:
        pass

    def label(self, name: str) -> None:
        pass

    def results(self) -> dict[str, list[int]]:
        return {}


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.utils.data import DataLoader, DistributedSampler

    from accelify import Accelerator

    sys.path.insert(0, str(Path(__file__).parent))
    from overhead_worker import build

    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    counter: Counter = Idle()
    if rank == 0:
        counter = Callgrind(args.client) if args.client else PythonCalls()
    blocks = args.rounds + 1  # one warm-up round
    samples = 32 * accelerator.num_processes * (args.pass_steps or args.block * blocks)
    loss_fn = nn.MSELoss()

    def raw_arm():
        model, optimizer, data = build(args.width, samples)
        model = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
        loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data, shuffle=False))
        return model, optimizer, [loader, iter(loader)], lambda loss: loss.backward()

    def accelify_arm():
        model, optimizer, data = build(args.width, samples)
        model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, 32))
        return model, optimizer, [loader, iter(loader)], accelerator.backward

    arms = {RAW: raw_arm(), ACCELIFY: accelify_arm(), COPY: raw_arm()}

    def block(name: str, counted: bool) -> None:
        model, optimizer, batches, backward = arms[name]
        phase: Callable[[str], None] = (
            (lambda p: counter.label(f"{name}/{p}")) if counted and args.phases else _nothing
        )
        dist.barrier()
        if counted:
            counter.start()
        for _ in range(args.block):
            try:
                x, y = next(batches[1])
            except StopIteration:  # --pass-steps: the next pass, its start counted as the step's
                batches[1] = iter(batches[0])
                x, y = next(batches[1])
            phase("next")
            optimizer.zero_grad()
            phase("zero_grad")
            output = model(x)
            phase("forward")
            loss = loss_fn(output, y)
            phase("loss")
            backward(loss)
            phase("backward")
            optimizer.step()
            phase("step")
        if counted and not args.phases:
            counter.label(name)

    names = list(arms)
    counter.instrument()
    for round_ in range(blocks):
        for name in names[::-1] if round_ % 2 else names:
            block(name, counted=round_ > 0)
    if rank == 0:
        print("COUNTS " + json.dumps(counter.results()), flush=True)
    dist.barrier()


def _nothing(_: str) -> None:
    pass


def client_library(folder: str) -> str | None:
    """The client requests as a shared library, or None without valgrind's header or a compiler."""
    header = Path("/usr/include/valgrind/callgrind.h")
    compiler = shutil.which("cc") or shutil.which("gcc")
    if not (header.exists() and compiler and shutil.which("valgrind")):
        return None
    source = Path(folder, "client.c")
    source.write_text(CLIENT_C)
    library = Path(folder, "libclient.so")
    subprocess.run([compiler, "-O1", "-shared", "-fPIC", "-o", library, source], check=True)
    return str(library)


def run(width: int, args: argparse.Namespace) -> tuple[dict[str, list[int]], str]:
    """Each label's counts, and what they count."""
    from accelify.runtime.environment import FAILURE_DIR
    from accelify.runtime.launch.launcher import free_port

    source = args.source or str(Path(__file__).parent.parent)
    with tempfile.TemporaryDirectory() as folder:
        records, dumps = Path(folder, "records"), Path(folder, "dumps")
        records.mkdir()
        dumps.mkdir()
        library = client_library(folder) if args.counter == "callgrind" else None
        if args.counter == "callgrind" and library is None:
            print("no valgrind or no C compiler: counting Python calls instead", flush=True)
        base = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": source,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            FAILURE_DIR: str(records),  # as `accelify launch` sets it: every rank records
            "PYTHONHASHSEED": "0",
        }
        command = [__file__, "--worker", "--widths", str(width), "--rounds", str(args.rounds)]
        command += ["--block", str(args.block), *(["--phases"] if args.phases else [])]
        command += ["--client", library or "", "--pass-steps", str(args.pass_steps)]
        valgrind = [
            "valgrind",
            "--tool=callgrind",
            "--separate-threads=yes",
            "--instr-atstart=no",  # until the arms are built (`Counter.instrument`)
            f"--callgrind-out-file={dumps}/callgrind.out",
        ]
        ranks = []
        for rank in (1, 0):
            env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
            prefix = valgrind if rank == 0 and library else []
            ranks.append(
                subprocess.Popen(
                    [*prefix, sys.executable, *command],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        outputs = [process.communicate() for process in ranks]
        for process, (_, stderr) in zip(ranks, outputs, strict=True):
            if process.returncode != 0:
                raise SystemExit(f"width {width} failed:\n{stderr[-3000:]}")
        if args.keep and library:
            kept = Path(args.keep, f"width_{width}")
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(dumps, kept)  # for callgrind_annotate, function by function
        line = next(x for x in outputs[1][0].splitlines() if x.startswith("COUNTS "))
        if library is None:
            return json.loads(line.removeprefix("COUNTS ")), "Python calls"
        return read_dumps(dumps), "instructions"


def read_dumps(folder: Path) -> dict[str, list[int]]:
    """Each dump of the main thread (callgrind's thread 1) by its label, in order."""
    counts: dict[str, list[tuple[int, int]]] = {}
    for path in folder.glob("callgrind.out.*-01"):
        number = int(path.name.split(".")[-1].split("-")[0])
        label = total = None
        for line in path.read_text().splitlines():
            if line.startswith("desc: Trigger: Client Request: "):
                label = line.removeprefix("desc: Trigger: Client Request: ")
            elif line.startswith(("totals: ", "summary: ")):
                total = int(line.split()[1])
        if label is not None and total is not None:
            counts.setdefault(label, []).append((number, total))
    return {label: [t for _, t in sorted(pairs)] for label, pairs in counts.items()}


def report(width: int, counts: dict[str, list[int]], unit: str, args: argparse.Namespace) -> None:
    if any("/" in label for label in counts):  # each step: the sum of its phases
        per_step = {
            arm: [
                sum(values) for values in zip(*(counts[f"{arm}/{p}"] for p in PHASES), strict=True)
            ]
            for arm in _arms(counts)
        }
        steps_per_entry = 1
    else:
        per_step = {arm: counts[arm] for arm in _arms(counts)}
        steps_per_entry = args.block
    print(
        f"\nMLP width {width}, 2 CPU ranks (rank 0 counted, main thread), {args.rounds} rounds "
        f"of {args.block} steps per arm, alternated, collectives recorded: {unit} per step"
    )
    raw = statistics.median(per_step[RAW]) / steps_per_entry
    spread = "blocks" if steps_per_entry > 1 else "steps"
    for arm, entries in per_step.items():
        steps = [entry / steps_per_entry for entry in entries]
        middle = statistics.median(steps)
        print(
            f"  {arm:18} {middle:14,.0f}  ({spread} {min(steps):,.0f} .. {max(steps):,.0f})  "
            f"/ raw DDP {middle / raw:.4f}  ({middle - raw:+,.0f} per step)"
        )
    if any("/" in label for label in counts):
        print(f"  per phase, median step, difference to raw DDP ({unit}):")
        for p in PHASES:
            raw_phase = statistics.median(counts[f"{RAW}/{p}"])
            cells = "  ".join(
                f"{arm} {statistics.median(counts[f'{arm}/{p}']) - raw_phase:+9,.0f}"
                for arm in _arms(counts)
                if arm != RAW
            )
            print(f"    {p:10} raw {raw_phase:11,.0f}  {cells}")


def _arms(counts: dict[str, list[int]]) -> list[str]:
    return [arm for arm in (RAW, ACCELIFY, COPY) if arm in counts or f"{arm}/next" in counts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[32, 512, 2048])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--block", type=int, default=20, help="steps per arm per round")
    parser.add_argument("--phases", action="store_true", help="count each phase of a step")
    parser.add_argument("--counter", choices=["callgrind", "calls"], default="callgrind")
    parser.add_argument("--source", help="another accelify's source tree, laid out as installed")
    parser.add_argument(
        "--pass-steps",
        type=int,
        default=0,
        help="steps per pass over the data (default: one pass for the whole run): each arm's "
        "loader starts a new pass every N steps, so what a loader does once a pass (a "
        "DistributedSampler's index lists, a prepared loader's set-up) is counted too",
    )
    parser.add_argument("--keep", help="copy callgrind's dump files here (callgrind_annotate)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--client", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.width = args.widths[0]
        return worker(args)
    for width in args.widths:
        counts, unit = run(width, args)
        if not any(label.startswith(RAW) for label in counts):
            raise SystemExit(f"width {width}: no counts read back")
        report(width, counts, unit, args)


if __name__ == "__main__":
    main()
