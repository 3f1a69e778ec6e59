"""`accelify config` writes what `accelify launch` reads; bad files fail with the key and line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from accelify.errors import UserError
from accelify.runtime.launch.config import LaunchConfig, load_config
from accelify.runtime.options import DeepSpeedOptions, FSDPOptions
from conftest import FIXTURES, assert_ok, run_accelify, run_in_own_group

WHOAMI = FIXTURES / "runtime" / "whoami.py"


def ranks(stdout: str) -> list[dict]:
    return sorted(
        (json.loads(line) for line in stdout.splitlines() if line.startswith("{")),
        key=lambda r: r["rank"],
    )


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_default_config_then_launch_with_it(tmp_path):
    path = tmp_path / "accelify.yaml"
    assert_ok(run_accelify("config", "--default", "--config-file", path))
    assert load_config(path) == LaunchConfig(num_processes=1, use_cpu=True, mixed_precision="no")
    result = run_accelify("launch", "--config-file", path, WHOAMI)
    assert_ok(result)
    assert [r["world"] for r in ranks(result.stdout)] == [1]


def test_flags_win_over_the_file(tmp_path):
    path = write(tmp_path, "num_processes: 1\nuse_cpu: true\ngradient_accumulation_steps: 2\n")
    result = run_accelify(
        "launch",
        "--config-file",
        path,
        "-n",
        "2",
        "--gradient-accumulation-steps",
        "4",
        "--mixed-precision",
        "bf16",
        WHOAMI,
    )
    assert_ok(result)
    seen = ranks(result.stdout)
    assert [r["rank"] for r in seen] == [0, 1]
    assert {r["gradient_accumulation_steps"] for r in seen} == {4}
    assert {r["mixed_precision"] for r in seen} == {"bf16"}


def test_hugging_face_accelerate_config_is_understood(tmp_path):
    path = write(
        tmp_path,
        """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_CPU
downcast_bf16: 'no'
machine_rank: 0
main_training_function: main
mixed_precision: 'no'
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: true
""",
    )
    result = run_accelify("launch", "--config-file", path, WHOAMI)
    assert_ok(result)
    assert [(r["rank"], r["world"], r["device"]) for r in ranks(result.stdout)] == [
        (0, 2, "cpu"),
        (1, 2, "cpu"),
    ]


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("num_processes: 2\nmixed_precision: fp8\n", 2, "mixed_precision: expected one of"),
        ("num_processes: two\n", 1, "num_processes: expected an integer"),
        ("use_cpu: true\nnum_gpus: 2\n", 2, "num_gpus: unknown key"),
        ("num_processes: [2\nuse_cpu: true\n", None, "invalid YAML"),
        ("distributed_type: TPU\n", 1, "distributed_type 'TPU' is not supported"),
    ],
)
def test_bad_config_names_the_key_and_line(tmp_path, text, line, words):
    path = write(tmp_path, text)
    with pytest.raises(UserError) as caught:
        load_config(path)
    assert words in caught.value.message
    if line is not None:
        assert caught.value.line == line
    result = run_accelify("launch", "--config-file", path, WHOAMI)
    assert result.returncode == 2
    assert str(path) in result.stderr and words in result.stderr
    assert "Traceback" not in result.stderr


def test_malformed_yaml_reports_its_line(tmp_path):
    path = write(tmp_path, "num_processes: 2\nuse_cpu: true\n  extra: 1\n")
    result = run_accelify("launch", "--config-file", path, WHOAMI)
    assert result.returncode == 2
    assert f"{path}:3: invalid YAML: mapping values are not allowed here" in result.stderr


def test_fp16_on_cpu_is_refused_before_any_rank_starts(tmp_path):
    result = run_accelify("launch", "--cpu", "-n", "2", "--mixed-precision", "fp16", WHOAMI)
    assert result.returncode == 2
    assert "fp16 needs CUDA GPUs" in result.stderr
    assert '"rank"' not in result.stdout


def test_missing_script_is_a_usage_error(tmp_path):
    result = run_accelify("launch", "--cpu", "-n", "2", tmp_path / "nope.py")
    assert result.returncode == 2
    assert "no such script" in result.stderr


def test_a_script_with_a_syntax_error_is_refused_once_with_its_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\ndef f(:\n    pass\n")
    result = run_accelify("launch", "--cpu", "-n", "2", script)
    assert result.returncode == 2
    assert f"{script}:2: SyntaxError: invalid syntax" in result.stderr
    assert result.stderr.count("SyntaxError") == 1 and "Traceback" not in result.stderr


def test_interactive_config_asks_and_writes(tmp_path):
    from click.testing import CliRunner

    from accelify.cli import main

    path = tmp_path / "asked.yaml"
    answers = "\n".join(["1", "y", "2", "bf16", "4", "ddp"]) + "\n"
    result = CliRunner().invoke(main, ["config", "--config-file", str(path)], input=answers)
    assert result.exit_code == 0, result.output
    assert load_config(path) == LaunchConfig(
        num_processes=2, use_cpu=True, mixed_precision="bf16", gradient_accumulation_steps=4
    )


def test_interactive_config_asks_for_the_backend_options(tmp_path):
    from click.testing import CliRunner

    from accelify.cli import main

    path = tmp_path / "asked.yaml"
    answers = "\n".join(["1", "y", "2", "no", "1", "fsdp", "Block", "n", "y"]) + "\n"
    result = CliRunner().invoke(main, ["config", "--config-file", str(path)], input=answers)
    assert result.exit_code == 0, result.output
    config = load_config(path)
    assert config.backend == "fsdp"
    assert config.fsdp == FSDPOptions(
        reshard_after_forward=False, auto_wrap=("Block",), activation_checkpointing=True
    )


def test_backend_options_from_the_file_and_flags_option_by_option(tmp_path):
    path = write(
        tmp_path,
        "num_processes: 2\nuse_cpu: true\nbackend: fsdp\n"
        "fsdp:\n  auto_wrap: [Block]\n  reshard_after_forward: true\n",
    )
    result = run_accelify("launch", "--config-file", path, "--fsdp-keep-after-forward", WHOAMI)
    assert_ok(result)
    for rank in ranks(result.stdout):
        assert rank["backend"] == "fsdp"
        assert rank["options"] == {"auto_wrap": ["Block"], "reshard_after_forward": False}


def test_accelerate_fsdp_config_is_understood(tmp_path):
    path = write(
        tmp_path,
        """\
distributed_type: FSDP
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: BertLayer,Block
  fsdp_sharding_strategy: SHARD_GRAD_OP
  fsdp_offload_params: false
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_version: 2
num_processes: 2
use_cpu: true
""",
    )
    config = load_config(path)
    assert config.backend == "fsdp"
    assert config.fsdp == FSDPOptions(
        reshard_after_forward=False, auto_wrap=("BertLayer", "Block"), cpu_offload=False
    )


def test_accelerate_deepspeed_config_is_understood(tmp_path):
    path = write(
        tmp_path,
        """\
distributed_type: DEEPSPEED
deepspeed_config:
  gradient_accumulation_steps: 2
  offload_optimizer_device: none
  offload_param_device: none
  zero3_init_flag: false
  zero_stage: 3
num_processes: 2
use_cpu: true
""",
    )
    config = load_config(path)
    assert config.backend == "deepspeed"
    assert config.deepspeed == DeepSpeedOptions(
        zero_stage=3, offload_optimizer=False, offload_params=False
    )
    assert config.gradient_accumulation_steps == 2


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("fsdp:\n  shard: true\n", "unknown option 'shard'"),
        ("distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: NO_SHARD\n", "NO_SHARD"),
        ("deepspeed_config:\n  offload_param_device: nvme\n", "'nvme' is not supported"),
    ],
)
def test_bad_backend_sections_are_errors(tmp_path, text, words):
    with pytest.raises(UserError) as raised:
        load_config(write(tmp_path, text))
    assert words in str(raised.value)


#: A test file whose module-scoped fixture launches before any test-scoped fixture is set up
SHARED_FIXTURE = """
import pytest

from conftest import run_accelify


@pytest.fixture(scope="module")
def shared_run():
    return run_accelify("env")


def test_the_shared_run_read_no_user_config(shared_run):
    assert shared_run.returncode == 0, shared_run.stderr
    assert "num_processes: 7" not in shared_run.stdout, shared_run.stdout
    assert "ACCELIFY_* set: none" in shared_run.stdout, shared_run.stdout
"""


def test_a_module_scoped_fixtures_launch_reads_no_user_config(tmp_path):
    """The suite's isolation from the developer's ~/.config/accelify and ACCELIFY_* variables
    covers fixtures shared by a module's tests too, though they are set up before any
    function-scoped fixture: run in a pytest of its own, with a config in a fake HOME."""
    home = tmp_path / "home"
    (home / ".config" / "accelify").mkdir(parents=True)
    (home / ".config" / "accelify" / "config.yaml").write_text("num_processes: 7\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_shared.py").write_text(SHARED_FIXTURE)
    env = {
        name: value
        for name, value in os.environ.items()
        if name != "XDG_CONFIG_HOME" and not name.startswith(("ACCELIFY_", "PYTEST_"))
    }
    env.update(
        HOME=str(home),
        PYTHONPATH=str(Path(__file__).parent),
        ACCELIFY_NUM_PROCESSES="7",  # a variable the user left set
    )
    command = [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:xdist"]
    command += ["-p", "no:cacheprovider", "-c", str(tmp_path / "pytest.ini"), "-q"]
    result = run_in_own_group([*command, str(tmp_path / "test_shared.py")], tmp_path, 240, env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
