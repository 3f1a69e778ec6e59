"""`accelify verify` runs each script in a scratch working directory: what lies beside the
script (a config, a small data folder) is copied there, so a relative path opens what it opens
for the user, and what a run writes never lands in the user's folder."""

from __future__ import annotations

from pathlib import Path

from accelify.verify.runs import copy_beside


def test_the_files_beside_the_script_are_copied_not_its_modules_nor_what_is_too_big(
    tmp_path: Path,
):
    folder, workdir = tmp_path / "project", tmp_path / "work"
    folder.mkdir()
    workdir.mkdir()
    (folder / "train.py").write_text("print(open('config.yaml').read())\n")
    (folder / "helpers.py").write_text("X = 1\n")
    (folder / "config.yaml").write_text("lr: 0.1\n")
    (folder / "data").mkdir()
    (folder / "data" / "vocab.txt").write_text("a\nb\n")
    (folder / "package").mkdir()
    (folder / "package" / "__init__.py").write_text("")
    (folder / ".git").mkdir()
    (folder / "weights.bin").write_bytes(b"0" * 4096)
    copy_beside(folder, workdir, budget=1024)
    assert sorted(p.name for p in workdir.iterdir()) == ["config.yaml", "data"]
    assert (workdir / "data" / "vocab.txt").read_text() == "a\nb\n"
    (workdir / "config.yaml").write_text("lr: 0.5\n")  # a run that writes its config
    assert (folder / "config.yaml").read_text() == "lr: 0.1\n"


def test_the_folder_that_holds_the_working_directory_is_not_copied_into_it(tmp_path: Path):
    """A script in the temporary folder, where verify's scratch folder lies too."""
    workdir = tmp_path / "scratch" / "first-work"
    workdir.mkdir(parents=True)
    (tmp_path / "config.yaml").write_text("lr: 0.1\n")
    copy_beside(tmp_path, workdir)
    assert sorted(p.name for p in workdir.iterdir()) == ["config.yaml"]
