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


def test_nothing_is_copied_from_a_folder_that_holds_the_working_directory(tmp_path: Path):
    """A script in the temporary folder, where verify's scratch folder lies too: what lies
    beside it is other runs' scratch folders and other users' files."""
    workdir = tmp_path / "scratch" / "first-work"
    workdir.mkdir(parents=True)
    (tmp_path / "config.yaml").write_text("lr: 0.1\n")
    (tmp_path / "other-run").mkdir()
    (tmp_path / "other-run" / "out.txt").write_text("x\n")
    copy_beside(tmp_path, workdir)
    assert list(workdir.iterdir()) == []


def test_nothing_is_copied_from_the_temporary_folder(tmp_path: Path, monkeypatch):
    """A script directly in the temporary folder, the working directory made elsewhere."""
    import tempfile

    temporary, workdir = tmp_path / "tmp", tmp_path / "work"
    temporary.mkdir()
    workdir.mkdir()
    (temporary / "config.yaml").write_text("lr: 0.1\n")
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(temporary))
    copy_beside(temporary, workdir)
    assert list(workdir.iterdir()) == []


def test_a_run_that_steps_nothing_is_told_which_copied_checkpoints_it_may_have_resumed_from(
    tmp_path: Path,
):
    # a GAN that resumes from gan_ckpt/ beside it finds its epochs done and steps nothing
    from accelify.verify.cli import _copied_note

    folder, workdir = tmp_path / "project", tmp_path / "work"
    folder.mkdir()
    workdir.mkdir()
    (folder / "gan_ckpt").mkdir()
    (folder / "gan_ckpt" / "ckpt_003.pt").write_bytes(b"0")
    (folder / "notes.txt").write_text("x")
    copy_beside(folder, workdir)
    (workdir / "written_by_the_run.pt").write_bytes(b"0")  # not beside the script
    note = _copied_note(folder, workdir)
    assert "gan_ckpt/" in note and "notes.txt" not in note and "written_by_the_run" not in note
    assert _copied_note(folder, tmp_path / "empty") == ""
