"""The run-side commands of `accelify`: launch, verify, config and env. They need torch when
they run (each says how to install it when it is missing), never when they are imported."""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from accelify.errors import UserError, fail
from accelify.requirements import require_runtime
from accelify.runtime.launch import hf_flags
from accelify.runtime.launch.config import RDZV_BACKENDS
from accelify.runtime.options import launch_flags


class _LaunchCommand(click.Command):
    """`accelify launch`: reads HF's `accelerate launch` command lines as written (see
    `accelify.runtime.launch.hf_flags`), and groups its help as HF does."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        takes_value = {
            spelling: not (param.is_flag or param.count)
            for param in self.params
            if isinstance(param, click.Option)
            for spelling in (*param.opts, *param.secondary_opts)
        }
        try:
            args = hf_flags.rewrite(args, takes_value)
        except UserError as error:
            fail(error)
        return super().parse_args(ctx, args)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        records: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
            if record is not None:
                group = hf_flags.GROUP_OF.get(param.name or "", "Options")
                records.setdefault(group, []).append(record)
        for group, rows in hf_flags.help_sections(records):
            with formatter.section(group):
                formatter.write_dl(rows)


@click.command(cls=_LaunchCommand, context_settings={"allow_interspersed_args": False})
@click.option(
    "-n",
    "--num-processes",
    "--num_processes",
    type=click.IntRange(min=1),
    help="Processes in all, over every machine, as in HF Accelerate (default: the config file, "
    "else one per GPU of each machine, else 1 per machine).",
)
@click.option(
    "--nproc-per-node",
    "--nproc_per_node",
    type=click.IntRange(min=1),
    help="torchrun's spelling: processes on each machine (-n counts them over all machines).",
)
@click.option(
    "--num-machines",
    "--num_machines",
    type=click.IntRange(min=1),
    help="Machines taking part (default 1).",
)
@click.option(
    "--machine-rank",
    "--machine_rank",
    type=click.IntRange(min=0),
    help="This machine's index, 0 on the machine that hosts the rendezvous.",
)
@click.option("--main-process-ip", "--main_process_ip", help="Address of machine 0.")
@click.option(
    "--main-process-port",
    "--main_process_port",
    type=click.IntRange(0, 65535),
    help="Port on machine 0 (default, or 0: a free port when on one machine).",
)
@click.option(
    "--num-cpu-threads-per-process",
    "--num_cpu_threads_per_process",
    type=click.IntRange(min=1),
    help="OMP_NUM_THREADS of each rank (default: on the CPU, the cores shared out).",
)
@click.option(
    "--mixed-precision",
    "--mixed_precision",
    type=click.Choice(["no", "bf16", "fp16", "fp8"]),
    help="Precision for Accelerator(mixed_precision=None).",
)
@click.option(
    "--gradient-accumulation-steps",
    "--gradient_accumulation_steps",
    type=click.IntRange(min=1),
    help="Accumulation for Accelerator() left at default.",
)
@click.option(
    "--cpu",
    "--use-cpu",
    "--use_cpu",
    "use_cpu",
    is_flag=True,
    default=None,
    help="Run on the CPU (gloo) even where GPUs are present.",
)
@click.option(
    "--backend",
    type=click.Choice(["ddp", "fsdp", "deepspeed"]),
    help="The engine that wraps models: PyTorch DDP, PyTorch FSDP2 or DeepSpeed ZeRO.",
)
@launch_flags
@click.option(
    "--max-restarts",
    "--max_restarts",
    type=click.IntRange(min=0),
    help="Restart the whole group this many times when a rank fails.",
)
@click.option(
    "--gpu-ids",
    "--gpu_ids",
    metavar="IDS",
    help="GPUs of this machine to run on, comma-separated (CUDA_VISIBLE_DEVICES of the ranks; "
    "default: all); the processes default to one per id.",
)
@click.option(
    "--rdzv-backend",
    "--rdzv_backend",
    type=click.Choice(RDZV_BACKENDS),
    help="torchrun's rendezvous: static (default: fixed machine ranks) or a dynamic one, found "
    "at --main-process-ip:--main-process-port.",
)
@click.option("--rdzv-conf", "--rdzv_conf", help="torchrun's rendezvous settings: key=value,...")
@click.option(
    "--monitor-interval",
    "--monitor_interval",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="How often torchrun's agent checks the ranks (default 0.1).",
)
@click.option(
    "-t",
    "--tee",
    help="Also copy the ranks' output to files under --log-dir: 0 none, 1 stdout, 2 stderr, 3 "
    "both, or per local rank (0:3,1:1).",
)
@click.option(
    "--log-dir",
    "--log_dir",
    type=click.Path(file_okay=False),
    help="Directory for torchrun's per-rank logs.",
)
@click.option("--role", help="Name of the ranks' role in torchrun's logs (default: default).")
@click.option(
    "--hang-timeout",
    "--hang_timeout",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="Seconds a rank may wait in a collective that a peer has not reached before the run "
    "is stopped with every rank's place and the stragglers' stacks (default 300; 0: off).",
)
@click.option(
    "--config-file",
    "--config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="YAML config (default: ~/.config/accelify/config.yaml when it exists).",
)
@click.option("-m", "--module", is_flag=True, help="SCRIPT is a module name, as in `python -m`.")
@click.option(
    "--no-python",
    "--no_python",
    is_flag=True,
    help="SCRIPT is an executable, run without python (as torchrun's --no-python). Its own "
    "children are not stopped when the launcher is killed by SIGKILL: a shell script should "
    "`exec` its last command.",
)
@click.option(
    "--debug",
    is_flag=True,
    default=None,
    help="HF's debug mode in every rank: collectives first check that all ranks pass tensors "
    "of the same shapes (ACCELIFY_DEBUG_MODE).",
)
@hf_flags.click_options
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def launch(
    config_file: Path | None,
    module: bool,
    no_python: bool,
    script: str,
    script_args: tuple[str, ...],
    **flags: Any,
) -> None:
    """Run SCRIPT on N processes (torchrun's elastic agent; gloo on CPU, nccl on GPU).

    Options go before SCRIPT; everything after it is the script's. Flags win over the config
    file. Settings reach the script's Accelerator as ACCELIFY_* environment variables, so the
    same script also runs under plain torchrun. When a rank fails, the report names the rank
    that failed first and ends with its traceback; Ctrl-C stops every rank (exit 130).

    Each rank is forked from one process per machine that imported torch once, instead of
    importing it itself (about 2.5 CPU-seconds a rank); a rank starts fresh wherever a fork
    could differ (a script, or a -m module and its packages, that runs a statement before its
    `import torch`, --no-python, per-rank CUDA_VISIBLE_DEVICES or OMP_NUM_THREADS).
    ACCELIFY_FRESH_RANKS=1 starts every rank fresh.

    \b
    Examples:
      accelify launch --cpu -n 2 train.py --epochs 3
      accelify launch -n 8 --backend fsdp --fsdp-auto-wrap DecoderLayer train.py
      accelify launch -n 8 --backend deepspeed --zero-stage 3 train.py
      accelify launch --config-file cluster.yaml -m mypkg.train
    """
    try:
        from accelify.runtime.launch.config import LaunchConfig, default_config_path, load_config
        from accelify.runtime.launch.launcher import LaunchPlan, merge
        from accelify.runtime.launch.launcher import launch as run_plan

        flags = hf_flags.resolve(flags)
        require_runtime("accelify launch")
        path = config_file or default_config_path()
        if config_file is not None and not config_file.exists():
            raise UserError("config file not found", str(config_file))
        file_config = load_config(path) if path.exists() else LaunchConfig()
        config = merge(file_config, flags, os.environ)
        plan = LaunchPlan(config, script, script_args, module, no_python)
        code = run_plan(plan)
    except UserError as error:
        fail(error)
    except KeyboardInterrupt:  # Ctrl-C before any rank started (the template starting)
        click.echo("accelify launch: stopped by SIGINT before any rank started", err=True)
        sys.exit(130)
    _end_the_launcher(code)


def _end_the_launcher(code: int) -> NoReturn:
    """The run is over, reported, and every rank has exited: end the launcher's process without
    Python's finalization. Its last full collection of the heap and the teardown of torch's
    modules free nothing that matters and took 0.5 s between the report and the exit on a
    loaded machine (5-7 s before the collection was skipped). The atexit handlers (the agent's,
    logging's) and the streams' flush still run. Inside another program (a test's CliRunner,
    whose ``__main__`` is not ours) the process is not ours to end: ``sys.exit``."""
    gc.freeze()
    # ``atexit._run_exitfuncs`` is CPython's (and PyPy's), not the documented API: an
    # interpreter without it ends the usual way
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if (
        run_exit_handlers is None
        or getattr(sys.modules.get("__main__"), "main", None) is not _cli_main()
    ):
        sys.exit(code)
    run_exit_handlers()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed stream, or a reader gone
            stream.flush()
    os._exit(code)


def _cli_main() -> object:
    cli = sys.modules.get("accelify.cli")
    return getattr(cli, "main", None)


class _ScriptArgsCommand(click.Command):
    """Everything after ``--`` goes to the scripts untouched (click would mix it into the
    positional arguments, where it could not be told from CONVERTED.py)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta["script_args"] = tuple(args[cut + 1 :])
            args = args[:cut]
        return super().parse_args(ctx, args)


@click.command(cls=_ScriptArgsCommand)
@click.argument("original", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument(
    "converted", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="Optimizer steps to compare.",
)
@click.option(
    "--to-end",
    is_flag=True,
    help="Run both scripts to their end instead: also compare every printed line, and check "
    "that evaluation loops gather what they compute.",
)
@click.option(
    "-n",
    "--num-processes",
    type=click.IntRange(min=2),
    default=2,
    show_default=True,
    help="Ranks for check 2.",
)
@click.option(
    "--atol",
    type=click.FloatRange(min=0),
    help="Tolerance for losses and parameters [default: exact; 1e-2 when the conversion "
    "added mixed precision].",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=300,
    show_default=True,
    help="Seconds each run may take; a run still going is reported as a hang.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def verify(
    ctx: click.Context,
    original: Path,
    converted: Path | None,
    steps: int,
    to_end: bool,
    num_processes: int,
    atol: float | None,
    timeout: float,
    as_json: bool,
) -> None:
    """Show that a conversion trains like the original: ORIGINAL.py and CONVERTED.py (default:
    ORIGINAL.py converted in memory, nothing written) run side by side for a few optimizer
    steps.

    Check 1 runs both on one process: losses and parameters must match step by step. Check 2
    runs the conversion on N ranks: parameters identical on every rank, losses finite and
    different per rank (the data is sharded), and the run ends on every rank. Each script runs
    unmodified, in a fresh process and a scratch directory, seeded the same. Arguments after
    `--` go to both scripts. Exit 0 when both checks pass, 1 when one fails, 2 when a script
    cannot run at all. With --to-end both run to completion: check 1 then also compares every
    printed line, and check 2 fails an evaluation loop that computes from its rank's shard
    without gathering.

    \b
    Examples:
      accelify verify train.py
      accelify verify train.py --to-end
      accelify verify train.py train_accelify.py --steps 10 -- --epochs 1
    """
    from accelify.verify.cli import run_verify

    try:
        require_runtime("accelify verify")
        code = run_verify(
            original,
            converted,
            steps=0 if to_end else steps,
            processes=num_processes,
            atol=atol,
            timeout=timeout,
            as_json=as_json,
            script_args=ctx.meta.get("script_args", ()),
        )
    except UserError as error:
        fail(error)
    sys.exit(code)


@click.command()
@click.option(
    "--default",
    "use_defaults",
    is_flag=True,
    help="Detect the hardware and write a config without asking.",
)
@click.option(
    "--config-file",
    "--config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write (default: ~/.config/accelify/config.yaml).",
)
def config(use_defaults: bool, config_file: Path | None) -> None:
    """Write the config file `accelify launch` reads (asks questions unless --default)."""
    from accelify.runtime.launch.config import default_config_path, write_config
    from accelify.runtime.launch.config_questions import ask, detect

    path = config_file or default_config_path()
    if use_defaults:
        try:
            require_runtime("accelify config --default (it looks for GPUs through torch)")
        except UserError as error:
            fail(error)
    settings = detect() if use_defaults else ask()
    write_config(settings, path)
    click.echo(f"accelify config written to {path}")


@click.command()
def env() -> None:
    """Print versions, devices and the launch config: the block to paste into a bug report."""
    from accelify.runtime.launch.report import environment_report

    click.echo(environment_report())
