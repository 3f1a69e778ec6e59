"""The command line: version, help, env, and a start that does not pay for torch."""

from __future__ import annotations

import subprocess
import sys

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
        "import sys, accelify, accelify.cli, accelify.runtime, accelify.runtime.config;"
        "from accelify.runtime import launcher;"
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
