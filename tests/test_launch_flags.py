"""`accelify launch` takes `accelerate launch` command lines as written: every flag of HF's
own parser is honoured or refused with one line that says why (exit 2, no traceback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelify.errors import UserError
from accelify.runtime.launch.config import LaunchConfig, load_config
from accelify.runtime.launch.launcher import merge
from conftest import FIXTURES, run_accelify

WHOAMI = FIXTURES / "runtime" / "whoami.py"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


# --- --hang-timeout / hang_timeout ----------------------------------------------------------


def test_hang_timeout_defaults_to_five_minutes_and_zero_turns_it_off(tmp_path):
    assert LaunchConfig().hang_timeout == 300.0
    assert load_config(write(tmp_path, "hang_timeout: 0\n")).hang_timeout == 0.0
    assert load_config(write(tmp_path, "hang_timeout: 42.5\n")).hang_timeout == 42.5


def test_hang_timeout_flag_wins_over_the_file(tmp_path):
    file_config = load_config(write(tmp_path, "hang_timeout: 60\n"))
    assert merge(file_config, {"hang_timeout": 5.0}).hang_timeout == 5.0
    assert merge(file_config, {"hang_timeout": None}).hang_timeout == 60.0


@pytest.mark.parametrize("value", ["-1", "soon"], ids=["negative", "not-a-number"])
def test_bad_hang_timeout_in_the_file_names_the_key_and_line(tmp_path, value):
    with pytest.raises(UserError) as caught:
        load_config(write(tmp_path, f"use_cpu: true\nhang_timeout: {value}\n"))
    assert caught.value.line == 2
    assert "hang_timeout: expected a number of seconds >= 0" in caught.value.message


def test_bad_hang_timeout_flag_is_a_usage_error():
    result = run_accelify("launch", "--cpu", "--hang-timeout", "-3", WHOAMI)
    assert result.returncode == 2
    assert "--hang-timeout" in result.stderr and "Traceback" not in result.stderr
