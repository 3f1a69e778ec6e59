"""Lint throughput over whole trees, side by side with TorchFix and the parsers alone; start-up.

    python bench/lint_speed.py [DIR ...] [--jobs 2] [--torchfix /path/to/venv] [--repeat 10]

The corpus is every ``.py`` file of the given trees as a user's checkout presents them (training
scripts, their helpers, models, tests: most never touch an accelerator), copied to a scratch
folder; with no DIR, the installed HF Accelerate package (its test scripts use an Accelerator
throughout) and this repository's fixtures. In one run, each as its own process, CPU time of
the process: `accelify lint --no-cache` serial and with --jobs, a cold-cache run (writing it) and
a warm one, TorchFix (`torchfix --jobs 1`; it pins an older libcst, so it lives in its own venv,
given with --torchfix), libcst's parse alone and Python's `ast.parse` alone over the same files.
Lines per CPU-second and the ratios are printed; nothing is asserted (times vary by machine).
Then the start-up of `accelify lint one_file.py` over `python -c pass`, cold (--no-cache) and
warm, best and median of repeated runs, wall and CPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
ONE_FILE = FIXTURES / "examples" / "classify.py"

PARSE_ONLY = """
import sys
from pathlib import Path
{setup}
for name in Path(sys.argv[1]).read_text().splitlines():
    data = Path(name).read_bytes()
    try:
        {parse}
    except Exception:
        pass
"""
PARSERS = {
    "libcst parse only": ("import libcst", "libcst.parse_module(data)"),
    "ast.parse only": ("import ast", "ast.parse(data)"),
}


def default_trees() -> list[Path]:
    spec = importlib.util.find_spec("accelerate")
    trees = [FIXTURES]
    if spec is not None and spec.submodule_search_locations:
        trees.insert(0, Path(next(iter(spec.submodule_search_locations))))
    return trees


def build_corpus(trees: list[Path], into: Path) -> list[Path]:
    """Each tree copied whole (its ``.py`` files) under ``into``, in a folder named after it."""
    files = []
    for index, tree in enumerate(trees):
        for source in sorted(tree.rglob("*.py")):
            if "__pycache__" in source.parts:
                continue
            target = into / f"{index}_{tree.name}" / source.relative_to(tree)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            files.append(target)
    return files


#: Every command runs with byte-code caching on, as an installed package has it (pip compiles the
#: modules it installs): with PYTHONDONTWRITEBYTECODE set, each start would compile libcst and
#: accelify from source again and the start-up would measure the compiler.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def cpu_seconds_of(command: list[str], cwd: Path) -> tuple[float, float]:
    """Wall and CPU seconds (user + system, the command and the processes it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, capture_output=True, check=False, cwd=cwd, env=ENV)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(label: str, lines: int, command: list[str], cwd: Path) -> float:
    wall, cpu = cpu_seconds_of(command, cwd)
    rate = lines / cpu if cpu else float("inf")
    print(f"  {label:36} {rate:10.0f} lines/CPU-s   {cpu:7.2f} CPU-s {wall:7.2f} s wall")
    return rate


def startup(scratch: Path, repeat: int) -> None:
    """`accelify lint one_file.py` over `python -c pass`, best and median of ``repeat`` runs."""
    target = scratch / ONE_FILE.name
    shutil.copyfile(ONE_FILE, target)
    cache = scratch / "startup_cache"

    def timed(command: list[str]) -> tuple[list[float], list[float]]:
        walls, cpus = [], []
        for _ in range(repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            subprocess.run(command, capture_output=True, check=False, cwd=scratch, env=ENV)
            walls.append(time.perf_counter() - started)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        return walls, cpus

    lint = [sys.executable, "-m", "accelify", "lint", "--exit-zero", target.name]
    runs = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "import libcst": [sys.executable, "-c", "import libcst"],
        "lint one file, --no-cache": [*lint, "--no-cache"],
        "lint one file, warm cache": [*lint, "--cache-dir", str(cache)],
    }
    for command in runs.values():  # byte code written once, as after an install
        subprocess.run(command, capture_output=True, cwd=scratch, env=ENV)
    timings = {label: timed(command) for label, command in runs.items()}
    bare_wall, bare_cpu = (min(values) for values in timings["python -c pass"])
    print(f"start-up over `python -c pass` ({ONE_FILE.name}, {repeat} runs each):")
    print(f"  {'':36} {'wall best':>10} {'median':>8} {'CPU best':>10}")
    for label, (walls, cpus) in timings.items():
        if label == "python -c pass":
            print(f"  {label:36} {bare_wall:9.3f}s (the interpreter) {bare_cpu:7.3f}s")
            continue
        best, median = min(walls) - bare_wall, statistics.median(walls) - bare_wall
        print(f"  {label:36} {best:+9.3f}s {median:+8.3f} {min(cpus) - bare_cpu:+9.3f}s")


def print_ratios(rates: dict[str, float]) -> None:
    """Each ratio of lines per CPU-second: how many times faster the first is."""
    pairs = [
        ("accelify", "torchfix", "accelify / TorchFix"),
        ("cached", "torchfix", "accelify warm cache / TorchFix"),
        ("libcst parse only", "torchfix", "libcst parse only / TorchFix"),
        ("ast.parse only", "torchfix", "ast.parse only / TorchFix"),
        ("accelify", "libcst parse only", "accelify / libcst parse only"),
        ("accelify", "ast.parse only", "accelify / ast.parse only"),
        ("cached", "accelify", "accelify warm cache / no cache"),
    ]
    print("ratios (lines per CPU-second):")
    for first, second, label in pairs:
        if first in rates and second in rates:
            print(f"  {label:36} {rates[first] / rates[second]:8.2f}x")
    if "torchfix" not in rates:
        print("  (TorchFix: pass --torchfix VENV, a venv with torchfix installed)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="*", type=Path, help="trees to lint (default: see above)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--torchfix", type=Path, help="a venv with torchfix installed")
    parser.add_argument("--repeat", type=int, default=10, help="start-up runs of each")
    args = parser.parse_args()
    trees = [tree.resolve() for tree in args.dirs] or default_trees()
    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        corpus = scratch / "corpus"
        files = build_corpus(trees, corpus)
        lines = sum(p.read_bytes().count(b"\n") for p in files)
        named = sum(1 for p in files if b"ccelerat" in p.read_bytes())
        print(f"corpus: {len(files)} files, {lines} lines ({named} files name an accelerator)")
        for tree in trees:
            print(f"  {tree}")
        listing = scratch / "files.txt"
        listing.write_text("\n".join(str(p) for p in files))
        accelify = [sys.executable, "-m", "accelify", "lint", "--exit-zero", "--select", "ALL"]
        cache = ["--cache-dir", str(scratch / "cache")]
        rates = {}
        rates["accelify"] = measure(
            "accelify lint --no-cache", lines, [*accelify, "--no-cache", "corpus"], scratch
        )
        measure(
            f"accelify lint --no-cache --jobs {args.jobs}",
            lines,
            [*accelify, "--no-cache", "--jobs", str(args.jobs), "corpus"],
            scratch,
        )
        measure("accelify lint, cold cache", lines, [*accelify, *cache, "corpus"], scratch)
        rates["cached"] = measure(
            "accelify lint, warm cache", lines, [*accelify, *cache, "corpus"], scratch
        )
        for label, (setup, parse) in PARSERS.items():
            code = PARSE_ONLY.format(setup=setup, parse=parse)
            rates[label] = measure(label, lines, [sys.executable, "-c", code, listing], scratch)
        if args.torchfix:
            torchfix = [str(args.torchfix / "bin" / "torchfix"), "--jobs", "1", "corpus"]
            rates["torchfix"] = measure("TorchFix (--jobs 1)", lines, torchfix, scratch)
        print_ratios(rates)
        startup(scratch, args.repeat)


if __name__ == "__main__":
    main()
