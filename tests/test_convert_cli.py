"""`accelify convert` as a command: preview, --write, --check, directories, errors."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, assert_ok, run_accelify

GAN = FIXTURES / "scripts" / "gan.py"


def test_preview_shows_the_diff_and_summary_and_writes_nothing(tmp_path: Path):
    script = tmp_path / "gan.py"
    shutil.copy(GAN, script)
    result = run_accelify("convert", script)
    assert_ok(result)
    assert "-            d_loss.backward(retain_graph=True)" in result.stdout
    assert "+            accelerator.backward(d_loss, retain_graph=True)" in result.stdout
    assert f"{script}: prepared generator, discriminator, opt_g, opt_d, loader" in result.stdout
    # the generator's noise is drawn alike on every rank after one seed: its review line
    assert "1 of 1 file would be converted, 1 place to review (run with --write" in result.stderr
    assert "review " in result.stdout and "drawn each training step after the same seed" in (
        result.stdout
    )
    assert script.read_bytes() == GAN.read_bytes()


def test_check_exits_1_until_written_then_0(tmp_path: Path):
    script = tmp_path / "gan.py"
    shutil.copy(GAN, script)
    assert run_accelify("convert", "--check", "--quiet", script).returncode == 1
    check = run_accelify("convert", "--check", script)
    assert check.returncode == 1
    assert check.stdout == f"Would convert: {script}\n"  # as `ruff format --check`: no diff
    assert_ok(run_accelify("convert", "--write", script))
    check = run_accelify("convert", "--check", script)
    assert check.returncode == 0 and "Would convert" not in check.stdout


def test_quiet_check_names_the_file_that_would_change(tmp_path: Path):
    """The pre-commit hook runs `convert --check --quiet`: its output must say which file."""
    script = tmp_path / "gan.py"
    shutil.copy(GAN, script)
    (tmp_path / "utils.py").write_text("def helper():\n    return 1\n")
    check = run_accelify("convert", "--check", "--quiet", script, tmp_path / "utils.py")
    assert check.returncode == 1
    assert check.stdout == f"Would convert: {script}\n"
    # as `ruff format --check --quiet` and `black --check --quiet`: no count line
    assert check.stderr == ""
    clean = run_accelify("convert", "--check", "--quiet", tmp_path / "utils.py")
    assert clean.returncode == 0
    assert (clean.stdout, clean.stderr) == ("", "")


def test_a_directory_converts_training_scripts_and_skips_the_rest(tmp_path: Path):
    shutil.copy(GAN, tmp_path / "gan.py")
    (tmp_path / "utils.py").write_text("def helper():\n    return 1\n")
    result = run_accelify("convert", tmp_path, "--write", "--jobs", "2")
    assert_ok(result)
    assert f"{tmp_path / 'utils.py'}: skipped (no .backward() call" in result.stdout
    assert "accelerator.backward" in (tmp_path / "gan.py").read_text()
    assert (tmp_path / "utils.py").read_text() == "def helper():\n    return 1\n"


def test_output_takes_one_input(tmp_path: Path):
    result = run_accelify("convert", GAN, GAN, "-o", tmp_path / "out.py")
    assert result.returncode == 2
    assert "exactly one input file" in result.stderr


def test_bom_crlf_and_comments_survive(tmp_path: Path):
    source = (FIXTURES / "convert" / "flat_script" / "before.py").read_text()
    source = source.replace("loss.backward()", "loss.backward()  # keep me")
    script = tmp_path / "train.py"
    script.write_bytes(b"\xef\xbb\xbf" + source.replace("\n", "\r\n").encode())
    assert_ok(run_accelify("convert", "--write", script))
    data = script.read_bytes()
    assert data.startswith(b"\xef\xbb\xbf")
    assert b"accelerator.backward(loss)  # keep me\r\n" in data
    assert b"\n" not in data.replace(b"\r\n", b"")


def test_a_single_file_conversion_does_not_import_torch(tmp_path: Path):
    code = (
        "import sys\n"
        "from accelify.cli import main\n"
        "try:\n"
        f"    main(['convert', {str(GAN)!r}, '--quiet'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "torch imported: False" in result.stdout, result.stderr


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="this Python compiles 3.12 syntax")
def test_a_script_for_a_newer_python_is_named_not_blamed_on_the_conversion(tmp_path: Path):
    script = tmp_path / "train.py"
    source = (
        "import torch\n"
        "type Batch = tuple[torch.Tensor, torch.Tensor]\n"
        "model = torch.nn.Linear(2, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x in [torch.randn(4, 2)]:\n"
        "    opt.zero_grad()\n"
        "    model(x).sum().backward()\n"
        "    opt.step()\n"
    )
    script.write_text(source)
    result = run_accelify("convert", "--write", script)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{script}:2: this Python" in result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    assert script.read_text() == source


def test_the_diff_is_colored_where_asked_and_never_with_no_color(tmp_path: Path):
    """``--color/--no-color`` as ruff and git spell them (trial20): a pipe gets no color
    unless ``--color`` asks; ``--no-color`` and ``NO_COLOR`` turn it off on a terminal."""
    from accelify import terminal

    script = tmp_path / "gan.py"
    shutil.copy(GAN, script)
    piped = run_accelify("convert", script)
    forced = run_accelify("convert", script, "--color")
    off = run_accelify("convert", script, "--no-color")
    for result in (piped, forced, off):
        assert_ok(result)
    assert "\x1b[" not in piped.stdout and "\x1b[" not in off.stdout
    assert "\x1b[32m+            accelerator.backward(d_loss, retain_graph=True)" in forced.stdout

    class _Terminal:
        def isatty(self) -> bool:
            return True

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "stdout", _Terminal())
        patch.delenv("NO_COLOR", raising=False)
        assert terminal.use_color(None) and not terminal.use_color(False)
        patch.setenv("NO_COLOR", "1")
        assert not terminal.use_color(None) and terminal.use_color(True)
        patch.setenv("NO_COLOR", "")  # no-color.org: set but empty does not count
        assert terminal.use_color(None)
