"""FSDP2 and DeepSpeed ZeRO behind the same calls, on real processes (2 ranks, CPU, gloo).

Every run is fixtures/runtime/engines.py: the same model, data, optimizer and LR scheduler under
`accelify launch --backend ...`. Every engine must train exactly like one process with the
global batch, unclipped (with SGD and Adam, with and without accumulation), and clip like DDP
(with a limit that is not DeepSpeed's default). One launch per engine trains all of these in turn
(the script's --runs), each with its own Accelerator. DeepSpeed JIT-builds its shared-memory comm op
on first use; torch caches it in TORCH_EXTENSIONS_DIR (by default one folder per Python environment
here: conftest.extensions_dir), so it is built once, before the first DeepSpeed launch of the first
run (`deepspeed_op`), not inside it.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from accelify.cli import main
from accelify.convert import convert_source
from accelify.runtime.options import deepspeed as deepspeed_options
from conftest import FIXTURES, assert_ok, extensions_dir, launch, run_accelify, run_in_own_group

# One pytest-xdist worker runs this module: its tests share module fixtures
# (each engine's launch, made once).
pytestmark = [pytest.mark.distributed, pytest.mark.xdist_group("engines")]
SCRIPT = FIXTURES / "runtime" / "engines.py"
needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed"
)
needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA GPUs (NCCL, fp16, offload)"
)

FSDP = ("--backend", "fsdp", "--fsdp-auto-wrap", "Block")
FSDP_BY_SIZE = ("--backend", "fsdp", "--fsdp-min-num-params", "1000", "--fsdp-keep-after-forward")
ACCUMULATE = ("--accumulate", "2")
ZERO = {stage: ("--backend", "deepspeed", "--zero-stage", str(stage)) for stage in (1, 2, 3)}


#: What building DeepSpeed's CPU shared-memory op may take: 78 CPU-seconds alone, many minutes
#: on a machine loaded many times over
BUILD_TIMEOUT = 1800


#: Loads (and builds, if it is not current) DeepSpeed's CPU comm op. torch first: the run is
#: then forked from the tests' fork server, which imported torch once (conftest.start)
LOADS_THE_OP = """\
import torch
from deepspeed.accelerator import get_accelerator

get_accelerator().create_op_builder("ShareMemCommBuilder").load()
"""


@pytest.fixture(scope="module")
def deepspeed_op(tmp_path_factory: pytest.TempPathFactory) -> None:
    """DeepSpeed's CPU comm op, JIT-built once before the first DeepSpeed launch. Built inside a
    launch, it counted against the launch's timeout: on a loaded machine the first launch timed
    out mid-build, and the kill left torch's build lock file behind, for which every later
    DeepSpeed launch waited until its own timeout (each failed after 240 s). Here the build has
    a timeout of its own; the launches find the op built. The op is loaded here even when an
    earlier run built it (0.7 CPU-seconds forked, once per module; 2.2 as a fresh ``python -c``,
    which imported torch): that ``.so`` exists says nothing of whether it is current, and
    torch's load rebuilds a stale one (DeepSpeed's sources, torch or the build flags changed
    since) where it is loaded. A check of the file alone let that rebuild happen inside the
    first launch again; this load is the one that makes it, under the build's own timeout."""
    folder = os.environ.get("TORCH_EXTENSIONS_DIR") or str(extensions_dir())
    loader = tmp_path_factory.mktemp("deepspeed_op") / "load_op.py"
    loader.write_text(LOADS_THE_OP)
    environment = {**os.environ, "DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": folder}
    command = [sys.executable, str(loader)]
    result = run_in_own_group(command, cwd=None, timeout=BUILD_TIMEOUT, env=environment)
    assert result.returncode == 0, (
        f"building DeepSpeed's op failed (a lock file under {folder} that no build holds is "
        f"left by a killed one: remove it)\n{result.stdout}\n{result.stderr}"
    )


@pytest.fixture(autouse=True)
def _deepspeed_op_before_a_deepspeed_launch(request: pytest.FixtureRequest) -> None:
    """`deepspeed_op` for each test whose ``flags`` launch DeepSpeed."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and "deepspeed" in callspec.params.get("flags", ()):
        request.getfixturevalue("deepspeed_op")


def train(
    tmp_path: Path,
    name: str,
    *flags: str,
    args: tuple[str | Path, ...] = (),
    cpu: bool = True,
    processes: int = 2,
) -> dict:
    out = tmp_path / f"{name}.json"
    result = launch(
        SCRIPT, "--out", out, *args, cwd=tmp_path, flags=flags, cpu=cpu, processes=processes
    )
    assert_ok(result)
    return json.loads(out.read_text())


def max_difference(a: dict, b: dict) -> float:
    assert a["params"].keys() == b["params"].keys()
    return max(
        abs(x - y)
        for name in a["params"]
        for x, y in zip(a["params"][name], b["params"][name], strict=True)
    )


ENGINES = [
    pytest.param(("--backend", "ddp"), id="ddp"),
    pytest.param(FSDP, id="fsdp-blocks"),
    pytest.param(FSDP_BY_SIZE, id="fsdp-by-size"),
    *(pytest.param(ZERO[s], id=f"zero{s}", marks=needs_deepspeed) for s in (1, 2, 3)),
]
DDP = ENGINES[0].values[0]
#: Each engine with both optimizers and with and without accumulation, never clipped: clipping
#: (DeepSpeed clipped at 1.0 by default) hides any constant scale of the gradients.
UNCLIPPED = {
    "sgd": ("--optimizer", "sgd", "--max-grad-norm", "0", "--constant-lr", "--steps", "8"),
    "adam-accumulated": (
        *("--optimizer", "adam", "--max-grad-norm", "0", "--constant-lr", "--steps", "6"),
        *ACCUMULATE,
    ),
    "adamw": ("--optimizer", "adamw", "--max-grad-norm", "0", "--constant-lr", "--steps", "6"),
}
#: What each engine trains: the unclipped settings, and the script's defaults (6 steps clipped
#: at 0.5), which DDP's run makes the reference of clipping.
SETTINGS = {**UNCLIPPED, "clipped": ()}
#: The engines whose checkpoints a fresh launch resumes (test_resume_continues_exactly...).
RESUMED = {"fsdp": FSDP, "zero3": ZERO[3]}
#: Their launch also trains the defaults up to step 3 and saves there, after the settings
#: above (the runs before it are as in any other engine's launch), in the launch's folder.
SAVED_AT_3 = {"saved-at-3": ("--save-at", "3", "--checkpoint", "checkpoint")}


def train_each(
    folder: Path,
    settings: dict[str, tuple[str | Path, ...]],
    *flags: str,
    processes: int = 2,
    script: Path = SCRIPT,
) -> dict[str, dict]:
    """Every setting run in turn by one launch (the script's --runs), each with its own
    Accelerator: what one launch per setting would run, for one launch's start-up. The
    launch runs in ``folder``: a relative path in a setting is there."""
    runs = [
        [*map(str, args), "--out", str(folder / f"{name}.json")] for name, args in settings.items()
    ]
    plan = folder / f"runs{next(_PLANS)}.json"
    plan.write_text(json.dumps(runs))
    result = launch(script, "--runs", plan, cwd=folder, flags=flags, processes=processes)
    assert_ok(result)
    return {name: json.loads((folder / f"{name}.json").read_text()) for name in settings}


#: Numbers the plans `train_each` writes (two launches may share a folder)
_PLANS = itertools.count()


@pytest.fixture(scope="module")
def launched(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[tuple[str, ...]], tuple[Path, dict[str, dict]]]:
    """An engine's runs of SETTINGS (and SAVED_AT_3 for the RESUMED engines), launched once for
    all the tests that read them: the folder they were launched in, and each run's output."""
    done: dict[tuple[str, ...], tuple[Path, dict[str, dict]]] = {}

    def runs(flags: tuple[str, ...]) -> tuple[Path, dict[str, dict]]:
        if flags not in done:
            settings = {**SETTINGS, **SAVED_AT_3} if flags in RESUMED.values() else SETTINGS
            folder = tmp_path_factory.mktemp("engine")
            done[flags] = folder, train_each(folder, settings, *flags)
        return done[flags]

    return runs


@pytest.fixture(scope="module")
def trained(launched) -> Callable[[tuple[str, ...]], dict[str, dict]]:
    """An engine's runs, by setting name."""
    return lambda flags: launched(flags)[1]


@pytest.fixture(scope="module")
def reference(trained: Callable[[tuple[str, ...]], dict]) -> dict:
    """DDP, 6 steps, clipped."""
    return trained(DDP)["clipped"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The single-process runs every engine must reach: batch 8 on 1 process is batch 4 on 2."""
    settings = {name: (*args, "--batch-size", "8") for name, args in UNCLIPPED.items()}
    return train_each(tmp_path_factory.mktemp("one_process"), settings, processes=1)


@pytest.mark.parametrize("setting", list(UNCLIPPED))
@pytest.mark.parametrize("flags", ENGINES)
def test_each_engine_trains_like_one_process_without_clipping(flags, setting, one_process, trained):
    run = trained(flags)[setting]
    expected = one_process[setting]
    assert run["losses"][0] == pytest.approx(expected["losses"][0], abs=1e-6)
    assert max_difference(run, expected) < 1e-6
    assert run["losses"] == pytest.approx(expected["losses"], abs=1e-5)


@pytest.mark.parametrize("flags", ENGINES[1:])
def test_each_engine_clips_like_ddp(flags, reference, trained):
    run = trained(flags)["clipped"]
    assert max_difference(run, reference) < 1e-6
    assert run["losses"] == pytest.approx(reference["losses"], abs=1e-6)


def test_accumulation_with_activation_checkpointing_trains_like_one_process(one_process, tmp_path):
    flags = ("--fsdp-activation-checkpointing", *FSDP)
    run = train(tmp_path, "run", *flags, args=UNCLIPPED["adam-accumulated"])
    assert max_difference(run, one_process["adam-accumulated"]) < 1e-6


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param(("--backend", "ddp"), id="ddp"),
        pytest.param(FSDP, id="fsdp"),
        pytest.param(ZERO[3], id="zero3", marks=needs_deepspeed),
    ],
)
def test_bf16_trains_and_the_loss_decreases(flags, tmp_path):
    run = train(
        tmp_path,
        "bf16",
        "--mixed-precision",
        "bf16",
        *flags,
        args=("--steps", "12", "--lr", "0.02"),
    )
    losses = run["losses"]
    assert all(loss == loss for loss in losses)  # no NaN
    assert sum(losses[-4:]) < sum(losses[:4])


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param(RESUMED["fsdp"], id="fsdp"),
        pytest.param(RESUMED["zero3"], id="zero3", marks=needs_deepspeed),
    ],
)
def test_resume_continues_exactly_and_save_model_loads_into_a_plain_module(
    flags, reference, launched, tmp_path
):
    """The checkpoint is saved at step 3 by the engine's shared launch (SAVED_AT_3) and resumed
    here by a fresh launch, as a user resumes a run that stopped."""
    folder, runs = launched(flags)
    first, checkpoint = runs["saved-at-3"], folder / "checkpoint"
    assert first["losses"] == pytest.approx(reference["losses"][:3], abs=1e-6)
    saved = tmp_path / "saved"
    second = train(
        tmp_path,
        "second",
        *flags,
        args=("--steps", "3", "--resume", "--checkpoint", checkpoint, "--save-model", saved),
    )
    assert second["losses"] == pytest.approx(reference["losses"][3:], abs=1e-6)
    assert max_difference(second, reference) < 1e-6

    from safetensors.torch import load_file

    state = load_file(saved / "model.safetensors")
    plain = _build_model()
    plain.load_state_dict(state)  # strict: every key, no `module.` prefix
    for name, tensor in plain.state_dict().items():
        assert tensor.flatten().tolist() == pytest.approx(second["params"][name], abs=1e-7)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")
@pytest.mark.parametrize(
    ("flags", "own_group"),
    [
        pytest.param(FSDP, False, id="fsdp"),
        pytest.param(ZERO[3], False, id="zero3", marks=needs_deepspeed),
        pytest.param(DDP, True, id="ddp-own-group"),
    ],
)
def test_a_script_that_saves_at_its_end_frees_its_groups_before_finalization(
    flags, own_group, tmp_path
):
    """CI flake: rank 1 of the resume test above died of SIGABRT ("terminate called without an
    active exception") after its script ended. DTensor's caches (module globals) and the FSDP
    model, kept here as a module global, held the group past the exit guard, so it was freed
    during interpreter finalization while a gloo worker still dropped the last gather's tensors
    and asked for the GIL. DeepSpeed holds its groups the same way: in module globals
    (deepspeed.utils.groups, deepspeed.comm), its engine and optimizer, and each ZeRO-3
    parameter; its own gathers (the full state dict, every forward's parameter fetches) are
    collectives the runtime does not track. The gloo threads are joined at exit now, whatever
    holds the model; 50 all-gathers still queued as the script ends make the old abort likely,
    the thread count makes the cause certain. A script's own group (``dist.new_group`` in a
    module global, the queued gathers on it) lived to finalization the same way under DDP."""
    script = FIXTURES / "runtime" / "engine_exit.py"
    args = ("--save", tmp_path / "saved", "--global", "--queue", "50")
    args += ("--own-group",) if own_group else ()
    result = launch(script, *args, cwd=tmp_path, flags=flags)
    assert_ok(result)
    lines = [line for line in result.stdout.splitlines() if line.startswith("rank ")]
    said = dict(line.split(": ", 1) for line in lines)
    for rank in (0, 1):
        # the count while training shows the threads are found by name at all
        assert int(said[f"rank {rank} gloo threads while training"]) > 0
        assert said[f"rank {rank} gloo threads at exit"] == "[]"


def _build_model() -> torch.nn.Module:
    import importlib.machinery

    loader = importlib.machinery.SourceFileLoader("engines_fixture", str(SCRIPT))
    spec = importlib.util.spec_from_loader("engines_fixture", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module.build_model()


@pytest.fixture(scope="module")
def converted_under_ddp(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """fixtures/scripts/mnist_helpers.py converted, and its run under DDP (the default backend),
    launched once for every engine it is compared with."""
    original = FIXTURES / "scripts" / "mnist_helpers.py"
    folder = tmp_path_factory.mktemp("converted")
    converted = folder / "mnist_accelify.py"
    converted.write_bytes(convert_source(original.read_bytes(), original).converted)
    ddp = launch(converted, cwd=folder)
    assert_ok(ddp)
    return converted, ddp


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param(("--backend", "fsdp"), id="fsdp"),
        pytest.param(ZERO[2], id="zero2", marks=needs_deepspeed),
    ],
)
def test_a_converted_script_runs_unchanged(flags, converted_under_ddp, tmp_path):
    converted, ddp = converted_under_ddp
    run = launch(converted, cwd=tmp_path, flags=flags)
    assert_ok(run)
    # the same training, so the same report (accuracy counts are exact integers)
    accuracy = [line for line in ddp.stdout.splitlines() if "Accuracy" in line]
    assert accuracy and accuracy == [line for line in run.stdout.splitlines() if "Accuracy" in line]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--backend", "fsdp", "--mixed-precision", "fp16"), "fp16 needs CUDA GPUs"),
        (("--backend", "fsdp", "--zero-stage", "2"), "--zero-stage applies to --backend deepspeed"),
        (("--fsdp-cpu-offload",), "--fsdp-cpu-offload applies to --backend fsdp"),
        (("--backend", "fsdp", "--fsdp-cpu-offload"), "this run is on the CPU already"),
        (
            ("--backend", "fsdp", "--fsdp-activation-checkpointing"),
            "name them with --fsdp-auto-wrap",
        ),
    ],
)
def test_misconfigurations_exit_2_before_any_rank_starts(flags, message, tmp_path):
    result = run_accelify("launch", "--cpu", "-n", "2", *flags, SCRIPT, "--out", "x", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "x").exists()


@needs_deepspeed
@pytest.mark.parametrize(
    ("flags", "config", "message"),
    [
        (("--offload-optimizer",), None, "offloading to CPU memory needs a GPU run"),
        (("--zero-stage", "2", "--offload-params"), None, "--offload-params needs --zero-stage 3"),
        (("--zero-stage", "3"), {"zero_optimization": {"stage": 1}}, "make them agree"),
        ((), {"fp16": {"enabled": True}}, "fp16 needs CUDA GPUs"),
        ((), "{not json", "invalid JSON"),
    ],
)
def test_deepspeed_misconfigurations_exit_2(flags, config, message, tmp_path):
    extra: tuple[str, ...] = ()
    if config is not None:
        path = tmp_path / "ds.json"
        path.write_text(config if isinstance(config, str) else json.dumps(config))
        extra = ("--deepspeed-config", str(path))
    result = run_accelify(
        "launch",
        "--cpu",
        "-n",
        "2",
        "--backend",
        "deepspeed",
        *flags,
        *extra,
        SCRIPT,
        "--out",
        "x",
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert message in result.stderr


def test_deepspeed_missing_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setattr(deepspeed_options, "installed", lambda: False)
    result = CliRunner().invoke(
        main, ["launch", "--cpu", "-n", "2", "--backend", "deepspeed", str(SCRIPT)]
    )
    assert result.exit_code == 2
    assert "pip install 'accelify[deepspeed]'" in result.output


def test_import_accelify_does_not_import_deepspeed():
    code = "import sys\nfrom accelify import Accelerator\nprint('deepspeed' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout == "False\n"


@needs_gpu
@needs_deepspeed
def test_deepspeed_fp16_with_optimizer_offload_on_gpus(tmp_path):
    run = train(
        tmp_path,
        "fp16",
        "--mixed-precision",
        "fp16",
        *ZERO[2],
        "--offload-optimizer",
        args=("--steps", "12", "--lr", "0.02"),
        cpu=False,
    )
    assert sum(run["losses"][-4:]) < sum(run["losses"][:4])


@needs_gpu
def test_fsdp_bf16_with_cpu_offload_on_gpus_with_nccl(tmp_path):
    flags = ("--mixed-precision", "bf16", *FSDP, "--fsdp-cpu-offload")
    run = train(tmp_path, "gpu", *flags, args=("--steps", "12"), cpu=False)
    assert sum(run["losses"][-4:]) < sum(run["losses"][:4])


@pytest.mark.parametrize(
    ("flags", "refused", "script_flags"),
    [
        pytest.param(DDP, (), (), id="ddp"),
        pytest.param(("--backend", "fsdp"), ("own", "optimizer"), (), id="fsdp"),
        pytest.param(
            ("--backend", "fsdp", "--fsdp-keep-after-forward"),
            ("own", "optimizer"),
            ("--forward-before-load",),
            id="fsdp-unsharded-at-load",
        ),
        pytest.param(ZERO[2], ("optimizer",), (), id="zero2", marks=needs_deepspeed),
        pytest.param(ZERO[3], ("own", "optimizer"), (), id="zero3", marks=needs_deepspeed),
    ],
)
def test_a_model_saved_whole_loads_back_and_one_ranks_part_is_refused(
    flags, refused, script_flags, tmp_path
):
    """What a converted script does with its own checkpoint: `accelerator.save` of one rank's
    part (a model's own state dict under FSDP or ZeRO-3, an optimizer's under any sharding
    engine) fails on every rank, naming get_state_dict; `get_state_dict` saves the whole
    weights, and weights that differ from the trained ones load into the prepared model (spoiled
    first) and its last layer, and stay through a step with a learning rate of 0, on every
    engine: under FSDP each rank takes its own shard, also of a module a forward left unsharded
    (FSDP2's own load hook runs after ours there); under ZeRO-3 each writes its own partition
    (the module's parameters are empty there, and torch alone refused the whole tensors: a size
    mismatch), and the optimizer's fp32 master weights are refreshed after each load, the
    submodule's too (else the step copies the stale ones back)."""
    script = FIXTURES / "runtime" / "full_state_saves.py"
    out = ("--out", tmp_path / "found", *script_flags)
    assert_ok(launch(script, *out, cwd=tmp_path, flags=flags))
    ranks = [json.loads((tmp_path / f"found.rank{r}.json").read_text()) for r in (0, 1)]
    for found in ranks:
        for kind in ("own", "optimizer"):
            if kind in refused:
                assert "accelerator.get_state_dict(model)" in found[kind]
                assert "that rank's part only" in found[kind]
            else:
                assert found[kind] is None
    main = ranks[0]
    assert main["saved"] and main["saved"].keys() == _sequential_keys()
    assert all(found["load"] is None for found in ranks)
    for name, values in main["loaded"].items():
        assert values != pytest.approx(main["saved"][name], abs=1e-3)
        assert main["after"][name] == pytest.approx(values, abs=1e-7)


def _sequential_keys() -> set[str]:
    return {"0.weight", "0.bias", "2.weight", "2.bias"}


def test_a_converted_best_checkpoint_reload_tests_alike_under_ddp_and_fsdp(tmp_path):
    """A converted script that saves its best epoch's weights and reloads them for the test set
    (the golden fixtures/convert/best_checkpoint_reloaded_into_the_trained_model): under FSDP its
    own ``state_dict()`` held each rank's shard, the main process saved its own, and the reload
    put rank 0's rows everywhere (test 37/77 where DDP printed 70/77). With
    ``get_state_dict`` saved and the whole tensors loaded back, FSDP prints what DDP prints,
    line for line, and the test line is there."""
    script = FIXTURES / "convert" / "best_checkpoint_reloaded_into_the_trained_model" / "after.py"
    printed = {}
    for backend in ("ddp", "fsdp"):
        folder = tmp_path / backend
        folder.mkdir()
        run = launch(script, cwd=folder, flags=("--backend", backend))
        assert_ok(run)
        printed[backend] = [
            line for line in run.stdout.splitlines() if line.startswith(("epoch", "test"))
        ]
    assert printed["ddp"][-1].startswith("test ")
    assert printed["fsdp"] == printed["ddp"]


#: The engines a checkpoint dict with the optimizer's state resumes on, compared with DDP.
#: ZeRO-2 runs the same code as ZeRO-1 here: both steps go through DeepSpeed's
#: ``DeepSpeedZeroOptimizer`` (stage_1_and_2.py; stage 2 also partitions the gradients, which
#: the training tests above cover at ZeRO-2), and the runtime's state gathering and loading
#: (`ZeroOptimizerStates`) tells stages 1 and 2 apart nowhere: its cases are repeats of the
#: zero1 ones, run with --exhaustive.
OPTIMIZER_STATE_ENGINES = [
    pytest.param(("--backend", "fsdp"), id="fsdp"),
    pytest.param(ZERO[1], id="zero1", marks=needs_deepspeed),
    pytest.param(ZERO[2], id="zero2", marks=[needs_deepspeed, pytest.mark.exhaustive]),
    pytest.param(ZERO[3], id="zero3", marks=needs_deepspeed),
]
OPTIMIZER_STATE_SCRIPT = FIXTURES / "runtime" / "optimizer_state_saves.py"
#: The first launch of fixtures/runtime/optimizer_state_saves.py under each engine, its runs by
#: name: Adam's checkpoint saved, SGD's without momentum (``"state": {}``) saved, and the two
#: ``--reload`` runs
FIRST_RUNS: dict[str, tuple[str, ...]] = {
    "adam": ("--checkpoint", "adam.pt"),
    "sgd": ("--optimizer", "sgd", "--checkpoint", "sgd.pt"),
    "reload-fresh": ("--reload", "fresh"),
    "reload-partial": ("--reload", "partial"),
}


def resumed_runs(folder: Path, ddp_folder: Path) -> dict[str, tuple[str | Path, ...]]:
    """The second launch's runs: the engine's own checkpoints (in ``folder``) and DDP's
    resumed. The load before ``prepare`` goes first, into a process no Accelerator ran in yet."""
    return {
        "adam-before-prepare": (
            "--resume",
            "--checkpoint",
            folder / "adam.pt",
            "--load-before-prepare",
        ),
        "adam-after-prepare": ("--resume", "--checkpoint", folder / "adam.pt"),
        "adam-from-ddps-file": ("--resume", "--checkpoint", ddp_folder / "adam.pt"),
        "sgd-resumed": ("--resume", "--optimizer", "sgd", "--checkpoint", folder / "sgd.pt"),
        "sgd-two-groups": (
            *("--resume", "--optimizer", "sgd", "--groups", "2"),
            *("--checkpoint", ddp_folder / "sgd.pt"),
        ),
    }


@pytest.fixture(scope="module")
def optimizer_states(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[tuple[str, ...]], tuple[Path, dict[str, dict]]]:
    """fixtures/runtime/optimizer_state_saves.py under an engine, in two launches shared by the
    tests below: the first runs FIRST_RUNS in turn, the second, a fresh launch as a user
    resumes a run, `resumed_runs`. DDP's runs are the references, in one launch: its SGD
    file's load into two groups (torch's own ``ValueError``) follows its save there. Each run
    builds its own Accelerator, model and optimizer (the script's --runs), as a launch per run
    did, for a launch's start-up. The folder of the checkpoints, and each run's output by
    name."""
    done: dict[tuple[str, ...], tuple[Path, dict[str, dict]]] = {}

    def runs(flags: tuple[str, ...]) -> tuple[Path, dict[str, dict]]:
        if flags not in done:
            folder = tmp_path_factory.mktemp("optimizer_states")
            first = dict(FIRST_RUNS)
            if flags == DDP:
                first["sgd-two-groups"] = resumed_runs(folder, folder)["sgd-two-groups"]
            found = train_each(folder, first, *flags, script=OPTIMIZER_STATE_SCRIPT)
            if flags != DDP:
                second = resumed_runs(folder, runs(DDP)[0])
                found |= train_each(folder, second, *flags, script=OPTIMIZER_STATE_SCRIPT)
            done[flags] = folder, found
        return done[flags]

    return runs


@pytest.mark.parametrize("flags", OPTIMIZER_STATE_ENGINES)
def test_a_checkpoint_with_the_optimizers_whole_state_resumes_as_under_ddp(flags, optimizer_states):
    """``accelerator.save({"model": get_state_dict(model), "optimizer":
    get_state_dict(optimizer), ...})`` every rank reaches: under FSDP and ZeRO the optimizer's
    state is gathered whole, in torch's one-process format (parameters numbered, tensors of
    the parameters' shapes), the values DDP saves; a fresh launch loads it on every rank, after
    ``prepare`` (the prepared optimizer's ``load_state_dict``) or before it (into the plain
    optimizer, loaded again once the engine rebuilt it: refused before under FSDP), and
    trains the steps DDP trained after its save, loss for loss, with the saved learning rate.
    The checkpoint DDP wrote resumes there too: one format for every engine. Only the main
    process holds the gathered state (the others get ``{}``, as torch's ``full_state_dict`` with
    ``cpu_offload`` gives them: not a whole copy per rank), where under DDP each rank has its
    own optimizer's, gathered from nowhere."""
    ddp_folder, ddp_runs = optimizer_states(DDP)
    folder, runs = optimizer_states(flags)
    ddp, first = ddp_runs["adam"], runs["adam"]
    assert first["first"] == pytest.approx(ddp["first"], abs=1e-6)
    assert first["saved"] == ddp["saved"]
    assert [optimizer for _, optimizer in ddp["held"]] == [1, 1]
    assert [optimizer for _, optimizer in first["held"]] == [1, 0]
    ours = torch.load(folder / "adam.pt")["optimizer"]
    theirs = torch.load(ddp_folder / "adam.pt")["optimizer"]
    for number, entries in theirs["state"].items():
        for key, value in entries.items():
            assert torch.allclose(ours["state"][number][key], value, atol=1e-6), (number, key)
    for name in ("adam-after-prepare", "adam-before-prepare", "adam-from-ddps-file"):
        resumed = runs[name]
        assert resumed["next"] == pytest.approx(ddp["next"], abs=1e-6), name
        assert resumed["lr"] == ddp["lr"] == 0.01


@pytest.mark.parametrize("flags", OPTIMIZER_STATE_ENGINES)
def test_an_optimizer_state_without_per_parameter_entries_loads_the_groups_settings(
    flags, optimizer_states
):
    """SGD without momentum keeps no per-parameter state (``"state": {}``, as a save before
    the first step): loaded after ``prepare`` it still sets the saved learning rate, and the
    resumed steps are DDP's (under ZeRO the load returned before the groups, so the resume
    trained on at the first rate). Loaded into an optimizer of two groups, it raises torch's
    ``ValueError`` as under DDP (under ZeRO the groups were skipped without a word)."""
    _, ddp_runs = optimizer_states(DDP)
    _, runs = optimizer_states(flags)
    ddp, first = ddp_runs["sgd"], runs["sgd"]
    assert first["saved"] == ddp["saved"]
    assert first["saved"]["state"] == {} and first["saved"]["lr"] == [0.01]
    result = runs["sgd-resumed"]
    assert result["lr"] == ddp["lr"] == 0.01
    assert result["next"] == pytest.approx(ddp["next"], abs=1e-6)
    assert "different number of parameter groups" in ddp_runs["sgd-two-groups"]["load_error"]
    assert runs["sgd-two-groups"] == ddp_runs["sgd-two-groups"]


#: DeepSpeed's own wrapper at ZeRO stage 0 with mixed precision: ``FP16_UnfusedOptimizer``
ZERO_0_MIXED = ("--backend", "deepspeed", "--zero-stage", "0", "--mixed-precision", "bf16")


@needs_deepspeed
def test_zero_stage_0_with_mixed_precision_refuses_the_optimizers_whole_state(
    deepspeed_op, optimizer_states, tmp_path
):
    """At ZeRO stage 0 with bf16 DeepSpeed steps its own ``FP16_UnfusedOptimizer``, with no
    per-parameter fragments to assemble the state from: ``get_state_dict(optimizer)`` handed
    back DeepSpeed's format under torch's name, a load of torch's format failed inside
    DeepSpeed, and so did ``prepare`` after a load before it. Each now raises, on every rank,
    naming ``save_state``. (bf16 runs on the CPU; fp16's ``FP16_Optimizer`` is refused by the
    same test, anything but the user's optimizer or a wrapper with fragments, but needs a GPU.)"""
    ddp_folder, _ = optimizer_states(DDP)
    script = OPTIMIZER_STATE_SCRIPT
    refused = "keeps the optimizer's state in its own layout"
    saved = launch(script, "--out", "first.json", cwd=tmp_path, flags=ZERO_0_MIXED)
    assert saved.returncode != 0
    assert "accelerator.get_state_dict(optimizer) in torch's" in saved.stderr
    assert refused in saved.stderr and "accelerator.save_state(folder)" in saved.stderr
    assert not (tmp_path / "checkpoint.pt").exists()
    resume = ("--out", "resumed.json", "--resume", "--checkpoint", ddp_folder / "adam.pt")
    for where in ((), ("--load-before-prepare",)):
        loaded = launch(script, *resume, *where, cwd=tmp_path, flags=ZERO_0_MIXED)
        assert loaded.returncode != 0, where
        assert refused in loaded.stderr and "a load of the optimizer's whole state" in loaded.stderr


CONVERTED_RESUME = FIXTURES / "convert" / "checkpoint_with_optimizer_state_loaded_before_prepare"


def _epoch_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("epoch")]


@pytest.fixture(scope="module")
def four_epochs_under_ddp(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The converted golden's epoch lines, 4 epochs in one DDP launch."""
    folder = tmp_path_factory.mktemp("four_epochs")
    run = launch(CONVERTED_RESUME / "after.py", "--epochs", "4", cwd=folder, flags=DDP)
    assert_ok(run)
    return _epoch_lines(run)


# zero2 with --exhaustive only: the zero1 case runs the same code (OPTIMIZER_STATE_ENGINES)
@pytest.mark.parametrize("flags", [pytest.param(DDP, id="ddp"), *OPTIMIZER_STATE_ENGINES])
def test_a_converted_checkpoint_resumed_before_prepare_prints_what_one_run_prints(
    flags, four_epochs_under_ddp, tmp_path
):
    """The golden checkpoint_with_optimizer_state_loaded_before_prepare: a launch of 2 epochs
    saves model and optimizer each epoch, a launch of 4 loads them before ``prepare`` and
    trains epochs 2 and 3; together they print what one DDP launch of 4 epochs prints (the
    evaluation gathered, so exact counts), on every engine."""
    script = CONVERTED_RESUME / "after.py"
    first = launch(script, "--epochs", "2", cwd=tmp_path, flags=flags)
    assert_ok(first)
    second = launch(script, "--epochs", "4", cwd=tmp_path, flags=flags)
    assert_ok(second)
    assert "resumed at epoch 2" in second.stdout
    assert _epoch_lines(first) + _epoch_lines(second) == four_epochs_under_ddp
    assert len(four_epochs_under_ddp) == 4


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@needs_deepspeed
def test_a_bf16_deepspeed_models_whole_state_is_its_fp32_master_weights(
    stage, deepspeed_op, tmp_path
):
    """``get_state_dict(model)`` of a bf16 run gives the fp32 master weights at every ZeRO
    stage, the main process alone holding them: at stages 1 to 3 exactly what DeepSpeed's
    ``zero_to_fp32`` reads back from the engine's checkpoint (the state used to be read that
    way, through a checkpoint written to a temporary folder), at stage 0 (whose
    ``FP16_UnfusedOptimizer`` writes no ZeRO files: DeepSpeed's reader failed there with
    ``TypeError: 'NoneType' object is not iterable``) the wrapper's masters, the module's
    bf16 weights before rounding."""
    flags = ("--backend", "deepspeed", "--zero-stage", str(stage), "--mixed-precision", "bf16")
    script = FIXTURES / "runtime" / "fp32_masters.py"
    assert_ok(launch(script, "--out", "found.json", cwd=tmp_path, flags=flags))
    found = json.loads((tmp_path / "found.json").read_text())
    assert found["keys"] == sorted(_sequential_keys())
    assert found["dtypes"] == ["torch.float32"] and found["held"] == [4, 0]
    assert found["finer_than_bf16"] and found["from_bf16"] <= 2**-8  # |weights| < 1
    if stage > 0:
        assert found["reference_keys"] == found["keys"] and found["from_reference"] == 0.0


@needs_deepspeed
def test_zero3_gathers_the_whole_model_for_the_main_process_alone(deepspeed_op, tmp_path):
    """Under ZeRO-3 ``get_state_dict(model)`` gathered every parameter at once, and every rank
    copied the whole model to the CPU (each rank's peak grew by more than the model's size, for
    a state only the main process writes); one tensor is gathered at a time now, and only the
    main process copies it: the other rank's peak grows by less than half the model. Every
    allocation past 64 KiB is its own mapping (``MALLOC_MMAP_THRESHOLD_``), returned when
    freed: glibc otherwise keeps freed memory for reuse, and the peak measured what the heap
    happened to hold, not what the call held."""
    script = FIXTURES / "runtime" / "whole_state_memory.py"
    exact = {"MALLOC_MMAP_THRESHOLD_": "65536"}
    assert_ok(launch(script, "--out", "memory", cwd=tmp_path, flags=ZERO[3], env=exact))
    main, other = (json.loads((tmp_path / f"memory.rank{r}.json").read_text()) for r in (0, 1))
    assert main["entries"] == 16 and other["entries"] == 0
    assert main["peak_added_bytes"] >= main["model_bytes"]  # the copies it keeps
    assert other["peak_added_bytes"] < other["model_bytes"] / 2


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param(("--backend", "fsdp"), id="fsdp"),
        pytest.param(ZERO[3], id="zero3", marks=needs_deepspeed),
        pytest.param(
            (*ZERO[2], "--mixed-precision", "bf16"), id="zero2-bf16", marks=needs_deepspeed
        ),
    ],
)
def test_save_on_each_node_writes_the_whole_state_on_every_node(flags, tmp_path):
    """Two launchers on one host as two nodes of one process each (``--num-machines 2``): with
    ``save_on_each_node`` each node's local main process writes the checkpoint, and the second
    node's file held ``{}`` (the gathered state was kept by the global main process alone).
    Now every node's file holds the whole model and optimizer state, the same on both."""
    from concurrent.futures import ThreadPoolExecutor

    script = FIXTURES / "runtime" / "save_on_each_node.py"
    nodes = ("--num-machines", "2", "--main-process-ip", "127.0.0.1")
    port = ("--main-process-port", str(_free_port()))

    def node(rank: int) -> subprocess.CompletedProcess[str]:
        machine = (*nodes, *port, "--machine-rank", str(rank))
        return launch(script, cwd=tmp_path, flags=(*machine, *flags))

    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(node, (0, 1)))
    for run in runs:
        assert_ok(run)
    first, second = (torch.load(tmp_path / f"node{r}" / "checkpoint.pt") for r in (0, 1))
    assert first["model"].keys() == _sequential_keys()
    assert len(first["optimizer"]["state"]) == 4
    for part in ("model", "optimizer"):
        assert _equal(first[part], second[part]), part


def _equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize("flags", OPTIMIZER_STATE_ENGINES)
def test_a_state_loaded_after_some_steps_replaces_the_optimizers_own(flags, optimizer_states):
    """After four steps the optimizer's state from before its first step (``"state": {}``) is
    loaded: torch's load replaces the state, so the moments start afresh, and under ZeRO they
    were kept (the next losses differed from DDP's from the second step on). Every engine now
    trains DDP's next steps. A state with entries for some parameters only (torch starts the
    others afresh) loads under FSDP as under DDP; ZeRO, which keeps one state per group's flat
    partition, refuses it on every rank, naming save_state."""
    _, ddp = optimizer_states(DDP)
    _, runs = optimizer_states(flags)
    fresh = runs["reload-fresh"]
    assert fresh["first"] == pytest.approx(ddp["reload-fresh"]["first"], abs=1e-6)
    assert fresh["next"] == pytest.approx(ddp["reload-fresh"]["next"], abs=1e-6)
    partial = runs["reload-partial"]
    assert "load_error" not in ddp["reload-partial"]
    if "deepspeed" in flags:
        assert "holds entries for 3 of the 4 parameters of group 0" in partial["load_error"]
        assert "accelerator.save_state(folder)" in partial["load_error"]
    else:
        assert "load_error" not in partial
        assert partial["next"] == pytest.approx(ddp["reload-partial"]["next"], abs=1e-6)


@pytest.mark.parametrize("flags", [DDP, ("--backend", "fsdp")], ids=["ddp", "fsdp"])
def test_tied_weights_are_one_storage_under_both_keys_of_the_whole_state(flags):
    """FSDP's own ``state_dict()`` detaches each key anew, so tied weights were two objects,
    gathered twice and kept as two copies; read with ``keep_vars`` they are one, as DDP's
    state dict shares the storage."""
    run = launch(FIXTURES / "runtime" / "tied_weights_state.py", flags=flags)
    assert_ok(run)
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["keys"] == ["embed.weight", "head.weight", "hidden.bias", "hidden.weight"]
    assert report["one_storage"] and report["equal"] and not report["requires_grad"]
