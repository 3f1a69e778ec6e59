"""The command line: version, help, env, and a start that does not pay for torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from accelify import __version__
from conftest import assert_ok, run_accelify


def test_version():
    result = run_accelify("--version")
    assert_ok(result)
    assert __version__ in result.stdout


def test_help_lists_the_commands():
    result = run_accelify("--help")
    assert_ok(result)
    for command in ("launch", "config", "env"):
        assert command in result.stdout


def test_cli_and_package_import_without_torch():
    code = (
        "import sys, accelify, accelify.cli, accelify.runtime, accelify.runtime.launch.config;"
        "from accelify.runtime.launch import launcher;"
        "print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert_ok(result)
    assert result.stdout.strip() == "False"


def test_env_report_names_versions_and_devices():
    result = run_accelify("env")
    assert_ok(result)
    for words in ("accelify: " + __version__, "torch: ", "GPUs: ", "config: "):
        assert words in result.stdout


def test_version_names_the_engines_it_would_run_with():
    import torch

    result = run_accelify("--version")
    assert result.stdout.strip().startswith(f"accelify {__version__} (torch {torch.__version__}")


@pytest.mark.parametrize(
    "args",
    [("--version",), ("--help",), ("launch", "--help"), ("launch", "--bogus", "x.py"), ("lint",)],
    ids=["version", "help", "launch-help", "bad-option", "lint-nothing"],
)
def test_python_m_and_the_console_script_behave_the_same(args, tmp_path):
    script = Path(sys.executable).with_name("accelify")
    console = subprocess.run([str(script), *args], capture_output=True, text=True, cwd=tmp_path)
    module = run_accelify(*args, cwd=tmp_path)
    assert (module.returncode, module.stdout, module.stderr) == (
        console.returncode,
        console.stdout,
        console.stderr,
    )


@pytest.mark.parametrize(
    ("flag", "suggestion"),
    [
        ("--bogus", None),
        ("--num-proceses", "--num-processes"),
        ("--mixed-precison", "--mixed-precision"),
    ],
)
def test_a_mistyped_launch_option_is_named_not_taken_for_the_script(flag, suggestion, tmp_path):
    (tmp_path / "train.py").write_text("print('ran')\n")
    result = run_accelify("launch", flag, "2", "train.py", cwd=tmp_path)
    assert result.returncode == 2
    assert f"No such option '{flag}'" in result.stderr
    assert "no such script" not in result.stderr and "ran" not in result.stdout
    if suggestion:
        assert "Did you mean" in result.stderr and suggestion in result.stderr


@pytest.mark.distributed
def test_options_after_the_script_are_the_scripts(tmp_path):
    (tmp_path / "train.py").write_text("import sys\nprint(sys.argv[1:])\n")
    result = run_accelify(
        "launch", "--cpu", "-n", "1", "train.py", "--bogus", "-n", "3", cwd=tmp_path
    )
    assert_ok(result)
    assert result.stdout.strip() == "['--bogus', '-n', '3']"


@pytest.mark.parametrize(
    ("source", "line"),
    [
        ("from accelerate import Accelerator\naccelerator = Accelerator()\n", 1),
        ("import os\nimport accelerate\naccelerator = accelerate.Accelerator()\n", 2),
        ("from accelerate.state import PartialState\nstate = PartialState()\n", 1),
    ],
    ids=["from-import", "module-attribute", "partial-state"],
)
def test_hf_accelerate_scripts_are_refused_on_cpu_with_what_to_do(source, line, tmp_path):
    (tmp_path / "train.py").write_text(source)
    result = run_accelify("launch", "--cpu", "-n", "2", "train.py", cwd=tmp_path)
    assert result.returncode == 2
    assert f"train.py:{line}: " in result.stderr
    assert "from accelify import Accelerator" in result.stderr
    assert "ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 train.py" in result.stderr


@pytest.mark.parametrize(
    "source",
    [
        "from accelerate.utils import set_seed\nset_seed(0)\nprint('ran')\n",
        "from accelify import Accelerator\nfrom accelerate.utils import set_seed\nprint('ran')\n",
        "import accelerate\nprint('ran', bool(accelerate.__version__))\n",
    ],
    ids=["utilities-only", "accelify-accelerator", "version-only"],
)
@pytest.mark.distributed
def test_scripts_that_do_not_create_hf_state_launch(source, tmp_path):
    (tmp_path / "train.py").write_text(source)
    result = run_accelify("launch", "--cpu", "-n", "2", "train.py", cwd=tmp_path)
    assert_ok(result)
    assert result.stdout.count("ran") == 2
