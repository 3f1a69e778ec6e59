"""The case runner of HF's test scripts (tests/accelerate_compat/case_runner.py) gives both
runtimes the same data: an unseeded `np.random.default_rng()` draws by where it is called, not
from OS entropy (test_sync's `RegressionDataset(length=80)` is drawn that way, and a borderline
draw failed its "grads not in sync" check on HF and accelify alike)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from accelerate_compat import case_runner
from accelerate_compat.case_runner import Cases


@pytest.fixture(autouse=True)
def _restore_default_rng(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(np.random, "default_rng", np.random.default_rng)


def _script_draws(results: Path, start: int, rank: int = 0) -> dict[str, list[float]]:
    """A script as the runner sees it: a draw outside any case, two cases that draw, a draw
    between them; `start` skips the cases before it, as a relaunch does."""
    results.mkdir()
    for index in range(2):  # the other rank's outcomes, which each case waits for
        (results / f"{index:03d}.{1 - rank}.json").write_text('{"ok": true}')
    cases = Cases(results, start, rank, world=2)
    case_runner.reproducible_default_rng(cases)
    draws: dict[str, list[float]] = {}

    def draw(name: str) -> None:
        draws[name] = np.random.default_rng().normal(size=3).tolist()

    draw("main")
    cases.wrap("first", lambda: (draw("first.a"), draw("first.b")))()
    draw("between")
    cases.wrap("second", lambda: draw("second"))()
    return draws


def test_unseeded_draws_are_the_same_on_every_run_and_after_a_relaunch(tmp_path: Path) -> None:
    once = _script_draws(tmp_path / "once", start=0)
    again = _script_draws(tmp_path / "again", start=0)
    relaunched = _script_draws(tmp_path / "relaunched", start=1)

    assert once == again
    # a relaunch from the second case skips the first case's draws and no other
    assert relaunched == {k: v for k, v in once.items() if not k.startswith("first")}
    # every place draws its own data
    values = [tuple(v) for v in once.values()]
    assert len(set(values)) == len(values) == 5


def test_each_rank_draws_its_own_data_and_seeded_draws_are_untouched(tmp_path: Path) -> None:
    unseeded = np.random.default_rng
    rank0 = _script_draws(tmp_path / "rank0", start=0, rank=0)
    rank1 = _script_draws(tmp_path / "rank1", start=0, rank=1)
    assert all(rank0[place] != rank1[place] for place in rank0)

    assert np.random.default_rng(42).normal(size=3).tolist() == unseeded(42).normal(size=3).tolist()
