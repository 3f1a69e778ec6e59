"""Conversion throughput: files/s and lines/s over a corpus, serial and with --jobs.

    python bench/convert_speed.py [DIR ...] [--repeat 20] [--jobs 2]

The corpus is the conversion fixtures and runnable scripts, repeated ``--repeat`` times, plus any
directories given. Measured in-process with the same functions `accelify convert` calls.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from accelify.convert import Options
from accelify.convert.files import collect, convert_all

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def corpus(extra: list[Path], repeat: int) -> list[tuple[Path, bool]]:
    bundled = sorted((FIXTURES / "convert").glob("*/before.py")) + sorted(
        (FIXTURES / "scripts").glob("*.py")
    )
    files = [(path, True) for path in bundled if path.parent.name != "syntax_error"] * repeat
    return files + list(collect(extra))


def measure(files: list[tuple[Path, bool]], jobs: int) -> tuple[float, float]:
    lines = sum(path.read_bytes().count(b"\n") for path, _ in files)
    started = time.perf_counter()
    convert_all(files, Options(), jobs)
    elapsed = time.perf_counter() - started
    return len(files) / elapsed, lines / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="*", type=Path)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    files = corpus(args.dirs, args.repeat)
    print(f"corpus: {len(files)} files")
    for jobs in (1, args.jobs):
        files_per_s, lines_per_s = measure(files, jobs)
        print(f"jobs={jobs}: {files_per_s:7.1f} files/s {lines_per_s:9.0f} lines/s")


if __name__ == "__main__":
    main()
