"""`accelify launch` takes `accelerate launch` command lines as written: every flag of HF's
own parser is honoured or refused with one line that says why (exit 2, no traceback)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import socket
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from accelify.errors import UserError
from accelify.run_cli import launch
from accelify.runtime.launch import hf_flags, lifeline
from accelify.runtime.launch.config import LaunchConfig, load_config
from accelify.runtime.launch.hf_flags import refused_family, snake
from accelify.runtime.launch.launcher import (
    LaunchPlan,
    check,
    merge,
    rendezvous_port,
    runtime_settings,
    torchrun_arguments,
)
from accelify.runtime.options import DeepSpeedOptions, FSDPOptions
from conftest import FIXTURES, run_accelify, run_in_own_group

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


# --- HF's own parser: every option of `accelerate launch` is known ---------------------------


def accelerate_options() -> list[tuple[str, tuple[str, ...], bool, tuple[str, ...]]]:
    """(name, spellings, takes a value, choices) of each option of HF's `accelerate launch`."""
    try:
        from accelerate.commands.launch import launch_command_parser
    except ImportError:  # the test extra installs it; without it the walk below is skipped
        return []
    options = []
    for action in launch_command_parser()._actions:
        if not action.option_strings or "--help" in action.option_strings:
            continue
        long_name = next(s for s in action.option_strings if s.startswith("--"))
        choices = tuple(str(c) for c in action.choices or ())
        options.append((snake(long_name), tuple(action.option_strings), action.nargs != 0, choices))
    return options


HF_OPTIONS = accelerate_options()
needs_accelerate = pytest.mark.skipif(not HF_OPTIONS, reason="HF accelerate is not installed")

#: the options of `accelerate launch` that accelify honours (by HF's name); every other one is
#: refused, with its reason, at least for the value tried below
HONOURED = {
    "config_file", "quiet", "module", "no_python", "debug",
    "cpu", "multi_gpu",
    "mixed_precision", "num_processes", "num_machines", "num_cpu_threads_per_process",
    "use_deepspeed", "use_fsdp",
    "gpu_ids", "same_network", "machine_rank", "main_process_ip", "main_process_port", "tee",
    "log_dir", "role", "rdzv_backend", "rdzv_conf", "max_restarts", "monitor_interval",
    "deepspeed_config_file", "zero_stage", "offload_optimizer_device", "offload_param_device",
    "gradient_accumulation_steps", "gradient_clipping", "zero3_init_flag",
    "zero3_save_16bit_model", "deepspeed_multinode_launcher",
    "fsdp_version", "fsdp_offload_params", "fsdp_min_num_params", "fsdp_sharding_strategy",
    "fsdp_reshard_after_forward", "fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap",
    "fsdp_backward_prefetch", "fsdp_state_dict_type", "fsdp_forward_prefetch",
    "fsdp_use_orig_params", "fsdp_cpu_ram_efficient_loading", "fsdp_sync_module_states",
    "fsdp_activation_checkpointing", "fsdp_activation_checkpointing_offload", "dynamo_backend",
}  # fmt: skip


def our_spellings() -> set[str]:
    return {
        spelling
        for param in launch.params
        if isinstance(param, click.Option)
        for spelling in (*param.opts, *param.secondary_opts)
    }


@needs_accelerate
@pytest.mark.parametrize(
    ("name", "spellings"), [(o[0], o[1]) for o in HF_OPTIONS], ids=[o[0] for o in HF_OPTIONS]
)
def test_every_accelerate_launch_option_is_known(name, spellings):
    """Each spelling of each HF option (snake and kebab) is an accelify option, or belongs to
    a family accelify refuses with its reason."""
    if name in HONOURED:
        assert set(spellings) <= our_spellings()
    else:
        known = our_spellings()
        assert all(s in known or refused_family(s) is not None for s in spellings)


def refused_value(name: str, takes_value: bool, choices: tuple[str, ...]) -> str | None:
    """A value of HF's that accelify refuses for this option (None: a flag without value)."""
    if not takes_value:
        return None
    accepted = next((f.accepts for _, f in hf_flags.HF_OPTIONS.values() if f.name == name), ())
    return next((c for c in choices if c.lower() not in accepted), "1")


#: honoured options that are accepted only with the values that ask for what accelify does
VALUE_CHECKED = {
    "fsdp_version", "fsdp_use_orig_params", "fsdp_backward_prefetch", "fsdp_forward_prefetch",
    "fsdp_state_dict_type", "fsdp_sync_module_states", "fsdp_cpu_ram_efficient_loading",
    "fsdp_activation_checkpointing_offload", "zero3_init_flag", "zero3_save_16bit_model",
    "deepspeed_multinode_launcher", "dynamo_backend",
}  # fmt: skip

REFUSED_CASES = [
    pytest.param(
        name,
        spelling,
        refused_value(name, takes, choices),
        id=spelling if not takes else f"{spelling}={refused_value(name, takes, choices)}",
    )
    for name, spellings, takes, choices in HF_OPTIONS
    if name not in HONOURED or name in VALUE_CHECKED
    for spelling in spellings
    if spelling.startswith("--")
]


@needs_accelerate
@pytest.mark.parametrize(("name", "spelling", "value"), REFUSED_CASES)
def test_a_refused_option_exits_2_with_its_one_line_reason(name, spelling, value):
    given = [spelling] if value is None else [spelling, value]
    result = CliRunner().invoke(launch, ["--cpu", *given, str(WHOAMI)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    # the flag as typed (a family refused whatever its value), or by HF's name with the value
    heads = [f"accelify: error: {spelling}: ", f"accelify: error: --{name}: "]
    if value is not None:
        heads.append(f"accelify: error: --{name} {value}: ")
    head = next((h for h in heads if lines[0].startswith(h)), None)
    assert head is not None, lines[0]
    assert len(lines[0]) > len(head) + 30, "the reason is missing"


@needs_accelerate
def test_hf_options_are_all_honoured_or_refused():
    names = {name for name, *_ in HF_OPTIONS}
    assert names >= HONOURED, HONOURED - names  # a name here that HF no longer has
    refused = names - HONOURED
    assert len(refused) > 60  # TPU, Megatron-LM, FP8, AWS, MPI, N-D parallelism, compile ...


# --- honoured: what each HF flag becomes -----------------------------------------------------


def parsed(*arguments: str, environ: dict[str, str] | None = None) -> LaunchPlan:
    """The plan `accelify launch ARGUMENTS train.py` would run (nothing is started)."""
    context = launch.make_context("launch", [*arguments, str(WHOAMI)])
    params = dict(context.params)
    script, args = params.pop("script"), params.pop("script_args")
    module, no_python = params.pop("module"), params.pop("no_python")
    params.pop("config_file")
    config = merge(LaunchConfig(), hf_flags.resolve(params), environ or {})
    return LaunchPlan(config, script, args, module, no_python)


@pytest.mark.parametrize(
    ("arguments", "backend", "options"),
    [
        (["--use_fsdp"], "fsdp", FSDPOptions()),
        (["--use-deepspeed", "--zero_stage", "3"], "deepspeed", DeepSpeedOptions(zero_stage=3)),
        (
            ["--use_fsdp", "--fsdp_sharding_strategy", "SHARD_GRAD_OP"],
            "fsdp",
            FSDPOptions(reshard_after_forward=False),
        ),
        (
            ["--use_fsdp", "--fsdp-reshard-after-forward", "false"],
            "fsdp",
            FSDPOptions(reshard_after_forward=False),
        ),
        (
            ["--use_fsdp", "--fsdp_transformer_layer_cls_to_wrap", "Block,Head"],
            "fsdp",
            FSDPOptions(auto_wrap=("Block", "Head")),
        ),
        (
            ["--use_fsdp", "--fsdp_auto_wrap_policy=SIZE_BASED_WRAP", "--fsdp_min_num_params=99"],
            "fsdp",
            FSDPOptions(min_num_params=99),
        ),
        (
            ["--use_fsdp", "--fsdp_activation_checkpointing", "true", "--fsdp-auto-wrap", "B"],
            "fsdp",
            FSDPOptions(auto_wrap=("B",), activation_checkpointing=True),
        ),
        (
            ["--use_fsdp", "--fsdp_activation_checkpointing=false"],
            "fsdp",
            FSDPOptions(activation_checkpointing=False),
        ),
        (["--use_fsdp", "--fsdp_offload_params", "true"], "fsdp", FSDPOptions(cpu_offload=True)),
        (
            ["--use_fsdp", "--fsdp_reshard_after_forward", "SHARD_GRAD_OP"],
            "fsdp",
            FSDPOptions(reshard_after_forward=False),
        ),
        (
            ["--use_deepspeed", "--offload_optimizer_device", "cpu", "--gradient_clipping", "1"],
            "deepspeed",
            DeepSpeedOptions(offload_optimizer=True, gradient_clipping=1.0),
        ),
        (
            ["--use_fsdp", "--fsdp_version", "2", "--fsdp_use_orig_params", "true"],
            "fsdp",
            FSDPOptions(),
        ),
        (["--multi_gpu"], "ddp", None),
    ],
    ids=[
        "use-fsdp",
        "use-deepspeed-zero-stage",
        "sharding-strategy",
        "reshard-false-kebab",
        "transformer-layers",
        "size-based-policy",
        "activation-checkpointing-true",
        "activation-checkpointing-false",
        "fsdp-offload",
        "reshard-fsdp1-spelling",
        "deepspeed-offload-and-clipping",
        "what-fsdp2-does-anyway",
        "multi-gpu-is-ddp",
    ],
)
def test_hf_flags_become_the_backend_and_its_options(arguments, backend, options):
    config = parsed(*arguments).config
    assert config.backend == backend
    if options is not None:
        assert getattr(config, backend) == options


def test_the_script_after_a_boolean_flag_is_not_read_as_its_value():
    plan = parsed("--use_fsdp", "--fsdp_activation_checkpointing", "--fsdp-auto-wrap", "B")
    assert plan.config.fsdp.activation_checkpointing is True
    assert plan.script == str(WHOAMI)


def test_agent_flags_reach_torchrun():
    plan = parsed(
        "--tee", "3", "--log_dir", "logs", "--role", "trainer", "--monitor-interval", "0.5",
        "--rdzv_backend", "c10d", "--rdzv_conf", "join_timeout=60", "--main_process_port", "29400",
    )  # fmt: skip
    arguments = torchrun_arguments(plan, 2)
    pairs = dict(itertools.pairwise(arguments))
    assert pairs["--tee"] == "3" and pairs["--log-dir"] == "logs"
    assert pairs["--role"] == "trainer" and pairs["--monitor-interval"] == "0.5"
    assert pairs["--rdzv-backend"] == "c10d" and pairs["--rdzv-conf"] == "join_timeout=60"
    assert pairs["--rdzv-endpoint"] == "127.0.0.1:29400"
    static = torchrun_arguments(parsed("--main_process_port", "29400"), 2)
    assert "--rdzv-endpoint" not in static and static[static.index("--rdzv-backend") + 1] == (
        "static"
    )


def test_no_python_runs_an_executable():
    plan = replace(parsed("--no_python"), script="bash")
    arguments = torchrun_arguments(plan, 1)
    # started through the lifeline, which executes it once it is tied to the launcher's life
    assert arguments[arguments.index("--no-python") + 1 :] == [*lifeline.command(), "bash"]
    check(plan, cuda_available=False)  # found on PATH, not as a file here
    with pytest.raises(UserError, match="contradict"):
        check(replace(plan, module=True), cuda_available=False)


def test_a_missing_script_is_refused_before_torch_is_imported(monkeypatch):
    """``launch nosuch.py`` took 5.6 s (torch's import) to say there was no such script."""
    from accelify.runtime.launch import launcher

    def torch_import() -> None:
        raise AssertionError("the launcher went on to import torch")

    monkeypatch.setattr(launcher, "_stopped_at_once", torch_import)
    with pytest.raises(UserError, match=r"no such script: nosuch\.py"):
        launcher.launch(replace(parsed(), script="nosuch.py"))


def test_a_source_checkouts_root_is_refused_with_the_way_out(tmp_path, monkeypatch):
    """From a clone's root with the wheel installed, each rank's ``python -m
    accelify.runtime.rank_entry`` imported the clone's accelify/ folder (no runtime/ until
    installed): three bare ModuleNotFoundErrors and "their tracebacks are above". The launcher
    says why once, with the fix, as ``python script.py`` does."""
    (tmp_path / "accelify").mkdir()
    (tmp_path / "accelify" / "__init__.py").write_text("")
    (tmp_path / "runtime").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONSAFEPATH", raising=False)
    with pytest.raises(UserError, match=r"accelify's source folder.*pip install -e \."):
        check(parsed(), cuda_available=False)
    (tmp_path / "accelify" / "runtime").mkdir()  # a folder that holds the runtime is fine
    check(parsed(), cuda_available=False)


def test_rank_settings_reach_the_environment():
    env = runtime_settings(
        parsed("--debug", "--num_cpu_threads_per_process", "3", "--gpu_ids", "1,3").config
    ).to_env()
    assert env["ACCELIFY_DEBUG_MODE"] == "true"
    assert env["OMP_NUM_THREADS"] == "3"
    assert env["CUDA_VISIBLE_DEVICES"] == "1,3"
    plain = runtime_settings(parsed("--gpu_ids", "all").config).to_env()
    assert not {"ACCELIFY_DEBUG_MODE", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES"} & set(plain)


def test_gpu_ids_choose_the_process_count_and_are_refused_on_the_cpu():
    plan = parsed("--gpu_ids", "0,2")
    assert plan.config.num_processes == 2
    check(plan, cuda_available=True)
    with pytest.raises(UserError, match="selects GPUs, and this run is on the CPU"):
        check(plan, cuda_available=False)
    with pytest.raises(UserError, match="names 2"):
        check(parsed("--gpu_ids", "0,2", "-n", "3"), cuda_available=True)


@pytest.mark.parametrize("tee", ["4", "x", "0:3,1"], ids=["out-of-range", "word", "half-map"])
def test_a_bad_tee_is_refused(tee):
    with pytest.raises(UserError, match="--tee"):
        check(parsed("--tee", tee), cuda_available=False)


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        (["--use_fsdp", "--backend", "deepspeed"], "ask for two engines"),
        (["--multi_gpu", "--cpu"], "--multi_gpu asks for GPUs and --cpu for the CPU"),
        (["--fsdp_offload_params", "true"], "applies to --backend fsdp"),
    ],
    ids=["two-engines", "multi-gpu-and-cpu", "fsdp-flag-without-fsdp"],
)
def test_contradictions_are_refused(arguments, words):
    with pytest.raises(UserError, match=words):
        check(parsed(*arguments), cuda_available=False)


def test_hf_config_keys_that_now_mean_something(tmp_path):
    path = write(tmp_path, "distributed_type: MULTI_CPU\ndebug: true\ngpu_ids: all\n")
    config = load_config(path)
    assert config.debug is True and config.gpu_ids == "all"
    ds = load_config(write(tmp_path, "deepspeed_config:\n  gradient_clipping: 1.0\n"))
    assert ds.deepspeed.gradient_clipping == 1.0


@pytest.mark.distributed
def test_hf_launcher_flags_reach_every_rank(tmp_path):
    result = run_accelify(
        "launch", "--cpu", "--num_processes", "2", "--debug", "--num_cpu_threads_per_process",
        "1", "--tee", "3", "--log_dir", tmp_path / "logs", "--role", "trainer", "-q",
        "--same_network", "--rdzv_backend", "c10d", "--monitor_interval", "0.2",
        FIXTURES / "runtime" / "launch_env.py",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = [line.partition(":")[2] for line in result.stdout.splitlines() if "{" in line]
    ranks = sorted((json.loads(line) for line in lines), key=lambda r: r["rank"])
    assert [(r["rank"], r["world"]) for r in ranks] == [(0, 2), (1, 2)]
    assert all(r["debug"] and r["threads"] == 1 and r["role"] == "trainer" for r in ranks)
    logs = sorted(p.name for p in (tmp_path / "logs").rglob("*.log"))
    assert logs == ["stderr.log", "stderr.log", "stdout.log", "stdout.log"]


@pytest.mark.parametrize(
    ("arguments", "per_machine"),
    [
        (["-n", "8"], 8),
        (["--num_processes", "8", "--num_machines", "2", "--main_process_ip", "10.0.0.1"], 4),
        (["--num_machines", "2", "--main_process_ip", "10.0.0.1"], 3),  # not given: the default
        (["--nproc_per_node", "2"], 2),  # torchrun's spelling (trial24: "No such option")
        (["--nproc-per-node", "4", "--num_machines", "2", "--main_process_ip", "10.0.0.1"], 4),
    ],
    ids=[
        "one-machine",
        "total-shared-by-two",
        "default-per-machine",
        "torchrun-per-node",
        "torchrun-per-node-of-two",
    ],
)
def test_num_processes_is_the_total_over_all_machines_as_in_hf(arguments, per_machine):
    plan = parsed(*arguments, "--main_process_port", "29400")
    check(plan, cuda_available=True)
    arguments = torchrun_arguments(plan, plan.config.num_processes or 3)
    assert arguments[arguments.index("--nproc-per-node") + 1] == str(per_machine)


def test_torchruns_count_per_machine_beside_the_total_is_refused():
    with pytest.raises(UserError, match="both give the count: give one"):
        parsed("--nproc_per_node", "2", "-n", "2")


def test_a_total_that_machines_cannot_share_is_refused():
    plan = parsed(
        "-n", "3", "--num_machines", "2", "--main_process_ip", "a", "--main_process_port", "1"
    )
    with pytest.raises(UserError, match="2 machines cannot share it evenly"):
        check(plan, cuda_available=True)


@pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed"
)
def test_gradient_clipping_reaches_the_deepspeed_config(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from torch.utils.data import DataLoader

    from accelify.runtime.backends.deepspeed import DeepSpeedBackend
    from accelify.runtime.state import ProcessState

    state = ProcessState.from_env(cpu=True)
    loader = DataLoader(list(range(8)), batch_size=4)
    options = parsed("--use_deepspeed", "--gradient_clipping", "0.5").config.deepspeed
    assert DeepSpeedBackend(state, "no", options)._config([loader])["gradient_clipping"] == 0.5
    unclipped = DeepSpeedBackend(state, "no", DeepSpeedOptions())._config([loader])
    assert unclipped["gradient_clipping"] == 0.0  # DeepSpeed's default 1.0 stays off


def test_the_rendezvous_port_is_held_from_its_choice_to_the_end_of_the_run():
    """A port picked free and released could be taken by another process before the agent's
    store bound it (the run failed with EADDRINUSE): the launcher holds it, in a store server
    the agent's rendezvous store (multi-tenant, in the same process) shares."""
    from torch.distributed import TCPStore

    with rendezvous_port(LaunchConfig()) as port:
        assert port is not None and port > 0
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))  # nobody else can take it meanwhile
        # the agent's store, as torch's static rendezvous makes it, on the same port
        agent = TCPStore("127.0.0.1", port, 1, True, timedelta(seconds=30), multi_tenant=True)
        rank = TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=30))
        rank.set("seen", "1")
        assert agent.get("seen") == b"1"
        del agent, rank
    given = replace(LaunchConfig(), main_process_port=29400)
    with rendezvous_port(given) as port:
        assert port is None  # the user's port: the agent binds it
    arguments = torchrun_arguments(parsed(), 2, 41234)
    assert arguments[arguments.index("--master-port") + 1] == "41234"


def test_a_rendezvous_port_in_use_is_said_in_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_accelify(
            "launch", "--cpu", "-n", "2", "--main-process-port", str(port), WHOAMI, cwd=tmp_path
        )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"accelify: error: the rendezvous port 127.0.0.1:{port} is in use (another run, or "
        "another program, holds it): give another --main-process-port, or none: the launcher "
        "then binds a free one"
    )


#: `accelify launch ARGS` with another program binding the rendezvous port in the window the
#: race was in: after the launcher chose the port, before the agent's store bound it.
TAKE_THE_PORT_MEANWHILE = """
import socket
import sys

from accelify.cli import main
from accelify.runtime.launch import launcher

chosen = launcher.torchrun_arguments
others = []


def taken_meanwhile(*args, **kwargs):
    arguments = chosen(*args, **kwargs)
    port = int(arguments[arguments.index("--master-port") + 1])
    other = socket.socket()
    others.append(other)  # kept open to the end of the run
    try:
        other.bind(("127.0.0.1", port))
        other.listen()
        print("the other program took the port", file=sys.stderr)
    except OSError as error:
        print(f"the other program could not take the port: {error.strerror}", file=sys.stderr)
    return arguments


launcher.torchrun_arguments = taken_meanwhile
main(sys.argv[1:], prog_name="accelify")
"""


@pytest.mark.distributed
def test_another_program_cannot_take_the_port_before_the_agent_binds_it(tmp_path):
    """The race, provoked where it was: a port picked free and released was bound by the agent's
    store only once torchrun started, and a program binding it meanwhile failed the run."""
    driver = tmp_path / "take_the_port.py"
    driver.write_text(TAKE_THE_PORT_MEANWHILE)
    command = [sys.executable, str(driver), "launch", "--cpu", "-n", "2", str(WHOAMI)]
    result = run_in_own_group(command, cwd=tmp_path, timeout=180)
    assert "the other program could not take the port: Address already in use" in result.stderr
    assert result.returncode == 0, result.stderr
    assert sorted(json.loads(line)["rank"] for line in result.stdout.splitlines()) == [0, 1]


def test_port_0_is_a_free_port_on_one_machine_and_refused_on_several():
    arguments = torchrun_arguments(parsed("--main_process_port", "0"), 1)
    assert int(arguments[arguments.index("--master-port") + 1]) > 0
    plan = parsed("--main_process_port", "0", "--num_machines", "2", "--main_process_ip", "a")
    with pytest.raises(UserError, match="needs --main-process-port"):
        check(plan, cuda_available=True)


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs a CPU affinity mask of two cores or more to narrow",
)
def test_cpu_threads_are_the_cores_of_the_affinity_mask_shared_out(tmp_path: Path):
    """A launcher pinned to one core (``taskset``, a container's cpuset) gives its one CPU rank
    one intra-op thread, not ``os.cpu_count()``'s host count: more threads than cores slow a
    rank's large matmuls down."""
    script = tmp_path / "threads.py"
    script.write_text("import os\n\nimport torch\n\nprint('omp', os.environ['OMP_NUM_THREADS'])\n")
    environment = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    pinned = [
        sys.executable,
        "-c",
        "import os, sys; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))});"
        " from accelify.cli import main; sys.argv = ['accelify', *sys.argv[1:]]; main()",
        "launch",
        "--cpu",
        "-n",
        "1",
        str(script),
    ]
    result = run_in_own_group(pinned, cwd=tmp_path, timeout=240, env=environment)
    assert result.returncode == 0, result.stderr
    assert "omp 1" in result.stdout.splitlines()
