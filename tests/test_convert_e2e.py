"""Runnable scripts (fixtures/scripts/), converted, then run for real.

1. Original and conversion on one process, same seed: the printed lines are identical.
2. The conversion on 2 ranks (`accelify launch --cpu -n 2`): exits 0, prints each line once (only
   the main process prints), and evaluation reports cover the whole evaluation set.
3. `--target accelerate` runs under Hugging Face Accelerate with identical lines.
4. Converting the conversion changes nothing.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from accelify.convert import Options, convert_source
from conftest import FIXTURES, assert_ok, launch, run_accelify, run_python

# One pytest-xdist worker runs this module: its tests share module fixtures
# (the originals' runs, made once).
pytestmark = [pytest.mark.distributed, pytest.mark.xdist_group("convert_e2e")]
SCRIPTS = sorted((FIXTURES / "scripts").glob("*.py"))
SAMPLE_COUNTS = re.compile(r"(\d+)/(\d+)|over (\d+) samples")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


class Runs:
    """What several tests compare against or read, made once per script: the conversion (per
    target), the original's run on one process and the conversion's on 2 ranks, each run in a
    folder of its own. A test runs the conversion otherwise from a copy in its own folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._conversions: dict[tuple[Path, str], str] = {}
        self._originals: dict[Path, subprocess.CompletedProcess[str]] = {}
        self._launches: dict[Path, tuple[Path, subprocess.CompletedProcess[str]]] = {}

    def converted(self, script: Path, workdir: Path, target: str = "accelify") -> Path:
        """In process: the CLI's own writing is tested in test_convert_cli."""
        key = (script, target)
        if key not in self._conversions:
            conversion = convert_source(script.read_bytes(), script, Options(target=target))
            assert not conversion.skipped, conversion.skipped
            self._conversions[key] = conversion.converted.decode()
        copy = workdir / script.name
        copy.write_text(self._conversions[key])
        return copy

    def original(self, script: Path) -> subprocess.CompletedProcess[str]:
        if script not in self._originals:
            folder = self.root / f"{script.stem}-original"
            folder.mkdir()
            result = run_python(script, cwd=folder)
            assert_ok(result)
            assert result.stdout.strip(), "the fixture prints nothing to compare"
            self._originals[script] = result
        return self._originals[script]

    def launched(self, script: Path) -> tuple[Path, subprocess.CompletedProcess[str]]:
        """The conversion's run on 2 ranks, and the folder it ran in (what it wrote is there)."""
        if script not in self._launches:
            folder = self.root / f"{script.stem}-two-ranks"
            folder.mkdir()
            result = launch(self.converted(script, folder), cwd=folder)
            self._launches[script] = folder, result
        return self._launches[script]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("e2e"))


def line_shapes(output: str) -> Counter[str]:
    """Lines with their numbers blanked out: what was logged, not the values."""
    return Counter(re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "N", line) for line in output.splitlines())


def eval_totals(output: str) -> list[str]:
    """The denominators of `correct/total` and `over N samples`: how much was evaluated."""
    totals = []
    for match in SAMPLE_COUNTS.finditer(output):
        totals.append(match.group(2) or match.group(3))
    return totals


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_one_process_prints_exactly_what_the_original_prints(
    script: Path, runs: Runs, workdir: Path
):
    converted = runs.converted(script, workdir)
    with ThreadPoolExecutor(1) as pool:  # the two single-process runs side by side
        running = pool.submit(run_python, converted, cwd=workdir)
        original = runs.original(script)
        ours = running.result()
    assert_ok(ours)
    assert ours.stdout == original.stdout


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_two_ranks_run_print_once_and_evaluate_everything(script: Path, runs: Runs):
    single = runs.original(script)
    _, result = runs.launched(script)
    assert_ok(result)
    assert eval_totals(result.stdout) == eval_totals(single.stdout)
    # Each rank trains on half the batches, so it logs at most as often as the single process;
    # a line printed by both ranks would show up twice as often.
    two_ranks, one = line_shapes(result.stdout), line_shapes(single.stdout)
    assert all(two_ranks[shape] <= one[shape] for shape in two_ranks), (two_ranks, one)


def test_checkpoints_are_written_once_and_load(runs: Runs):
    """What the conversion's run on 2 ranks (the test above's) wrote."""
    folder, result = runs.launched(FIXTURES / "scripts" / "checkpointing.py")
    assert_ok(result)
    import torch

    final = torch.load(folder / "checkpoints_final.pt", weights_only=True)
    assert set(final) == {"weight", "bias"}  # unwrapped: no "module." prefix
    epoch = torch.load(folder / "checkpoints_epoch2.pt", weights_only=True)
    assert epoch["epoch"] == 2 and set(epoch["model"]) == {"weight", "bias"}
    assert not list(folder.glob("*.tmp"))


@pytest.mark.skipif(
    importlib.util.find_spec("accelerate") is None, reason="HF Accelerate not installed"
)
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_accelerate_target_runs_on_hugging_face_accelerate(script: Path, runs: Runs, workdir: Path):
    converted = runs.converted(script, workdir, target="accelerate")
    assert "from accelerate import Accelerator" in converted.read_text()
    theirs = run_python(converted, cwd=workdir)
    assert_ok(theirs)
    assert theirs.stdout == runs.original(script).stdout


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_converting_twice_changes_nothing(script: Path):
    once = convert_source(script.read_bytes(), script)
    twice = convert_source(once.converted, script)
    assert twice.converted == once.converted


@pytest.mark.parametrize("mode", [0o644, 0o755])
def test_an_output_file_gets_the_input_files_mode(tmp_path: Path, mode: int):
    """``convert x.py -o y.py`` writes through a temporary file, made 0600: y.py must not keep
    that (a script others in the group cannot read, one that lost its executable bit)."""
    script, output = tmp_path / "train.py", tmp_path / "train_acc.py"
    shutil.copy(FIXTURES / "scripts" / "gan.py", script)
    script.chmod(mode)
    assert_ok(run_accelify("convert", script, "-o", output))
    assert "accelerator.backward(" in output.read_text()
    assert output.stat().st_mode & 0o777 == mode


def test_write_converts_in_place_atomically_keeping_the_mode(tmp_path: Path):
    script = tmp_path / "train.py"
    shutil.copy(FIXTURES / "scripts" / "gan.py", script)
    script.chmod(0o755)
    result = run_accelify("convert", script, "--write")
    assert_ok(result)
    assert "accelerator.backward(d_loss, retain_graph=True)" in script.read_text()
    assert script.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in tmp_path.iterdir()] == ["train.py"]
    check = run_accelify("convert", script, "--check")
    assert check.returncode == 0
