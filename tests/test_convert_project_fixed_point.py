"""A converted project converts to itself (docs/convert.md: "A converted file converts to
itself"), so a pre-commit ``accelify convert --check`` passes right after ``--write``. Every
project fixture is converted, written, and converted again: the second conversion changes no
file. In process and without runs: cheap for every case (trial20: the driver's read after its
trainer's main-process save got one more ``trainer.accelerator.wait_for_everyone()`` on each
``--write``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from accelify.convert import Options
from accelify.convert.files import collect, convert_all, write
from accelify.errors import UserError
from conftest import FIXTURES

PROJECTS = sorted(p for p in (FIXTURES / "projects").iterdir() if p.is_dir())


def _convert(project: Path) -> list:
    results = convert_all(list(collect([project])), Options(), 1)
    errors = [r for r in results if isinstance(r, UserError)]
    assert not errors, errors
    return results


@pytest.mark.parametrize("fixture", PROJECTS, ids=[p.name for p in PROJECTS])
def test_converting_a_converted_project_changes_nothing(tmp_path: Path, fixture: Path):
    project = tmp_path / fixture.name
    shutil.copytree(fixture, project)
    for result in _convert(project):
        if result.changed:
            write(result)
    again = {Path(r.path).name: r.converted.decode() for r in _convert(project) if r.changed}
    assert not again, f"converting the converted project changes {sorted(again)}"


def test_a_driver_whose_read_waits_already_gets_no_second_barrier(tmp_path: Path):
    """The shape trial20 met: the trainer saves at the end of ``fit()`` on the main process, the
    driver reads the file after ``trainer.fit(2)``. The first conversion puts one barrier on
    the trainer's accelerator before the read; the second sees it there and adds none."""
    project = tmp_path / "project"
    shutil.copytree(FIXTURES / "projects" / "driver_loads_what_its_trainer_saved_in_fit", project)
    results = {Path(r.path).name: r for r in _convert(project)}
    driver = results["train.py"].converted.decode()
    assert driver.count("trainer.accelerator.wait_for_everyone()") == 1
    assert 'wait_for_everyone()\n    model.load_state_dict(torch.load("best.pt"))' in driver
    for result in results.values():
        write(result)
    again = {Path(r.path).name: r for r in _convert(project)}
    assert not again["train.py"].changed
    assert not [n for n in again["train.py"].changes if "wait_for_everyone" in n.text]


def _driver_converted(tmp_path: Path, body: str) -> str:
    """The fixture's driver with ``body`` in place of its fit-and-read lines, converted with
    its engine."""
    project = tmp_path / "project"
    shutil.copytree(FIXTURES / "projects" / "driver_loads_what_its_trainer_saved_in_fit", project)
    driver = project / "train.py"
    lines = '    trainer.fit(2)\n    model.load_state_dict(torch.load("best.pt"))\n'
    driver.write_text(driver.read_text().replace(lines, body))
    (result,) = [r for r in _convert(project) if Path(r.path).name == "train.py"]
    return result.converted.decode()


def test_a_barrier_through_a_name_bound_to_the_trainers_accelerator_is_seen(tmp_path: Path):
    converted = _driver_converted(
        tmp_path,
        "    trainer.fit(2)\n    accelerator = trainer.accelerator\n"
        "    accelerator.wait_for_everyone()\n    if True:\n"
        '        model.load_state_dict(torch.load("best.pt"))\n',
    )
    assert "trainer.accelerator.wait_for_everyone()" not in converted


def test_a_barrier_before_more_training_does_not_order_the_read(tmp_path: Path):
    """``trainer.fit(1)`` between the barrier and the read writes the file again: the read
    still gets its own barrier."""
    converted = _driver_converted(
        tmp_path,
        "    trainer.fit(1)\n    trainer.accelerator.wait_for_everyone()\n    trainer.fit(1)\n"
        '    model.load_state_dict(torch.load("best.pt"))\n',
    )
    assert converted.count("trainer.accelerator.wait_for_everyone()") == 2
    assert "fit(1)\n    trainer.accelerator.wait_for_everyone()\n    model.load_state_dict(" in (
        converted
    )
