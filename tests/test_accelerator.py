"""The Accelerator on one process: the API a converted script calls, with no launcher."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from accelify import Accelerator, set_seed
from accelify.runtime.data import PreparedDataLoader
from accelify.runtime.optimizer import PreparedOptimizer
from accelify.runtime.precision import PrecisionError
from accelify.runtime.scheduler import PreparedScheduler

DESIGN_API = [
    "device",
    "is_main_process",
    "is_local_main_process",
    "num_processes",
    "process_index",
    "local_process_index",
    "sync_gradients",
    "prepare",
    "backward",
    "accumulate",
    "no_sync",
    "autocast",
    "clip_grad_norm_",
    "clip_grad_value_",
    "gather",
    "gather_for_metrics",
    "reduce",
    "pad_across_processes",
    "wait_for_everyone",
    "main_process_first",
    "print",
    "save",
    "save_model",
    "save_state",
    "load_state",
    "unwrap_model",
    "get_state_dict",
    "skip_first_batches",
    "split_between_processes",
    "set_trigger",
    "check_trigger",
    "end_training",
    "register_for_checkpointing",
]


def parts(samples: int = 10, batch_size: int = 4):
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(
        TensorDataset(torch.randn(samples, 3), torch.randn(samples, 1)), batch_size=batch_size
    )
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    return model, optimizer, loader, scheduler


def test_every_name_of_the_design_is_there():
    accelerator = Accelerator()
    missing = [name for name in DESIGN_API if not hasattr(accelerator, name)]
    assert missing == []


def test_prepare_keeps_input_order_and_types():
    accelerator = Accelerator()
    model, optimizer, loader, scheduler = parts()
    prepared = accelerator.prepare(scheduler, loader, optimizer, model, "other")
    assert isinstance(prepared[0], PreparedScheduler)
    assert isinstance(prepared[1], PreparedDataLoader)
    assert isinstance(prepared[2], PreparedOptimizer)
    assert prepared[3] is model  # one process: no wrapper
    assert prepared[4] == "other"
    assert prepared[0].optimizers == [prepared[2]]
    assert isinstance(prepared[2], torch.optim.Optimizer)


class _EpochSeededSampler(torch.utils.data.Sampler):
    """A project's own sampler (a bucket sampler): its order is seeded by seed + epoch."""

    def __init__(self, size: int) -> None:
        self.size, self.epoch = size, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.epoch)
        return iter(torch.randperm(self.size, generator=generator).tolist())

    def __len__(self) -> int:
        return self.size


class _EpochDataset(TensorDataset):
    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


def test_each_pass_sets_the_users_sampler_epoch_as_hfs_loader_does():
    """HF's DataLoaderShard sets its pass count on the user's sampler each pass: the prepared
    loader's copy of a sampler seeded by seed + epoch must shuffle anew each epoch, as the
    script's own ``loader.sampler.set_epoch(epoch)`` made it do before prepare."""
    data = TensorDataset(torch.arange(16.0))
    plain = DataLoader(data, batch_size=4, sampler=_EpochSeededSampler(16))
    expected = []
    for epoch in range(3):
        plain.sampler.set_epoch(epoch)
        expected.append([batch[0].tolist() for batch in plain])
    loader = Accelerator().prepare(DataLoader(data, batch_size=4, sampler=_EpochSeededSampler(16)))
    seen = []
    for epoch in range(3):
        loader.sampler.set_epoch(epoch)  # the user's object (not the copy the loader reads)
        seen.append([batch[0].tolist() for batch in loader])
    assert seen == expected
    assert expected[0] != expected[1]
    loader.set_epoch(7)  # set by hand, as on HF: the next pass is pass 7
    assert loader.iteration == 7 and loader.batch_sampler.batch_sampler.sampler.epoch == 7


def test_a_data_sets_epoch_is_set_each_pass_when_its_sampler_has_none():
    data = _EpochDataset(torch.arange(8.0))
    loader = Accelerator().prepare(DataLoader(data, batch_size=4, shuffle=True))
    for epoch in range(2):
        list(loader)
        assert data.epoch == epoch


class _AllReducingSGD(torch.optim.SGD):
    """A script's optimizer whose step may communicate (as ZeroRedundancyOptimizer's does)."""


def test_a_torch_optimizers_step_under_ddp_is_not_tracked_and_any_other_is(monkeypatch):
    """Tracking pending work costs every step it wraps (bench/step_cost.py's "step" phase): a
    step DDP leaves local (torch.optim's own optimizers) is not tracked; a step that may
    communicate (another optimizer, an engine's) is, so a rank still waits at exit for its
    works to be freed."""
    from accelify.runtime import pending_work
    from accelify.runtime.backends.base import Backend
    from accelify.runtime.backends.ddp import DDPBackend

    tracked: list[bool] = []
    real = pending_work.tracked
    monkeypatch.setattr(pending_work, "tracked", lambda on: tracked.append(on) or real(on))
    accelerator = Accelerator(cpu=True)
    assert isinstance(accelerator.backend, DDPBackend)
    local = torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=0.1)
    other = _AllReducingSGD(nn.Linear(2, 1).parameters(), lr=0.1)
    local, other = accelerator.prepare(local, other)
    assert (local.tracks_step, other.tracks_step) == (False, True)
    local.step()
    assert tracked == []
    other.step()
    assert tracked == [False]  # tracked, when a group is up (none on one process)
    assert not Backend(accelerator.process).steps_locally(local.optimizer)  # an engine may


def test_a_backward_that_fails_still_ends_its_recorded_pass(tmp_path, monkeypatch):
    """Everything after the pass began is inside its ``try``: a backward that raises (a loss
    with no graph) leaves the record out of the backward, so the next pass is counted."""
    from accelify.runtime import collective_record

    recorder = collective_record._Recorder(tmp_path, 0, skip=())
    monkeypatch.setattr(collective_record, "_recorder", recorder)
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(nn.Linear(2, 1))
    with pytest.raises(RuntimeError, match="does not require grad"):
        accelerator.backward(torch.ones(()))
    assert (recorder.passes, recorder.in_backward) == (1, False)
    loss = model(torch.ones(1, 2)).sum()
    with torch.no_grad():  # the graph was built before: valid
        accelerator.backward(loss)
    assert (recorder.passes, recorder.in_backward) == (2, False)
    assert model.weight.grad is not None


def test_preparing_twice_changes_nothing():
    accelerator = Accelerator()
    model, optimizer, loader, _ = parts()
    first = accelerator.prepare(model, optimizer, loader)
    again = accelerator.prepare(*first)
    assert all(a is b for a, b in zip(first, again, strict=True))
    assert accelerator.prepare(optimizer) is first[1]
    assert len(accelerator._optimizers) == 1


def test_fp16_on_cpu_is_an_error_not_a_silent_fp32_run():
    with pytest.raises(PrecisionError, match=r"fp16.*needs a CUDA device"):
        Accelerator(mixed_precision="fp16", cpu=True)


class RecordsInnerDtype(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.seen = []

    def forward(self, x):
        out = self.linear(x)
        self.seen.append(out.dtype)
        return out


def test_bf16_runs_the_forward_in_bf16_and_returns_fp32():
    accelerator = Accelerator(mixed_precision="bf16", cpu=True)
    model = accelerator.prepare(RecordsInnerDtype())
    output = model(torch.randn(2, 4))
    assert model.seen == [torch.bfloat16]
    assert output.dtype == torch.float32
    with accelerator.autocast():
        assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.bfloat16
    plain = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    plain(torch.randn(2, 4))
    assert model.seen[-1] == torch.float32


def test_accumulate_syncs_every_k_steps_and_at_the_end_of_the_loader():
    accelerator = Accelerator(gradient_accumulation_steps=3)
    model, optimizer, loader, _ = parts(samples=20, batch_size=4)  # 5 batches
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    syncs = []
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            syncs.append(accelerator.sync_gradients)
            optimizer.step()
            optimizer.zero_grad()
    assert syncs == [False, False, True, False, True]


def test_backward_divides_by_the_accumulation_steps():
    accelerator = Accelerator(gradient_accumulation_steps=4)
    weight = torch.ones(1, requires_grad=True)
    accelerator.backward((weight * 8).sum())
    assert weight.grad.item() == 2.0


def test_one_cycle_schedule_is_never_stepped_past_its_end():
    accelerator = Accelerator()
    _, optimizer, _, _ = parts()
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=3)
    optimizer, scheduler = accelerator.prepare(optimizer, scheduler)
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    assert scheduler.last_epoch == 3


def test_per_epoch_schedule_steps_once_per_call_without_step_with_optimizer():
    accelerator = Accelerator(step_scheduler_with_optimizer=False, gradient_accumulation_steps=2)
    _, optimizer, _, scheduler = parts()
    optimizer, scheduler = accelerator.prepare(optimizer, scheduler)
    accelerator.gradient_state.advance()  # an accumulation step: the optimizer skips it
    assert not accelerator.sync_gradients
    optimizer.step()
    scheduler.step()
    assert scheduler.last_epoch == 1


def test_a_scheduler_warning_points_at_the_scripts_step_as_torchs_does():
    accelerator = Accelerator()
    _, optimizer, _, scheduler = parts()
    optimizer, scheduler = accelerator.prepare(optimizer, scheduler)
    with pytest.warns(UserWarning, match="before `optimizer.step\\(\\)`") as caught:
        line = sys._getframe().f_lineno + 1
        scheduler.step()
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, line)]


def test_gather_for_metrics_on_one_process_returns_the_batch():
    accelerator = Accelerator()
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(5)), batch_size=2))
    seen = [accelerator.gather_for_metrics(batch) for (batch,) in loader]
    assert torch.cat(seen).tolist() == [0, 1, 2, 3, 4]
    assert accelerator.gather_for_metrics(["a", "b"]) == ["a", "b"]
    # Python objects come back as they went in, as HF Accelerate returns them on one process: a
    # validation step's dict of numbers was a list of one dict, and `outputs["loss"]` raised.
    assert accelerator.gather_for_metrics({"loss": 0.5, "n": 4}) == {"loss": 0.5, "n": 4}
    assert accelerator.gather_for_metrics(("a", 1)) == ("a", 1)
    assert accelerator.gather_for_metrics(7, use_gather_object=True) == 7


def test_split_between_processes_on_one_process_is_everything():
    accelerator = Accelerator()
    with accelerator.split_between_processes([1, 2, 3]) as share:
        assert share == [1, 2, 3]


def test_trigger_is_seen_and_reset():
    accelerator = Accelerator()
    assert not accelerator.check_trigger()
    accelerator.set_trigger()
    assert accelerator.check_trigger()
    assert not accelerator.check_trigger()


def test_skip_first_batches_applies_to_the_next_pass_only():
    accelerator = Accelerator()
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(6)), batch_size=2))
    skipped = accelerator.skip_first_batches(loader, 2)
    assert [b.tolist() for (b,) in skipped] == [[4, 5]]
    assert [b.tolist() for (b,) in loader] == [[0, 1], [2, 3], [4, 5]]


def test_save_writes_atomically_and_leaves_no_temporary(tmp_path):
    accelerator = Accelerator()
    target = tmp_path / "sub" / "weights.pt"
    accelerator.save({"w": torch.ones(2)}, target)
    assert torch.load(target, weights_only=True)["w"].tolist() == [1.0, 1.0]
    assert [p.name for p in target.parent.iterdir()] == ["weights.pt"]


def test_save_writes_the_bytes_torch_save_writes(tmp_path):
    """torch.save names its archive's root folder after the file: a temporary file name would
    change the bytes (a script printing the checkpoint's size printed another number)."""
    state = {"w": torch.arange(4.0)}
    Accelerator().save(state, tmp_path / "ours" / "best.pt")
    (tmp_path / "plain").mkdir()
    torch.save(state, tmp_path / "plain" / "best.pt")
    assert (tmp_path / "ours" / "best.pt").read_bytes() == (
        tmp_path / "plain" / "best.pt"
    ).read_bytes()


def test_save_model_shards_and_loads_into_a_plain_module(tmp_path):
    from safetensors.torch import load_file

    accelerator = Accelerator()
    model = accelerator.prepare(nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64)))
    accelerator.save_model(model, tmp_path, max_shard_size="20KB")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[-1] == "model.safetensors.index.json"
    assert len(names) > 2
    state = {}
    for shard in tmp_path.glob("model-*.safetensors"):
        state.update(load_file(shard))
    fresh = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    fresh.load_state_dict(state)
    assert torch.equal(fresh[0].weight, model[0].weight)


def test_save_model_handles_tied_weights(tmp_path):
    from safetensors.torch import load_file

    accelerator = Accelerator()
    model = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 5, bias=False))
    model[1].weight = model[0].weight
    accelerator.save_model(accelerator.prepare(model), tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    assert torch.equal(state["0.weight"], state["1.weight"])


def test_register_for_checkpointing_needs_state_dict():
    with pytest.raises(TypeError, match="needs state_dict"):
        Accelerator().register_for_checkpointing(object())


def test_save_and_load_state_round_trip_on_one_process(tmp_path):
    set_seed(0)
    accelerator = Accelerator()
    model, optimizer, loader, scheduler = accelerator.prepare(*parts())
    for x, y in loader:
        accelerator.backward(nn.functional.mse_loss(model(x), y))
        optimizer.step()
        scheduler.step()
    accelerator.save_state(tmp_path / "ck")
    expected = [p.detach().clone() for p in model.parameters()]
    draw = torch.rand(3)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    accelerator.load_state(tmp_path / "ck")
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), expected, strict=True))
    assert torch.equal(torch.rand(3), draw)
    assert scheduler.last_epoch == 3


def test_load_state_of_a_missing_directory_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint directory"):
        Accelerator().load_state(tmp_path / "missing")


def test_option_groups_with_accelerates_names():
    from accelify.utils import DataLoaderConfiguration, GradientAccumulationPlugin

    accelerator = Accelerator(
        dataloader_config=DataLoaderConfiguration(even_batches=False, non_blocking=True),
        gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=3),
    )
    assert accelerator.gradient_accumulation_steps == 3
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(6.0)), batch_size=2))
    assert loader.even_batches is False and loader.non_blocking is True
    assert accelerator.distributed_type == "NO" and accelerator.native_amp is False
    with pytest.raises(ValueError, match="not both"):
        Accelerator(
            gradient_accumulation_steps=2,
            gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2),
        )
    with pytest.raises(NotImplementedError, match="sync_with_dataloader"):
        Accelerator(
            gradient_accumulation_plugin=GradientAccumulationPlugin(2, sync_with_dataloader=False)
        )
    with pytest.warns(UserWarning, match="data_seed has no effect"):
        Accelerator(dataloader_config=DataLoaderConfiguration(data_seed=3))


def test_process_decorators_and_free_memory():
    accelerator = Accelerator()
    calls = []

    @accelerator.on_process(process_index=0)
    def here():
        calls.append("here")

    @accelerator.on_process(process_index=1)
    def elsewhere():
        calls.append("elsewhere")

    @accelerator.on_last_process
    def last():
        calls.append("last")

    here(), elsewhere(), last()
    assert calls == ["here", "last"]  # one process: it is rank 0 and the last
    model = accelerator.prepare(nn.Linear(2, 2))
    model, other = accelerator.free_memory(model, object())
    assert model is None and other is None and accelerator._models == []


def test_find_executable_batch_size_halves_after_out_of_memory():
    from accelify.utils import find_executable_batch_size

    tried = []

    @find_executable_batch_size(starting_batch_size=32)
    def train(batch_size, scale):
        tried.append(batch_size)
        if batch_size > 8:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return batch_size * scale

    assert train(10) == 80 and tried == [32, 16, 8]
    with pytest.raises(TypeError, match="first argument"):
        train(16, 10)

    @find_executable_batch_size(starting_batch_size=4)
    def broken(batch_size):
        raise ValueError("not memory")

    with pytest.raises(ValueError, match="not memory"):
        broken()


def test_checkpoints_written_by_accelify_0_1_still_load(tmp_path):
    from safetensors.torch import load_file

    from accelify.runtime import rng

    accelerator = Accelerator()
    model = accelerator.prepare(nn.Linear(3, 2))
    accelerator.save_state(tmp_path / "ckpt")
    folder = tmp_path / "ckpt"
    torch.save(load_file(folder / "model.safetensors"), folder / "model.bin")
    (folder / "model.safetensors").unlink()
    torch.save(rng.capture(), folder / "random_states_0.bin")  # 0.1's RNG form
    (folder / "random_states_0.pkl").unlink()
    expected = torch.rand(3)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.zero_()
    accelerator.load_state(folder)
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    assert torch.equal(torch.rand(3), expected)  # the RNG went back to the saved state


def test_save_takes_a_file_object_as_hf_does(tmp_path):
    """HF's ``save`` hands ``f`` to ``torch.save``, which writes to an open file: scripts that
    pass one (``with open(path, "wb") as f: accelerator.save(state, f)``) must not break."""
    import io

    from safetensors.torch import load as safetensors_load

    accelerator = Accelerator()
    target = tmp_path / "weights.pt"
    with open(target, "wb") as handle:
        accelerator.save({"w": torch.ones(2)}, handle)
    assert torch.load(target, weights_only=True)["w"].tolist() == [1.0, 1.0]
    buffer = io.BytesIO()
    accelerator.save({"w": torch.zeros(3)}, buffer, safe_serialization=True)
    assert safetensors_load(buffer.getvalue())["w"].tolist() == [0.0, 0.0, 0.0]


def test_save_on_each_node_writes_on_the_local_main_process(tmp_path, monkeypatch):
    """With ``save_on_each_node`` HF writes on every node's local main process, not on the
    global main process alone (a node without the file cannot load it)."""
    from accelify.runtime.project import ProjectConfiguration

    accelerator = Accelerator(project_config=ProjectConfiguration(save_on_each_node=True))
    monkeypatch.setattr(type(accelerator), "is_main_process", property(lambda self: False))
    accelerator.save({"w": torch.ones(1)}, tmp_path / "node.pt")
    assert (tmp_path / "node.pt").exists()
    monkeypatch.setattr(type(accelerator), "is_local_main_process", property(lambda self: False))
    accelerator.save({"w": torch.ones(1)}, tmp_path / "other.pt")
    assert not (tmp_path / "other.pt").exists()


def test_reduce_applies_no_scale_as_hf_does_off_xla():
    """HF Accelerate multiplies by ``scale`` on XLA only: on GPUs and CPUs the value comes back
    unscaled, and a script must print the same number on either runtime."""
    accelerator = Accelerator()
    assert accelerator.reduce(torch.tensor([2.0]), "sum", scale=0.5).tolist() == [2.0]


def test_one_ranks_part_is_named_where_it_sits_in_what_is_saved():
    """`accelerator.save` on several ranks refuses what a sharding engine split (launched for
    real in test_engines); the search goes through dicts, lists and a module's parameters and
    names the entry, and a whole object passes."""
    from accelify.runtime.partial_saves import refuse_one_ranks_part

    part = torch.zeros(0)
    model = nn.Linear(2, 2)
    refuse_one_ranks_part({"model": model.state_dict(), "epoch": 3}, lambda t: t is part)
    with pytest.raises(RuntimeError, match=r"the entry \['ckpt'\]\[1\]\['w'\] is this rank's"):
        refuse_one_ranks_part({"ckpt": [1, {"w": part}]}, lambda t: t is part)
    with pytest.raises(RuntimeError, match=r"the module's bias .*get_state_dict\(model\)"):
        refuse_one_ranks_part(model, lambda t: t is model.bias)


#: Run in its own process: a DTensor needs a process group (torch's "fake" one: 2 ranks, no
#: communication), and the group is global to the process.
_PLACEMENTS_SCRIPT = """
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from accelify.runtime.partial_saves import refuse_one_ranks_part

dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
mesh = init_device_mesh("cpu", (2, 1))
for placements in [(Replicate(), Shard(0)), (Replicate(), Partial()), (Shard(0), Replicate()),
                   (Partial(), Shard(0))]:
    tensor = DTensor.from_local(torch.ones(4, 3), mesh, placements, run_check=False)
    try:
        refuse_one_ranks_part({"w": tensor}, lambda t: False)
        print("saved")
    except RuntimeError as error:
        print(str(error).split(";")[0])
dist.destroy_process_group()
"""


def test_a_dtensor_split_only_over_a_mesh_dimension_of_one_rank_is_whole():
    """A DTensor is one rank's part only when a mesh dimension of more than one rank shards it or
    holds partial sums: a shard over a dimension of size 1 (a 2x1 mesh) is the whole tensor, and
    a partial sum is named as one, not as a shard."""
    found = subprocess.run(
        [sys.executable, "-c", _PLACEMENTS_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.splitlines()
    assert found == [
        "saved",
        "saved",
        "accelerator.save: the entry ['w'] is a shard of a tensor split across 2 ranks (FSDP): "
        "shape (4, 3) of (8, 3)",
        "accelerator.save: the entry ['w'] is one rank's partial sum of a tensor summed across "
        "2 ranks: its values are not the tensor's",
    ]


def test_one_process_get_state_dict_of_an_optimizer_is_its_own_state_and_loads_back():
    """With no engine, ``get_state_dict(optimizer)`` is ``optimizer.state_dict()`` (the format
    every engine saves), and the prepared optimizer's ``load_state_dict`` takes it back."""
    accelerator = Accelerator()
    model = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward(model(torch.ones(4, 3)).sum())
    optimizer.step()
    saved = accelerator.get_state_dict(optimizer)
    assert saved["param_groups"][0]["params"] == [0, 1]
    assert torch.equal(
        saved["state"][0]["exp_avg"], optimizer.optimizer.state_dict()["state"][0]["exp_avg"]
    )
    fresh = torch.optim.Adam(nn.Linear(3, 2).parameters(), lr=0.5)
    fresh = accelerator.prepare(fresh)
    fresh.load_state_dict(saved)
    assert fresh.param_groups[0]["lr"] == 0.1
    assert torch.equal(
        fresh.state_dict()["state"][1]["exp_avg_sq"], saved["state"][1]["exp_avg_sq"]
    )


_OPTIMIZER_SHARDS_SCRIPT = """
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.testing._internal.distributed.fake_pg import FakeStore

from accelify.runtime.optimizer_states import shard_whole_state

dist.init_process_group("fake", rank=1, world_size=2, store=FakeStore())
mesh = init_device_mesh("cpu", (2,))
whole = torch.arange(12.0).reshape(4, 3)
param = torch.nn.Parameter(distribute_tensor(whole, mesh, [Shard(0)], src_data_rank=None))
plain = torch.nn.Parameter(torch.zeros(5))
optimizer = torch.optim.SGD([param, plain], lr=0.1, momentum=0.9)
state = {
    "state": {0: {"momentum_buffer": whole * 10}, 1: {"momentum_buffer": torch.ones(5)}},
    "param_groups": [{**optimizer.defaults, "params": [0, 1]}],
}
sharded = shard_whole_state(optimizer, state)
mine = sharded["state"][0]["momentum_buffer"]
print(type(mine).__name__, mine.to_local().tolist())
print(type(sharded["state"][1]["momentum_buffer"]).__name__)
optimizer.load_state_dict(sharded)
print(optimizer.state[param]["momentum_buffer"].to_local().tolist())
dist.destroy_process_group()
"""


def test_a_whole_optimizer_state_is_cut_to_this_ranks_shard_of_each_parameter():
    """Rank 1 of 2: the whole momentum of a parameter sharded by rows becomes rank 1's rows, as
    a DTensor laid out like the parameter (no communication: a fake process group); the state
    of a parameter that is not a DTensor stays as it is; the optimizer then loads it."""
    found = subprocess.run(
        [sys.executable, "-c", _OPTIMIZER_SHARDS_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.splitlines()
    rows = [[60.0, 70.0, 80.0], [90.0, 100.0, 110.0]]
    assert found == [f"DTensor {rows}", "Tensor", str(rows)]


def test_a_zero_load_plans_each_group_whole_or_afresh_and_refuses_what_one_flat_state_cannot_hold():
    """What a whole optimizer state's load writes into one group under DeepSpeed ZeRO (launched
    for real in test_engines): every parameter DeepSpeed steps with its entries, or None for a
    group the state holds nothing for (it starts afresh, as torch's load leaves it); a frozen
    parameter, which DeepSpeed leaves out, needs none. Entries for some parameters only, or
    steps that differ between them, do not fit one flat state per group: refused, naming
    save_state."""
    from accelify.runtime.optimizer_states import _planned

    a, b = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(3))
    frozen = nn.Parameter(torch.zeros(1), requires_grad=False)

    def entries(step: float) -> dict:
        return {"step": torch.tensor(step), "exp_avg": torch.ones(2)}

    both = {0: entries(4.0), 1: entries(4.0)}
    assert [p for p, _ in _planned(0, [a, b, frozen], [0, 1, 2], both)] == [a, b]
    assert _planned(0, [a, b], [0, 1], {}) is None
    with pytest.raises(
        RuntimeError, match=r"entries for 1 of the 2 parameters of group 3.*save_state"
    ):
        _planned(3, [a, b], [0, 1], {1: entries(4.0)})
    with pytest.raises(RuntimeError, match=r"different 'step' values .* \(4\.0 and 2\.0\)"):
        _planned(0, [a, b], [0, 1], {0: entries(4.0), 1: entries(2.0)})


def test_a_steps_recorded_backward_writes_its_state_place_and_counts_at_each_end(tmp_path):
    """`_Recorder.backward_begins`/`backward_ends` write the head in one pack each: what the
    launcher reads back is the state, the counts, and the place of the call that made the
    pass, also when two call sites take turns (the last place seen is asked first)."""
    from accelify.runtime import collective_record

    recorder = collective_record._Recorder(tmp_path, 0, skip=())

    def first_site() -> int:
        return recorder.backward_begins(True, sys._getframe(0))

    def second_site() -> int:
        return recorder.backward_begins(True, sys._getframe(0))

    places = []
    for number, site in enumerate([first_site, first_site, second_site, first_site, first_site]):
        begun = site()
        record = collective_record.read(tmp_path, 0)
        assert record is not None
        assert (record.state, record.sequence, record.passes) == (
            collective_record.IN_COLLECTIVE,
            number + 1,
            number + 1,
        )
        assert (record.operation, record.pid) == ("backward", os.getpid())
        places.append(record.line)
        recorder.backward_ends(begun)
        record = collective_record.read(tmp_path, 0)
        assert record is not None
        assert (record.state, record.sequence, record.passes) == (
            collective_record.RUNNING,
            number + 1,
            number + 1,
        )
        assert record.where.endswith(f":{places[-1]}")
    first, second = first_site.__code__.co_firstlineno + 1, second_site.__code__.co_firstlineno + 1
    assert places == [first, first, second, first, first]


def test_the_prepared_optimizers_zero_grad_keeps_set_to_none_either_way():
    """torch's own zero_grad is called without arguments (its default is True); False, or an
    optimizer of its own zero_grad, gets the keyword as it was given."""

    class OwnZeroGrad(torch.optim.SGD):
        def zero_grad(self, set_to_none: bool = False) -> None:
            calls.append(set_to_none)
            super().zero_grad(set_to_none=set_to_none)

    calls: list[bool] = []
    model = nn.Linear(2, 1)
    accelerator = Accelerator(cpu=True)
    torch_optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    own = accelerator.prepare(OwnZeroGrad(model.parameters(), lr=0.1))
    model(torch.ones(1, 2)).sum().backward()
    torch_optimizer.zero_grad(set_to_none=False)
    assert model.weight.grad is not None and not model.weight.grad.any()
    torch_optimizer.zero_grad()
    assert model.weight.grad is None
    own.zero_grad()
    own.zero_grad(set_to_none=False)
    assert calls == [True, False]


def test_a_zero_grad_replaced_on_the_optimizer_object_still_gets_set_to_none():
    """A zero_grad patched on the object (here after prepare) defaults to False: the prepared
    optimizer's ``zero_grad(set_to_none=True)`` must reach it as asked, not as its default."""
    model = nn.Linear(2, 1)
    accelerator = Accelerator(cpu=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    prepared = accelerator.prepare(optimizer)
    optimizer.zero_grad = functools.partial(optimizer.zero_grad, set_to_none=False)
    model(torch.ones(1, 2)).sum().backward()
    prepared.zero_grad(set_to_none=True)
    assert model.weight.grad is None
    model(torch.ones(1, 2)).sum().backward()
    prepared.zero_grad()
    assert model.weight.grad is None


@pytest.mark.parametrize("way", ["send_to_device", "placer"])
def test_a_cpu_batch_already_in_place_is_handed_back_as_it_is(way):
    """`send_to_device`, and the placer a prepared loader makes once a pass, alike."""
    from accelify.runtime.operations import placer, send_to_device

    cpu = torch.device("cpu")
    place = placer(cpu) if way == "placer" else lambda data: send_to_device(data, cpu)
    batch = [torch.ones(2), torch.zeros(2)]
    assert place(batch) is batch
    mapping = {"x": torch.ones(2)}
    assert place(mapping) is mapping
    tensor = torch.ones(2)
    assert place(tensor) is tensor
    mixed = (torch.ones(2), 3)
    moved = place(mixed)
    assert moved is not mixed and moved[0] is mixed[0] and moved[1] == 3
    nested = {"x": [torch.ones(2)]}
    assert place(nested) == nested and place(nested)["x"][0] is nested["x"][0]
    meta = [torch.empty(2, device="meta")]  # not on the CPU: moved (torch refuses meta data)
    with pytest.raises(NotImplementedError):
        place(meta)
    with pytest.raises(NotImplementedError):
        place(torch.empty(2, device="meta"))


def _zipped_orders(prepare: bool) -> list[list[int]]:
    """Two shuffled loaders read together by zip(), as a multi-task script reads them."""
    torch.manual_seed(3)
    loaders = [
        DataLoader(TensorDataset(torch.arange(n)), batch_size=4, shuffle=True) for n in (8, 12)
    ]
    if prepare:
        loaders = list(Accelerator().prepare(*loaders))
    orders: list[list[int]] = [[], []]
    for _ in range(2):
        for batches in zip(*loaders, strict=False):  # the shorter one ends the pass
            for order, (batch,) in zip(orders, batches, strict=True):
                order.extend(batch.tolist())
    return orders


def test_zipped_prepared_loaders_shuffle_as_the_unprepared_ones():
    """zip() calls iter() on both loaders before the first batch of either: torch draws each
    DataLoader iterator's base seed at iter() and each sampler's seed at its first batch, so a
    prepared loader must start its inner pass at iter() too, or one process shuffles otherwise
    than the script (a multi-task script's 1-process run printed other accuracies)."""
    assert _zipped_orders(prepare=True) == _zipped_orders(prepare=False)
