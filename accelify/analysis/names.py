"""What the analysis recognises, by fully qualified name (aliases resolved by libcst)."""

from __future__ import annotations

import re

DATALOADERS = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
#: ``transformers.AdamW``/``Adafactor`` are re-exports of ``transformers.optimization`` (and
#: would otherwise match the ``transformers.`` model prefix: an optimizer taken for a model).
OPTIMIZER_PREFIXES = (
    "torch.optim.",
    "transformers.optimization.",
    "transformers.AdamW",
    "transformers.Adafactor",
    "bitsandbytes.optim.",
)
OPTIMIZER_EXCLUDED_PREFIXES = ("torch.optim.lr_scheduler.", "torch.optim.swa_utils.")
SCHEDULER_PREFIXES = ("torch.optim.lr_scheduler.",)
#: What an optimizer is called where nothing else says what an object is: one unpacked from a
#: helper's tuple, a trainer's constructor parameter handed to ``prepare``.
OPTIMIZER_NAMES = ("optimizer", "optim", "opt", "optimiser")


def is_optimizer_class(qualified_name: str) -> bool:
    """``torch.optim.SGD`` and the like: a class (capitalised) under an optimizer package, not a
    scheduler."""
    return (
        qualified_name.startswith(OPTIMIZER_PREFIXES)
        and not qualified_name.startswith(OPTIMIZER_EXCLUDED_PREFIXES)
        and qualified_name.rsplit(".", 1)[-1][:1].isupper()
    )


#: Project helpers that build the optimizer for a model they are handed (mmcv's and PixArt's
#: ``build_optimizer(model, cfg)``, timm's ``create_optimizer_v2(model, ...)``).
#: A project's helper that builds the LR scheduler for the optimizer it is handed
#: (``get_scheduler(optimizer=self.optimizer, scheduler_config=cfg)``).
SCHEDULER_FACTORIES = {
    "build_lr_scheduler",
    "build_scheduler",
    "create_lr_scheduler",
    "create_scheduler",
    "get_lr_scheduler",
    "get_scheduler",
    "make_scheduler",
}
OPTIMIZER_FACTORIES = {
    "build_optimizer",
    "create_optimizer",
    "create_optimizer_v2",
    "get_optimizer",
    "make_optimizer",
}
SCHEDULER_FUNCTIONS_PREFIXES = (
    "transformers.get_",
    "transformers.optimization.get_",
    "diffusers.optimization.get_",
)
MODEL_PREFIXES = ("torchvision.models.", "timm.create_model", "transformers.")
NN_PREFIX = "torch.nn."
NN_NOT_MODELS = ("torch.nn.functional.", "torch.nn.utils.", "torch.nn.init.", "torch.nn.parallel.")
MODULE_BASES = {"torch.nn.Module", "torch.nn.modules.module.Module"}
DEVICE_CALLS = {"torch.device"}
GRAD_SCALERS = {
    "torch.GradScaler",  # torch >= 2.3 exports torch.amp.GradScaler at the top level
    "torch.cuda.amp.GradScaler",
    "torch.amp.GradScaler",
    "torch.cuda.amp.grad_scaler.GradScaler",
    "torch.amp.grad_scaler.GradScaler",
}
AUTOCASTS = {
    "torch.autocast",
    "torch.cuda.amp.autocast",
    "torch.amp.autocast",
    "torch.cpu.amp.autocast",
    "torch.autocast_mode.autocast",
}
DDP_WRAPPERS = {
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.data_parallel.DataParallel",
}
#: What shards or replicates a model by hand, outside ``accelerator.prepare`` (FSDP2's
#: ``fully_shard`` on a model accelerate cannot wrap yet, FSDP1, DDP)
MANUAL_MODEL_WRAPPERS = DDP_WRAPPERS | {
    "torch.distributed.fsdp.fully_shard",
    "torch.distributed._composable.fsdp.fully_shard",
    "torch.distributed._composable.fsdp.fully_shard.fully_shard",
    "torch.distributed.fsdp.FullyShardedDataParallel",
    "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel",
}
DISTRIBUTED_SAMPLERS = {
    "torch.utils.data.distributed.DistributedSampler",
    "torch.utils.data.DistributedSampler",
}
ACCELERATORS = {
    "accelify.Accelerator",
    "accelify.runtime.Accelerator",
    "accelify.runtime.accelerator.Accelerator",
    "accelerate.Accelerator",
    "accelerate.accelerator.Accelerator",
}
#: Members only an Accelerator has (not a PartialState, a GradientState, an HF Trainer, an FSDP
#: or DeepSpeed model, a tensor or a settings object): what shows a name holds an accelerator.
ACCELERATOR_ONLY_MEMBERS = frozenset(
    {
        "prepare",
        "prepare_model",
        "prepare_optimizer",
        "prepare_data_loader",
        "prepare_scheduler",
        "unwrap_model",
        "gather_for_metrics",
        "accumulate",
        "get_state_dict",
        "init_trackers",
        "get_tracker",
        "end_training",
        "register_for_checkpointing",
        "register_save_state_pre_hook",
        "register_load_state_pre_hook",
        "skip_first_batches",
        "free_memory",
    }
)
#: Members only an Accelerator has that it always calls with something to work on: a call of one
#: with no argument (``preprocessor.prepare()``, a dataset's ``accumulate()``) is another class's
#: method of the same name, not evidence of an accelerator.
ACCELERATOR_MEMBERS_WITH_ARGUMENTS = frozenset(
    {
        "prepare",
        "prepare_model",
        "prepare_optimizer",
        "prepare_data_loader",
        "prepare_scheduler",
        "unwrap_model",
        "gather_for_metrics",
        "get_state_dict",
        "init_trackers",
        "get_tracker",
        "register_for_checkpointing",
        "register_save_state_pre_hook",
        "register_load_state_pre_hook",
        "skip_first_batches",
    }
)
#: Members an Accelerator shares with process states: evidence only for a name that says it is
#: an accelerator (``accelerator``, ``self.accelerator``, ``trainer_accelerator``). Not
#: ``device``: DeepSpeed's ``get_accelerator()`` objects have one too.
ACCELERATOR_SHARED_MEMBERS = frozenset(
    {
        "is_main_process",
        "is_local_main_process",
        "wait_for_everyone",
        "main_process_first",
        "local_main_process_first",
        "gather",
        "reduce",
        "pad_across_processes",
        "backward",
        "print",
        "log",
        "save",
        "autocast",
        "num_processes",
        "process_index",
        "local_process_index",
        "distributed_type",
        "state",
        "split_between_processes",
        "mixed_precision",
        "trackers",
        "no_sync",
        "use_distributed",
        "sync_gradients",
        "clip_grad_norm_",
        "clip_grad_value_",
        "gradient_accumulation_steps",
        "save_state",  # also an HF Trainer's
        "load_state",
        "save_model",  # also an HF Trainer's
    }
)
ACCELERATOR_MEMBERS = ACCELERATOR_ONLY_MEMBERS | ACCELERATOR_SHARED_MEMBERS
CLIP_FUNCTIONS = {
    "torch.nn.utils.clip_grad_norm_": "clip_grad_norm_",
    "torch.nn.utils.clip_grad.clip_grad_norm_": "clip_grad_norm_",
    "torch.nn.utils.clip_grad_value_": "clip_grad_value_",
    "torch.nn.utils.clip_grad.clip_grad_value_": "clip_grad_value_",
}
NO_GRAD_CONTEXTS = {"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad"}
TORCH_SAVE = {"torch.save"}
#: Reads of a saved state dict (a checkpoint file: plain keys, no wrapper prefix).
STATE_FILE_LOADS = {"torch.load", "safetensors.torch.load_file"}
INIT_PROCESS_GROUP = {"torch.distributed.init_process_group"}
SPAWN = {"torch.multiprocessing.spawn", "torch.multiprocessing.spawn.spawn"}
ALL_REDUCE = {"torch.distributed.all_reduce"}
#: ``dist.ReduceOp.X`` -> ``accelerator.reduce(..., reduction=...)`` (those HF Accelerate has too)
REDUCTIONS = {"SUM": "sum", "AVG": "mean"}
#: What the launcher sets for each process: a script that sets them itself would override it.
LAUNCHER_VARIABLES = {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK"}
DESTROY_PROCESS_GROUP = {"torch.distributed.destroy_process_group"}
BARRIER = {"torch.distributed.barrier"}
GET_RANK = {"torch.distributed.get_rank"}
GET_WORLD_SIZE = {"torch.distributed.get_world_size"}
SET_CUDA_DEVICE = {"torch.cuda.set_device"}
_TQDM_MODULES = ("tqdm", "tqdm.auto", "tqdm.notebook", "tqdm.std")
#: ``trange(n)`` is ``tqdm(range(n))``, from whichever of tqdm's modules it is imported
TRANGE = {f"{module}.trange" for module in _TQDM_MODULES}
TQDM = {f"{module}.tqdm" for module in _TQDM_MODULES} | TRANGE
#: ``tqdm.write(...)`` prints a line (above the bars) on every rank, as ``print`` does.
PRINT = {"builtins.print", *(f"{bar}.write" for bar in TQDM - TRANGE)}
#: ``pprint.pprint(config)`` prints on every rank too, in a format ``accelerator.print`` would
#: not keep; so does the ``pprint`` method of a ``pprint.PrettyPrinter(...)``.
PPRINT = {"pprint.pprint", "pprint.pp"}
PRETTY_PRINTER = "pprint.PrettyPrinter"
# Methods that return the module itself (or a moved copy): `Net().to(device).train()` is a model.
MODULE_SELF_METHODS = {"to", "cuda", "cpu", "float", "double", "half", "bfloat16", "train", "eval"}
DEVICE_MOVES = {"to", "cuda"}
# torch.nn.Module's own API: reachable through a DDP wrapper too (DDP is a Module).
MODULE_API = {
    "add_module", "apply", "bfloat16", "buffers", "children", "compile", "cpu", "cuda", "double",
    "eval", "extra_repr", "float", "forward", "get_buffer", "get_extra_state", "get_parameter",
    "get_submodule", "half", "ipu", "load_state_dict", "modules", "mtia", "named_buffers",
    "named_children", "named_modules", "named_parameters", "parameters", "register_backward_hook",
    "register_buffer", "register_forward_hook", "register_forward_pre_hook",
    "register_full_backward_hook", "register_full_backward_pre_hook",
    "register_load_state_dict_post_hook", "register_load_state_dict_pre_hook", "register_module",
    "register_parameter", "register_state_dict_post_hook", "register_state_dict_pre_hook",
    "requires_grad_", "set_extra_state", "set_submodule", "share_memory", "state_dict", "to",
    "to_empty", "train", "training", "type", "xpu", "zero_grad",
}  # fmt: skip
#: How a GPU's index is named: ``gpu_id = args.gpu``, ``device_id``, ``local_gpu``.
GPU_INDEX_NAMES = frozenset({"gpu", "gpu_id", "gpu_idx", "gpu_index", "device_id", "device_idx"})
#: Words before ``gpu`` that make it a count or a switch, not an index: ``n_gpu``,
#: ``num_gpu``, ``use_gpu``, ``multi_gpu``.
_NOT_AN_INDEX = frozenset({
    "n", "num", "number", "use", "using", "multi", "is", "has", "no", "with", "enable",
    "enabled", "count", "total", "all", "world", "max", "min",
})  # fmt: skip


def is_gpu_index_name(name: str) -> bool:
    """``gpu``, ``gpu_id``, ``local_gpu``, ``args.device_id``: a name for one GPU's index (not a
    rank: ``local_rank`` also names a process; not a count or a switch: ``ngpu``, ``n_gpu``,
    ``use_gpu``, ``multi_gpu``)."""
    words = identifier_words(name.rsplit(".", 1)[-1])
    for size in (2, 1):
        if len(words) >= size and "_".join(words[-size:]) in GPU_INDEX_NAMES:
            return not _NOT_AN_INDEX & set(words[:-size])
    return False


_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


def identifier_words(name: str) -> list[str]:
    """The words of an identifier, lower case: ``local_rank`` -> local, rank; ``saveCheckpoint``
    -> save, checkpoint; ``rank0`` -> rank, 0."""
    return [word.lower() for word in _WORD.findall(name)]


#: Words before ``rank`` that make it the rank of something other than a process: a matrix's
#: or an adapter's (``lora_rank``, ``matrix_rank``, ``low_rank``, ``svd_rank``), a retrieval
#: metric's (``reciprocal_rank``, ``mean_rank``, ``top_rank``, ``hit_rank``), or a count
#: (``num_rank``). Any other words before it name this process's rank (``local_rank``,
#: ``is_master_rank``, Megatron's ``get_tensor_model_parallel_rank``).
_NOT_A_PROCESS_RANK = frozenset({
    "lora", "adapter", "matrix", "low", "svd", "pca", "tucker", "decomposition", "approx",
    "effective", "numerical", "stable", "feature", "alpha", "dim", "ndim", "reciprocal", "mean",
    "avg", "average", "median", "top", "bottom", "hit", "hits", "score", "query", "doc",
    "document", "item", "label", "page", "search", "result", "retrieval", "sort", "sorted",
    "pred", "predicted", "true", "gold", "target", "relevant", "kendall", "spearman",
    "popularity", "pairwise", "margin", "beam", "candidate", "token", "word", "vocab",
    "sparse", "eigen", "kernel", "nuclear", "weight", "weights", "n", "num", "number", "count",
    "total", "max", "min",
})  # fmt: skip
#: ``tensor_rank`` (or ``tensor.rank``) is a tensor's number of dimensions; a tensor-parallel
#: rank says so (``tensor_parallel_rank``, ``tensor_model_parallel_rank``, ``tp_rank``).
_NOT_A_PROCESS_RANK_JUST_BEFORE = frozenset({"tensor", "array"})
#: Words fused with ``rank`` into one word for this process's rank: ``myrank``, ``localrank``.
_FUSED_BEFORE_RANK = frozenset({
    "my", "local", "global", "node", "world", "proc", "process", "cur", "current", "this",
    "main", "master", "self", "dist", "ddp", "mpi", "worker", "gpu", "device",
})  # fmt: skip
#: Words after ``rank`` (``rank_id``, ``rank0``, ``is_rank_zero``): any other word makes it
#: another rank (``rank_r``) or a setting every rank shares (``rank0_only``).
_PROCESS_RANK_AFTER = frozenset({"id", "idx", "index", "num", "no", "zero", "0"})
#: Names for this process, or for the main one, that hold no ``rank`` word.
_PROCESS_NAMES = (
    ("process", "index"),  # accelerator.process_index, local_process_index
    ("main", "process"),  # is_main_process, is_local_main_process
    ("process", "zero"),  # HF Trainer's is_world_process_zero
    ("is", "master"),
    ("master", "process"),  # nanoGPT
    ("get", "ordinal"),  # torch_xla's xm.get_ordinal()
)


def is_process_rank_name(name: str) -> bool:
    """A name for this process's rank or for a test of it, split in words: ``rank``,
    ``local_rank``, ``myrank``, ``dist.get_rank``, ``is_first_rank``, Megatron's
    ``mpu.get_tensor_model_parallel_rank``, ``is_main_process``, ``process_index``, ``rank0``,
    ``is_world_process_zero``; not a rank of something else (``lora_rank``,
    ``reciprocal_rank``, ``matrix_rank``, ``rank_r``), a ranking (``ranking_loss``, ``ranks``),
    or a mode flag every rank shares (``rank0_only``, ``main_process_only``,
    ``main_process_first``)."""
    words = identifier_words(name.rsplit(".", 1)[-1])
    if "only" in words:
        return False
    words = [
        "rank" if word.endswith("rank") and word[:-4] in _FUSED_BEFORE_RANK else word
        for word in words
    ]
    if "rank" in words:
        at = words.index("rank")
        before = words[:at]
        if _NOT_A_PROCESS_RANK & set(before):
            return False
        if before and before[-1] in _NOT_A_PROCESS_RANK_JUST_BEFORE:
            return False
        return set(words[at + 1 :]) <= _PROCESS_RANK_AFTER
    if words[-1:] == ["first"]:
        return False  # ``main_process_first()``: a context every rank enters
    return any(
        words[i : i + len(pair)] == list(pair)
        for pair in _PROCESS_NAMES
        for i in range(len(words) - len(pair) + 1)
    )


#: Libraries whose functions are not the project's own code (a project's module is code the
#: conversion cannot read).
KNOWN_LIBRARIES = frozenset({
    "torch", "torchvision", "torchaudio", "torchtext", "accelerate", "accelify", "numpy",
    "pandas", "scipy", "sklearn", "matplotlib", "PIL", "cv2", "tqdm", "wandb", "mlflow",
    "tensorboard", "tensorboardX", "transformers", "datasets", "safetensors", "timm",
    "lightning", "pytorch_lightning", "deepspeed", "yaml", "h5py", "einops", "huggingface_hub",
    "peft", "diffusers", "evaluate", "torchmetrics", "omegaconf", "hydra", "neptune", "comet_ml",
})  # fmt: skip
#: Functions that write or delete files: run once, on the main process.
FILE_WRITERS = {
    "torchvision.utils.save_image",
    "matplotlib.pyplot.savefig",
    "matplotlib.pyplot.imsave",
    "torchaudio.save",
    "soundfile.write",
    "scipy.io.wavfile.write",
    "cv2.imwrite",
    "imageio.imwrite",
    "imageio.v2.imwrite",
    "imageio.v3.imwrite",
    "numpy.save",
    "numpy.savez",
    "numpy.savez_compressed",
    "numpy.savetxt",
    "json.dump",
    "pickle.dump",
    "yaml.dump",
    "yaml.safe_dump",
    "safetensors.torch.save_file",
    "safetensors.torch.save_model",
    "shutil.rmtree",
    "shutil.copy",
    "shutil.copy2",
    "shutil.copyfile",
    "shutil.copytree",
    "shutil.move",
    "os.remove",
    "os.unlink",
    "os.rename",
    "os.replace",
    "os.rmdir",
}
#: Methods that write files whatever their receiver (a figure, a DataFrame, a Path, a model).
FILE_WRITING_METHODS = {
    "savefig",
    "save_pretrained",
    "save_to_disk",
    "to_csv",
    "to_excel",
    "to_json",
    "to_parquet",
    "write_text",
    "write_bytes",
    "unlink",
    "rmdir",
}
#: Uploads to the Hugging Face Hub (``api.upload_folder``, ``model.push_to_hub``,
#: ``huggingface_hub.create_repo``...): once per run, or N commits race on one repo.
HUB_UPLOAD_METHODS = {
    "upload_folder",
    "upload_file",
    "upload_large_folder",
    "push_to_hub",
    "create_commit",
    "create_repo",
}
#: Calls that start an experiment-tracking run on the tracker's server: once per run (the
#: Accelerator's ``init_trackers`` starts it on the main process only), or N runs appear.
TRACKER_RUN_STARTS = {
    "wandb.init", "wandb.sdk.wandb_init.init",
    "mlflow.start_run", "mlflow.tracking.fluent.start_run",
    "comet_ml.Experiment", "comet_ml.start",
    "neptune.init_run", "neptune.init", "neptune.new.init_run", "neptune.new.init",
    "aim.Run", "aim.sdk.Run", "aim.sdk.run.Run",
}  # fmt: skip
#: mlflow's module-level logging, which starts a run of its own where none is active
#: (``mlflow.tracking.fluent._get_or_start_run``): called by a rank that did not start one,
#: each such rank makes a run of the experiment.
TRACKER_AUTO_RUN_CALLS = {
    f"mlflow.{name}"
    for name in (
        "log_metric", "log_metrics", "log_param", "log_params", "log_artifact",
        "log_artifacts", "log_dict", "log_text", "log_figure", "log_image", "log_table",
        "log_input", "set_tag", "set_tags",
    )
}  # fmt: skip
#: What wandb runs only inside a run: before ``wandb.init`` each raises ``wandb.Error("You must
#: call wandb.init() before wandb.log()")`` (wandb's pre-init stubs).
TRACKER_RUN_CALLS = {
    "wandb.log", "wandb.watch", "wandb.unwatch", "wandb.save", "wandb.use_artifact",
    "wandb.log_artifact", "wandb.log_model", "wandb.use_model", "wandb.define_metric",
    "wandb.alert",
}  # fmt: skip
#: Of those, the ones that delete: a second rank deleting the same path fails.
FILE_DELETERS = {"shutil.rmtree", "os.remove", "os.unlink", "os.rmdir"}
FILE_DELETING_METHODS = {"unlink", "rmdir"}
MAKEDIRS = {"os.makedirs", "os.mkdir"}
PATH_EXISTS = {"os.path.exists", "os.path.isdir"}
SUMMARY_WRITERS = {
    "torch.utils.tensorboard.SummaryWriter",
    "torch.utils.tensorboard.writer.SummaryWriter",
    "tensorboardX.SummaryWriter",
}
#: Calls that seed the random generators (any of them counts as the script's seed).
SEEDS = {
    "torch.manual_seed",
    "torch.random.manual_seed",
    "torch.cuda.manual_seed_all",
    "random.seed",
    "numpy.random.seed",
    "accelerate.utils.set_seed",
    "accelerate.utils.random.set_seed",
    "accelify.set_seed",
    "accelify.runtime.set_seed",
    "transformers.set_seed",
    "transformers.trainer_utils.set_seed",
    "pytorch_lightning.seed_everything",
    "lightning.seed_everything",
    "lightning.pytorch.seed_everything",
}
#: Draws from the global generators (``torch.Generator()``-based draws are seeded by the script).
RANDOM_DRAWS_TORCH = {
    f"torch.{name}"
    for name in (
        "rand",
        "randn",
        "randint",
        "randperm",
        "normal",
        "bernoulli",
        "multinomial",
        "rand_like",
        "randn_like",
        "randint_like",
        "poisson",
    )
} | {"torch.utils.data.random_split"}
RANDOM_MODULES = ("numpy.random.", "random.")
