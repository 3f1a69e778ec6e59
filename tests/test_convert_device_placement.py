"""Converted CPU-only scripts keep every tensor that meets the model on the model's device.

On the CPU a tensor the conversion forgot to move (a target built each step from torch
factories, a ``zeros_like`` of a host tensor) meets the prepared model's output without a
complaint: the runnable cases pass, and the user's first run on a GPU fails at its first step.
Here the converted script runs with ``accelerator.device`` set to the ``meta`` device: a tensor
left on the CPU that meets one on the device raises as it would on a GPU ("Tensor on device
cpu is not on the expected device meta!"). Meta tensors hold no data: ``.item()`` of one reads
1 and a copy of one to the CPU (``send_to_device(out, "cpu")``, ``.cpu()``) is zeros of its
shape (ones for integers: lengths handed back to ``pack_padded_sequence`` must be positive), so
the run goes on past the first logged loss and the first output sent back, to a second model
trained after the first (finetune) and to the evaluation after training. It
stops at a read these cannot stand in for (``.tolist()``, a format of a meta tensor) or ends.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES

#: Runs ``sys.argv[1]`` as ``__main__`` with the runtime's device picked as ``meta``; reads of
#: a meta tensor's value and its copies to the CPU stand in for what a GPU would give.
_ON_META = """
import runpy, sys, torch
import accelify.runtime.state as state
state._pick_device = lambda cpu, local_rank: torch.device("meta")
_item, _to, _cpu = torch.Tensor.item, torch.Tensor.to, torch.Tensor.cpu

def read(tensor):
    if tensor.device.type != "meta":
        return _item(tensor)
    return True if tensor.dtype == torch.bool else 1.0 if tensor.is_floating_point() else 1

def host(tensor):
    fill = torch.zeros if tensor.is_floating_point() else torch.ones
    copy = fill(tensor.shape, dtype=tensor.dtype)
    return copy.requires_grad_(tensor.requires_grad and tensor.is_floating_point())

def to(tensor, *args, **kwargs):
    target = kwargs.get("device", args[0] if args else None)
    to_cpu = isinstance(target, (str, torch.device)) and str(target) == "cpu"
    return host(tensor) if tensor.device.type == "meta" and to_cpu else _to(tensor, *args, **kwargs)

def cpu(tensor, *args, **kwargs):
    return host(tensor) if tensor.device.type == "meta" else _cpu(tensor, *args, **kwargs)

torch.Tensor.item, torch.Tensor.to, torch.Tensor.cpu = read, to, cpu
try:
    runpy.run_path(sys.argv[1], run_name="__main__")
except Exception as error:
    print("STOPPED", type(error).__name__, error)
else:
    print("FINISHED")
"""

#: Wording of torch's errors for tensors on two devices in one operation, or on the device
#: where the host is required (pack_padded_sequence's lengths).
_MIXED = (
    "is not on the expected device",
    "Expected all tensors to be on the same device",
    "argument should be a 1D CPU int64 tensor",
)

CASES = [
    "loop_targets_joined_from_factories_moved_to_the_device",
    "trainer_step_targets_from_factories_moved_to_the_device",
    "gan_trainer_step_run_per_batch_cpu_only",
    "gan_trainer_makes_tensors_in_the_loop",
    "cpu_only_tensors_made_before_the_loop_meet_the_batch",
    "noise_named_then_added_to_the_batch",
    "noise_applied_to_each_batch_beside_noise_a_generator_reads",
    "fixed_sample_and_a_host_draw_fed_to_a_generator_the_conversion_moves",
    "training_step_of_a_model_class_runs_as_the_wrappers_forward",
    "ema_copy_made_by_a_method_the_trainer_constructor_calls",
    "evaluation_through_map",
    "evaluation_through_map_of_unpacked_batches",
    "evaluation_through_a_partial_alias",
    "evaluation_through_partial_and_lambda",
    "finetune_after_training_the_same_model",
    "loaders_dict_received_by_fit",
    "loaders_passed_in_a_loop",
    "loaders_dict_of_dicts_left_whole",
    "experiment_sweep_returns_the_model",
    "loaders_from_a_returned_tuple_read_first_by_len",
    "shared_loop_over_loader_and_optimizer_pairs",
    "shared_loop_over_a_zip_of_names_and_loaders_sends_every_batch_to_the_device",
    "pack_padded_sequence_lengths_from_a_prepared_loader_back_on_the_cpu",
    "dataclass_state_model_called_on_a_whole_loaders_batches_sends_them_to_the_device",
    "helper_parameter_spelled_like_the_prepared_loader_reads_the_whole_loader_its_caller_hands",
    "train_or_evaluate_by_optimizer",
    "hidden_state_made_in_forward_is_made_where_the_parameters_are",
    "kept_dict_of_prepared_loaders_read_by_key_in_a_method",
]


@pytest.mark.parametrize("case", CASES)
def test_no_tensor_is_left_on_the_cpu_beside_the_device(case: str, tmp_path: Path):
    script = tmp_path / "after.py"
    shutil.copy(FIXTURES / "convert" / case / "after.py", script)
    run = subprocess.run(
        [sys.executable, "-c", _ON_META, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = run.stdout + run.stderr
    assert not any(text in output for text in _MIXED), output
    # it ran to the end, or to a read of a value the stand-ins do not cover
    assert "FINISHED" in output or ("STOPPED" in output and "meta" in output), output
