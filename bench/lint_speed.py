"""Lint throughput and start-up, side by side with TorchFix when a TorchFix venv is given.

    python bench/lint_speed.py [DIR ...] [--repeat 20] [--jobs 2] [--torchfix /path/to/venv]

Prints files/s and lines per CPU-second for `accelify lint`, serial and with --jobs, over the
corpus (the fixtures that create an Accelerator, so that every file is parsed and analysed, with
no pre-filter skipping any: lint fixtures, converted goldens, runtime scripts; repeated, plus
any directories), the same for TorchFix on the same files
(TorchFix pins libcst<1.6, so it lives in its own venv), and their ratio. Also the wall time of
`accelify lint one_file.py` over `python -c pass` (the pre-commit start-up cost).
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def build_corpus(extra: list[Path], repeat: int, into: Path) -> list[Path]:
    sources = sorted(FIXTURES.rglob("*.py"))
    sources = [
        p for p in sources if "syntax_error" not in p.parts and b"Accelerator(" in p.read_bytes()
    ]
    files = []
    for copy in range(repeat):
        for index, source in enumerate(sources):
            target = into / f"c{copy}" / f"{index}_{source.name}"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, target)
            files.append(target)
    for folder in extra:
        files += sorted(folder.rglob("*.py"))
    return files


def cpu_seconds_of(command: list[str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, capture_output=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def report(label: str, files: list[Path], lines: int, command: list[str]) -> float:
    wall, cpu = cpu_seconds_of(command)
    rate = lines / cpu if cpu else float("inf")
    print(
        f"{label:34} {len(files) / wall:8.1f} files/s {rate:10.0f} lines/CPU-s ({wall:.1f}s wall)"
    )
    return rate


def startup(one_file: Path) -> float:
    def best(command: list[str]) -> float:
        times = []
        for _ in range(5):
            started = time.perf_counter()
            subprocess.run(command, capture_output=True, check=False)
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    bare = best([sys.executable, "-c", "pass"])
    libcst_alone = best([sys.executable, "-c", "import libcst"])
    ours = best([sys.executable, "-m", "accelify", "lint", "--exit-zero", str(one_file)])
    print(f"(`import libcst` alone over `python -c pass`: {libcst_alone - bare:.3f} s)")
    return ours - bare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="*", type=Path)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--torchfix", type=Path, help="a venv with torchfix installed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        files = build_corpus(args.dirs, args.repeat, Path(scratch))
        lines = sum(p.read_bytes().count(b"\n") for p in files)
        print(f"corpus: {len(files)} files, {lines} lines")
        accelify = [sys.executable, "-m", "accelify", "lint", "--exit-zero", "--select", "ACC"]
        ours = report("accelify lint", files, lines, [*accelify, scratch])
        report(
            f"accelify lint --jobs {args.jobs}",
            files,
            lines,
            [*accelify, "--jobs", str(args.jobs), scratch],
        )
        if args.torchfix:
            torchfix = [str(args.torchfix / "bin" / "torchfix"), scratch]
            theirs = report("torchfix", files, lines, torchfix)
            print(f"accelify / TorchFix (lines per CPU-second): {ours / theirs:.1f}x")
        else:
            print("TorchFix: pass --torchfix VENV to compare")
    print(
        f"start-up of `accelify lint one_file.py` over `python -c pass`: "
        f"{startup(FIXTURES / 'examples' / 'classify.py'):.3f} s"
    )


if __name__ == "__main__":
    main()
