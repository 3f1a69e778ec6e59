"""The configuration objects scripts build before anything runs: tracker names, project
checkpoint naming and pruning, kwargs handlers."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from accelify.runtime import project, tracking
from accelify.runtime.kwargs_handlers import (
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    of_type,
)


def test_tracker_names_are_checked_when_the_accelerator_is_built():
    assert tracking.requested(None) == []
    assert tracking.requested(["tensorboard", tracking.LoggerType.TENSORBOARD]) == ["tensorboard"]
    custom = tracking.GeneralTracker()
    assert tracking.requested([custom]) == [custom]
    with pytest.raises(ValueError, match="GeneralTracker"):
        tracking.requested("comet_ml")  # a tracker Accelerate knows and accelify does not drive
    with pytest.raises(ValueError, match="not a tracker"):
        tracking.requested("tensorbored")


def test_a_file_writing_tracker_needs_a_logging_directory():
    with pytest.raises(ValueError, match="project_dir"):
        tracking.start(["tensorboard"], "run", None, {})


def test_numbered_checkpoints_count_on_and_keep_the_newest(tmp_path: Path):
    config = project.ProjectConfiguration(
        project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=2
    )
    written = []
    for _ in range(4):
        target = project.checkpoint_to_write(config, "ignored", is_main_process=True)
        target.mkdir(parents=True)
        written.append(target.name)
    assert written == ["checkpoint_0", "checkpoint_1", "checkpoint_2", "checkpoint_3"]
    remaining = [p.name for p in project.numbered_checkpoints(tmp_path / "checkpoints")]
    assert remaining == ["checkpoint_2", "checkpoint_3"]
    resumed = project.ProjectConfiguration(project_dir=str(tmp_path))
    assert project.latest_checkpoint(resumed).name == "checkpoint_3"
    assert resumed.iteration == 4


def test_an_explicit_directory_wins_without_automatic_naming(tmp_path: Path):
    config = project.ProjectConfiguration(project_dir=str(tmp_path))
    assert project.checkpoint_to_write(config, tmp_path / "mine", True) == tmp_path / "mine"
    with pytest.raises(ValueError, match="output_dir"):
        project.checkpoint_to_write(project.ProjectConfiguration(), None, True)
    with pytest.raises(ValueError, match="total_limit"):
        project.ProjectConfiguration(total_limit=0)


def test_kwargs_handlers_pass_only_what_was_changed():
    handlers = [
        DistributedDataParallelKwargs(find_unused_parameters=True),
        GradScalerKwargs(init_scale=1024),
        InitProcessGroupKwargs(timeout=timedelta(seconds=60)),
    ]
    assert of_type(handlers, DistributedDataParallelKwargs) == {"find_unused_parameters": True}
    assert of_type(handlers, GradScalerKwargs) == {"init_scale": 1024}
    assert of_type(handlers, InitProcessGroupKwargs) == {"timeout": timedelta(seconds=60)}
    assert of_type(None, GradScalerKwargs) == {}
    with pytest.raises(ValueError, match="2 GradScalerKwargs"):
        of_type([GradScalerKwargs(), GradScalerKwargs()], GradScalerKwargs)
    with pytest.raises(TypeError, match="not one accelify reads"):
        of_type([object()], GradScalerKwargs)


def test_ddp_kwargs_take_hfs_communication_hook_names_as_enums_or_strings():
    from accelify import DDPCommunicationHookType, DistributedDataParallelKwargs

    kwargs = DistributedDataParallelKwargs(comm_hook="power_sgd", comm_wrapper="fp16")
    assert kwargs.comm_hook is DDPCommunicationHookType.POWER_SGD
    assert kwargs.to_kwargs() == {
        "comm_hook": DDPCommunicationHookType.POWER_SGD,
        "comm_wrapper": DDPCommunicationHookType.FP16,
    }
    assert DistributedDataParallelKwargs().to_kwargs() == {}
    with pytest.raises(ValueError, match="compresses to fp16 or bf16"):
        DistributedDataParallelKwargs(comm_wrapper=DDPCommunicationHookType.POWER_SGD)
