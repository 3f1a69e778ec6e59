"""Runs one of HF Accelerate's test scripts on every rank, one case at a time.

A case is one call, in the script's `main()`, of one of the script's own functions as a statement
(`test_gather(state)`, `training_check(use_seedable_sampler=True)`), or, given CALLS (a JSON list of
`[function, [arguments]]`), one of those calls made instead of `main()`: each is wrapped, its
outcome written to `RESULTS/NNN.RANK.json`, and the ranks wait for each other through those files,
not through a collective, so a case that hangs or fails on one rank is seen as such. The first
failing case ends the launch (its ranks may be out of step in their collectives); the driver
relaunches from the next one, skipping the cases before it.

The scripts' data is the same on both runtimes and on every run: HF's `RegressionDataset()`
without a seed draws it from OS entropy (`np.random.default_rng(None)`; `set_seed` does not reach
it), which made test_sync's "grads not in sync" checks flip on a borderline draw on either
runtime (see `reproducible_default_rng`).

    case_runner.py SCRIPT RESULTS START accelify|accelerate [CALLS]
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import os
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

PEER_WAIT_S = 90.0
#: The seed of the data HF's scripts draw from `np.random.default_rng()` without a seed.
DATA_SEED = 0


def main_calls(script: Path) -> set[str]:
    """Names of the module-level functions that `main()` calls as statements."""
    tree = ast.parse(script.read_text())
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    called = set()
    for node in ast.walk(main):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
        ):
            called.add(node.value.func.id)
    return called & functions


class Cases:
    def __init__(self, results: Path, start: int, rank: int, world: int) -> None:
        self.results = results
        self.start = start
        self.rank = rank
        self.world = world
        self.count = 0
        self.seen: Counter[str] = Counter()
        self.depth = 0
        self.draws: Counter[tuple[int, int]] = Counter()

    def draw_key(self) -> list[int]:
        """Where an unseeded draw happens: this rank, the cases reached so far (skipped ones
        included), inside a case or not, and how many such draws came before it there. The same
        on both runtimes, and on a relaunch from a later case."""
        place = (self.count, self.depth)
        self.draws[place] += 1
        return [DATA_SEED, self.rank, *place, self.draws[place]]

    def wrap(self, name: str, function: Any, label: str | None = None) -> Any:
        @functools.wraps(function)
        def case(*args: Any, **kwargs: Any) -> Any:
            if self.depth:
                return function(*args, **kwargs)
            index = self.count
            self.count += 1
            self.seen[name] += 1
            title = label or (name if self.seen[name] == 1 else f"{name}#{self.seen[name]}")
            if index < self.start:
                return None
            # the pid: the launchers start ranks in sessions of their own, so the driver ends a
            # hung rank by its pid
            self._write(f"{index:03d}.{self.rank}.start", {"case": title, "pid": os.getpid()})
            self.depth += 1
            try:
                function(*args, **kwargs)
                outcome = {"case": title, "ok": True}
            except BaseException as error:
                outcome = {
                    "case": title,
                    "ok": False,
                    "error": f"{type(error).__name__}: {error}"[:2000],
                    "traceback": traceback.format_exc()[-6000:],
                }
            finally:
                self.depth -= 1
            self._write(f"{index:03d}.{self.rank}.json", outcome)
            self._agree(index, outcome["ok"])
            return None

        return case

    def _write(self, name: str, payload: dict[str, Any]) -> None:
        partial = self.results / f".{name}.tmp"
        partial.write_text(json.dumps(payload))
        partial.rename(self.results / name)

    def _agree(self, index: int, ok: bool) -> None:
        """Wait for every rank's outcome of this case; end the launch unless all passed."""
        deadline = time.monotonic() + (PEER_WAIT_S if ok else 2.0)
        while time.monotonic() < deadline:
            outcomes = [self.results / f"{index:03d}.{r}.json" for r in range(self.world)]
            done = [p for p in outcomes if p.exists()]
            if any(not json.loads(p.read_text())["ok"] for p in done):
                break
            if len(done) == self.world:
                return
            time.sleep(0.05)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(3)


def reproducible_default_rng(cases: Cases) -> None:
    """`np.random.default_rng(None)` seeded by where it is called (`Cases.draw_key`).

    test_sync's `RegressionDataset(length=80)` is drawn from OS entropy, so its values differed
    on every run of either runtime; about 3 in 10,000 draws put a "grads in sync when they should
    not be" check of `test_gradient_accumulation(True, True, False)` within `allclose`'s rtol
    (1e-5), and HF fails those draws exactly as accelify does (same values, bit for bit). With
    the draw fixed, a case's outcome depends on the runtime alone, and HF's recorded outcome is
    the outcome of the same data. Each rank still draws its own data, as in a real run; an
    explicit seed is passed through.
    """
    import numpy as np

    unseeded = np.random.default_rng

    def default_rng(seed: Any = None) -> Any:
        return unseeded(cases.draw_key() if seed is None else seed)

    np.random.default_rng = default_rng


def call_label(name: str, arguments: list[Any]) -> str:
    """`test_x(True, False)`: a call's case name, the same on both runtimes."""
    return f"{name}({', '.join(map(repr, arguments))})"


def run(
    script: Path, results: Path, start: int, runtime: str, calls: list[Any] | None = None
) -> None:
    if runtime == "accelify":
        import resolve  # beside this file: the test-only name resolution

        resolve.install()
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cases = Cases(results, start, rank, world)
    reproducible_default_rng(cases)
    spec = importlib.util.spec_from_file_location(f"hf_{script.stem}", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        if calls is not None:
            for name, arguments in calls:
                label = call_label(name, arguments)
                cases.wrap(name, getattr(module, name), label)(*arguments)
        else:
            for name in main_calls(script):
                setattr(module, name, cases.wrap(name, getattr(module, name)))
            module.main()
    except BaseException as error:
        cases._write(
            f"setup.{rank}.json",
            {
                "error": f"{type(error).__name__}: {error}"[:2000],
                "traceback": traceback.format_exc()[-6000:],
            },
        )
        sys.stdout.flush()
        os._exit(4)
    cases._write(f"done.{rank}.json", {"cases": cases.count})


if __name__ == "__main__":
    given = json.loads(sys.argv[5]) if len(sys.argv) > 5 else None
    run(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4], given)
