from collections.abc import Iterator

import libcst as cst

from accelify.analysis import names
from accelify.analysis.accumulation import BRANCHES, conditional
from accelify.analysis.collectives import DDP, DEEPSPEED, FSDP, backends_in_view
from accelify.analysis.construction import (
    constructed_accelerator,
    holds_constructed_wrapper,
    keeps_the_object,
)
from accelify.analysis.facts import Facts, facts_of
from accelify.analysis.name_scopes import binding_spellings, means_module_binding
from accelify.analysis.outside_forward import defined_by_a_module_class, in_training_step
from accelify.analysis.project_modules import split_member
from accelify.analysis.script_model import Kind, PrepareCall, ScriptModel
from accelify.analysis.syntax import (
    assigned_targets,
    dotted,
    has_parameter,
    keyword_value,
    top_level_functions,
    value_assigned_to,
    walk,
)
from accelify.analysis.wrapper_tests import WRAPPER_TESTS, contains, in_unwrapped_branch
from accelify.lint.rule import (
    HEADER,
    Example,
    Finding,
    Rule,
    accelerator_at,
    accelerator_name,
    optimizer_models,
)

#: What DistributedDataParallel itself answers besides nn.Module's API.
_WRAPPER_OWN = {
    "module", "no_sync", "join", "join_hook", "register_comm_hook", "device", "device_ids",
    "output_device", "dim", "broadcast_buffers", "find_unused_parameters", "process_group",
    "static_graph", "gradient_as_bucket_view", "require_backward_grad_sync", "_set_static_graph",
    # DeepSpeed's engine: a script that prepares for DeepSpeed calls these on the engine itself
    "save_checkpoint", "load_checkpoint", "is_gradient_accumulation_boundary", "global_steps",
    "get_global_grad_norm", "save_16bit_model", "set_gradient_accumulation_boundary",
    "zero_optimization_stage", "empty_partition_cache", "backward", "step", "optimizer",
    "lr_scheduler",
}  # fmt: skip


#: A LoRA trainer whose construction prepares ``self.unet`` (its own methods before the prepare).
_LORA_TRAINER = (
    "from accelerate import Accelerator\nfrom peft import get_peft_model\n\n\n"
    "class LoRATrainer:\n    def __init__(self, unet):\n"
    "        self.accelerator = Accelerator()\n        self.unet = unet\n"
    "        self.setup_models()\n        self.setup_training()\n\n"
    "    def setup_models(self):\n"
    "        self.unet = get_peft_model(self.unet, lora_config)\n"
    "        self.unet.print_trainable_parameters()\n\n"
    "    def setup_training(self):\n"
    "        self.optimizer = make_optimizer(self.unet.parameters())\n"
    "        self.unet, self.optimizer = self.accelerator.prepare(\n"
    "            self.unet, self.optimizer\n        )\n\n"
    "    def train_step(self, batch):\n"
    "        self.accelerator.backward(self.unet(batch).loss)\n\n"
)

#: A trainer whose construction prepares a transformers model it never calls itself (its
#: training step calls ``self.model.generate``), beside an optimizer over its parameters.
_GENERATING_TRAINER = (
    "import torch\nimport transformers\nfrom accelerate import Accelerator\n\n\n"
    "class Trainer:\n    def __init__(self, cls, name):\n"
    "        self.accelerator = Accelerator()\n"
    "        model = {made}\n"
    "        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)\n"
    "        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)\n\n"
    "    def sample(self, ids):\n"
    "        return {model}.generate(ids)\n"
)
#: The same trainer driven from ``main``: its prepared model read from outside the class.
_DRIVEN_TRAINER = (
    "from accelerate import Accelerator\nfrom transformers import AutoModelForCausalLM\n\n\n"
    "class Trainer:\n    def __init__(self, name):\n"
    "        self.accelerator = Accelerator()\n"
    "        self.model = AutoModelForCausalLM.from_pretrained(name)\n"
    "        self.model = self.accelerator.prepare(self.model)\n\n"
    "    def train(self, batch):\n"
    "        self.accelerator.backward(self.model(**batch).loss)\n\n\n"
    "def main():\n    trainer = Trainer('gpt2')\n    trainer.train(batch)\n"
)

#: A DDPM trainer that builds its pipeline from the model it trained, and saves it.
_PIPELINE = (
    "from accelerate import Accelerator\n"
    "from diffusers import DDPMPipeline\n"
    "accelerator = Accelerator()\n"
    "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    "for batch in loader:\n"
    "    accelerator.backward(model(batch).sample.mean())\n"
    "    optimizer.step()\n"
    "accelerator.wait_for_everyone()\n"
    "if accelerator.is_main_process:\n"
    "    pipeline = DDPMPipeline(\n"
    "        scheduler=noise_scheduler, unet={unet}\n"
    "    )\n"
    "    pipeline.save_pretrained('out')\n"
)


_CYCLE = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    "class CycleTrainer:\n"
    "    def __init__(self, model_a, model_b, opt_a, opt_b):\n"
    "        self.accelerator = Accelerator()\n"
    "        self.model_A, self.opt_A, self.model_B, self.opt_B = self.accelerator.prepare(\n"
    "            model_a, opt_a, model_b, opt_b\n"
    "        )\n\n"
    "    def train(self, loader):\n"
    "        for batch in loader:\n"
    "            self._cycle_step(self.model_A, self.model_B, self.opt_A, batch)\n\n"
    "    def _cycle_step(self, model_train, model_gen, optimizer, batch):\n"
    "        with torch.inference_mode():\n"
    "            synth = {generator}.generate(input_ids=batch['input_ids'])\n"
    "        self.accelerator.backward(model_train(input_ids=synth).loss)\n"
    "        optimizer.step()\n"
)


#: The FSDP plugin `_GLOBAL_MODEL`'s main block makes (left out by its DDP variant).
_FSDP_PLUGIN = (
    "    plugin = FullyShardedDataParallelPlugin() if torch.cuda.device_count() > 1 else None\n"
)


#: A training function reading the module's model, prepared by the main block before it calls
#: the function (``{rebind}`` after the ``prepare``).
_GLOBAL_MODEL = (
    "import torch\nfrom accelerate import Accelerator, FullyShardedDataParallelPlugin\n\n\n"
    "def train():\n"
    "    for x, y in loader:\n"
    "        loss = (model(x) - y).pow(2).mean()\n"
    "        accelerator.backward(loss)\n"
    "        optimizer.step()\n"
    "        print(f'size {{model.module.h}}')\n\n\n"
    "if __name__ == '__main__':\n"
    + _FSDP_PLUGIN
    + "    accelerator = Accelerator(fsdp_plugin=plugin)\n"
    + "    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    + "{rebind}"
    + "    train()\n"
)


#: A trainer whose base class defines ``prepare(self, *args)`` as ``return {body}``, reading its
#: prepared model's ``generate``.
_BASE_PREPARE = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    "class Base:\n"
    "    def prepare(self, *args):\n"
    "        return {body}\n\n\n"
    "class Sampler(Base):\n"
    "    def __init__(self, model, optimizer):\n"
    "        self.accelerator = Accelerator()\n"
    "        self.model, self.optimizer = self.prepare(model, optimizer)\n\n"
    "    def step(self, x):\n"
    "        self.accelerator.backward(self.model(x).sum())\n"
    "        self.optimizer.step()\n\n"
    "    def sample(self, prompt):\n"
    "        return self.model.generate(prompt)\n"
)


#: A model prepared at module level (in both branches of an ``if``), read by a function that
#: the module defines under another ``if`` and calls there (cgftp's ``add_edge_feature``):
#: a function of the module's scope all the same. ``{rebind}`` runs before that call.
_MODEL_READ_IN_A_FUNCTION_UNDER_AN_IF = (
    "import torch\n"
    "from accelerate import Accelerator\n"
    "accelerator = Accelerator()\n"
    "model = torch.nn.Linear(2, 2)\n"
    "if args.train:\n"
    "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "    model, optimizer = accelerator.prepare(model, optimizer)\n"
    "    accelerator.backward(model(torch.ones(2)).sum())\n"
    "    optimizer.step()\n"
    "else:\n"
    "    model = accelerator.prepare(model)\n"
    "if args.export:\n"
    "{rebind}"
    "    def features(xs):\n"
    "        return [model.map(x) for x in xs]\n\n"
    "    print(features([1, 2]))\n"
)


def _plain_global_model(rebind: str) -> str:
    """`_GLOBAL_MODEL` on DDP alone, reading the model's own ``config``."""
    return (
        _GLOBAL_MODEL.format(rebind=rebind)
        .replace(", FullyShardedDataParallelPlugin", "")
        .replace(_FSDP_PLUGIN, "")
        .replace("Accelerator(fsdp_plugin=plugin)", "Accelerator()")
        .replace("model.module.h", "model.config.h")
    )


#: A model class with Lightning-like steps that run its forward (``self(x)``)
_STEP_MODEL = (
    "import torch\n"
    "class Regressor(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.fc = torch.nn.Linear(4, 1)\n"
    "    def forward(self, x):\n"
    "        return self.fc(x)\n"
    "    def training_step(self, batch, i):\n"
    "        x, y = batch\n"
    "        return torch.nn.functional.mse_loss(self(x), y)\n"
    "    def validation_step(self, batch, i):\n"
    "        return self.training_step(batch, i).item()\n"
    "model = Regressor()\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
)


#: A trainer that keeps what its constructor is handed by one tuple assignment (cgftp's
#: ``train``), built with the prepared model: ``self.model`` is the wrapper in its constructor
#: and its methods. ``{read}``: how the step reads the model's own member.
_TUPLE_KEPT_TRAINER = (
    "import torch\n"
    "from accelerate import Accelerator\n\n\n"
    "class Train:\n"
    "    def __init__(self, model, optimizer, accelerator):\n"
    "        self.model, self.optimizer, self.accelerator = model, optimizer, accelerator\n"
    "        self.cum = self.model.GAT.causal_matrix.detach().clone()\n\n"
    "    def step(self, loader):\n"
    "        for x in loader:\n"
    "            m = {read}.detach().clone()\n"
    "            self.accelerator.backward(self.model(x, m).sum())\n"
    "            self.optimizer.step()\n\n\n"
    "accelerator = Accelerator()\n"
    "model = torch.nn.Linear(2, 2)\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    "Train(model, optimizer, accelerator).step(loader)\n"
)

#: A model of a class the file imports and cannot read (its kind unknown), prepared, then
#: read past the wrapper; ``{shows}`` is what the file does that only a module allows.
_IMPORTED_CLASS_MODEL = (
    "import torch\n"
    "from accelerate import Accelerator\n"
    "from model import CausalGAT\n"
    "accelerator = Accelerator()\n"
    "model = CausalGAT(dataset)\n"
    "{shows}"
    "model = accelerator.prepare(model)\n"
    "features = model.embedding.weight\n"
)


#: A model prepared and trained over batches unpacked into nested targets, then (``{after}``)
#: a loop whose nested target may bind the name ``model`` anew.
_NESTED_TARGETS = (
    "import torch\nfrom accelerate import Accelerator\n"
    "accelerator = Accelerator()\n"
    "model, optimizer, loader = accelerator.prepare(net, optimizer, loader)\n"
    "for (x, y), z in loader:\n"
    "    accelerator.backward(model(x).sum())\n"
    "{after}"
)


class WrapperAttribute(Rule):
    """A method or attribute of the model's own class read from the object ``prepare`` returned
    (``model.generate(...)``, ``model.config``, ``model.save_pretrained(...)``): on several
    processes (GPUs, or ``accelify launch --cpu -n 2``) ``prepare`` wraps the model in
    ``DistributedDataParallel``, which forwards only ``forward`` and nn.Module's own API, so
    the first such call raises ``AttributeError`` on a multi-process run, while a one-process
    run (no wrapper) works. ``accelerator.unwrap_model(model)`` reaches the model itself.

    ``prepare`` is also a trainer's own ``self.prepare(...)`` where its class, a base class of
    the file or one imported from a project module hands everything to the accelerator's
    (muse-maskgit's ``BaseAcceleratedTrainer.prepare``: `analysis.prepare_wrappers`), and
    ``accelerator.prepare_model(model)``, which wraps alike (not with ``evaluation_mode=True``,
    which leaves the model unwrapped).
    Only a plain name that ``prepare`` returned in the same function (or at module level, also
    read in a top-level function the module's code calls after that ``prepare``: PixArt's
    ``train()`` logging ``model.module.h``), not
    bound again since (``model = accelerator.unwrap_model(model)``), is checked, and a
    trainer's ``self.model`` read in a method that runs after construction when construction
    (``__init__`` and the methods it calls) prepared it and nothing else binds it; an attribute
    set on it (``model.x = ...``) binds on the wrapper and is not reported. DeepSpeed's engine
    and FSDP forward unknown attributes to the model, but the DDP case alone crashes the
    script's most common multi-GPU run. A model whose every parameter the file froze before
    ``prepare`` and no optimizer trains (an RLHF reward or reference model) is not wrapped:
    Accelerate and accelify's runtime wrap only a model with a parameter that requires grad.

    And the model's forward called past the wrapper in a training step (``raw_model =
    accelerator.unwrap_model(model)``, then ``raw_model(x)``): DistributedDataParallel arms its
    gradient hooks in its own forward, so that step's gradients are never averaged and the
    replicas drift apart with nothing said (a model no optimizer trains is not reported).

    The reverse too: ``model.module`` on what ``prepare`` returned exists only on the wrapper,
    and a one-process run gets the model itself back (AttributeError at the first checkpoint),
    whatever engine a multi-process run wraps it in (FSDP's first version and DeepSpeed's have
    ``module`` too; FSDP2's ``fully_shard`` shards in place and has none), unless every run is a
    DeepSpeed run (a ``DeepSpeedPlugin`` built unconditionally, or ``DummyOptim``): Accelerate
    then wraps the model in DeepSpeed's engine on one process as well, or unless a test chooses
    (``hasattr(model, "module")``, ``num_processes > 1``), or a ``try``
    falls back from one to the other (``try: model.config except AttributeError:
    model.module.config``, a diffusion trainer's read of its UNet's channels): the handler runs
    exactly where the first read fails."""

    code = "ACC104"
    name = "wrapper-attribute"
    message = (
        "Call this through accelerator.unwrap_model(model): on several processes prepare wraps the "
        "model in DistributedDataParallel, which has no such attribute (AttributeError)"
    )
    why = "A multi-process run stops with AttributeError at the first call; one process hides it."
    bad = (
        # review11b: the reference model copied from the policy with only ``.eval()`` keeps
        # every parameter requiring grad, so prepare wraps it like the policy (2 CPU ranks under
        # accelify launch: AttributeError at forward_rl); frozen, it is a good example below
        Example(
            "import copy\nimport torch\nfrom accelerate import Accelerator\n\n\n"
            "class GRPOTrainer:\n"
            "    def __init__(self, model):\n"
            "        self.accelerator = Accelerator()\n"
            "        self.model = model\n"
            "        self.optimizer = torch.optim.AdamW(model.parameters())\n"
            "        self.model, self.optimizer = self.accelerator.prepare(\n"
            "            self.model, self.optimizer\n"
            "        )\n"
            "        self.ref_model = self._init_ref_model()\n"
            "        self.ref_model = self.accelerator.prepare(self.ref_model)\n\n"
            "    def _init_ref_model(self):\n"
            "        model_copy = copy.deepcopy(self.accelerator.unwrap_model(self.model))\n"
            "        model_copy.eval()\n"
            "        return model_copy\n\n"
            "    def train(self, loader):\n"
            "        for batch in loader:\n"
            "            with torch.no_grad():\n"
            "                ref = self.ref_model.forward_rl(batch)\n"
            "            loss = (self.model(batch) - ref).pow(2).mean()\n"
            "            self.accelerator.backward(loss)\n"
            "            self.optimizer.step()\n",
            25,
            23,
        ),
        # lintreal41 (a TTS GRPO trainer): ``self.model = model``, the optimizer built from
        # ``model.parameters()``, then both prepared: ``self.model`` trains, and its own method
        # run in the training step is told to go through forward() (through unwrap_model its
        # gradients would never be averaged across ranks)
        Example(
            "import torch\nfrom accelerate import Accelerator\n\n\n"
            "class Trainer:\n"
            "    def __init__(self, model, loader):\n"
            "        self.accelerator = Accelerator()\n"
            "        self.model = model\n"
            "        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
            "        self.model, self.optimizer, self.loader = self.accelerator.prepare(\n"
            "            self.model, self.optimizer, loader\n"
            "        )\n\n"
            "    def train(self):\n"
            "        for batch in self.loader:\n"
            "            out = self.model.forward_rl(batch)\n"
            "            self.accelerator.backward(out.mean())\n"
            "            self.optimizer.step()\n",
            16,
            19,
        ),
        # review10b: a comprehension's `for model in registry` binds its own `model`; the
        # prepared one below it is still the wrapper (and the comprehension's is no model)
        Example(
            "from accelerate import Accelerator\n\n\n"
            "def main(model, optimizer, loader, registry):\n"
            "    accelerator = Accelerator()\n"
            "    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            "    names = [model.name for model in registry]\n"
            "    for batch in loader:\n"
            "        accelerator.backward(model(**batch).loss)\n"
            "        optimizer.step()\n"
            "    return model.generate(max_new_tokens=3), names\n",
            11,
            12,
        ),
        # ... nor does a lambda's parameter of that name
        Example(
            "from accelerate import Accelerator\n\n\n"
            "def main(model, optimizer, loader, registry):\n"
            "    accelerator = Accelerator()\n"
            "    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            "    best = max(registry, key=lambda model: model.score)\n"
            "    for batch in loader:\n"
            "        accelerator.backward(model(**batch).loss)\n"
            "        optimizer.step()\n"
            "    return model.generate(max_new_tokens=3), best\n",
            11,
            12,
        ),
        # the batch unpacked into nested targets binds no model: `model` is still the wrapper
        Example(_NESTED_TARGETS.format(after="    print(model.weight)\n"), 7, 11),
        # a helper handed the policy and a frozen reference model: the policy is wrapped
        # (an RLHF trainer's log-probabilities)
        Example(
            HEADER
            + "import torch\n"
            + "from transformers import AutoModelForCausalLM\n"
            + "policy = AutoModelForCausalLM.from_pretrained('gpt2')\n"
            + "ref_model = AutoModelForCausalLM.from_pretrained('gpt2')\n"
            + "def log_probs(model, ids):\n"
            + "    ids = ids[:, : model.config.max_position_embeddings]\n"
            + "    return model(ids).logits.log_softmax(-1)\n"
            + "for param in ref_model.parameters():\n"
            + "    param.requires_grad = False\n"
            + "optimizer = torch.optim.AdamW(policy.parameters())\n"
            + "policy, ref_model, optimizer = accelerator.prepare(policy, ref_model, optimizer)\n"
            + "for ids in loader:\n"
            + "    with torch.no_grad():\n"
            + "        ref = log_probs(ref_model, ids)\n"
            + "    loss = (log_probs(policy, ids) - ref).mean()\n"
            + "    accelerator.backward(loss)\n"
            + "    optimizer.step()\n",
            8,
            20,
        ),
        # a classifier trainer whose evaluation mode loads a new model into self.model and
        # prepares it again: every other method still reads a wrapper
        Example(
            "import torch\nfrom accelerate import Accelerator\n"
            "from transformers import AutoModelForSequenceClassification\n\n\n"
            "class Trainer:\n"
            "    def __init__(self, name):\n"
            "        self.model = AutoModelForSequenceClassification.from_pretrained(name)\n"
            "        self.optimizer = torch.optim.AdamW(self.model.parameters())\n"
            "        self.accelerator = Accelerator()\n"
            "        self.model, self.optimizer = self.accelerator.prepare(\n"
            "            self.model, self.optimizer)\n\n"
            "    def training(self, loader):\n"
            "        for batch in loader:\n"
            "            self.accelerator.backward(self.model(**batch).loss)\n"
            "            self.optimizer.step()\n"
            "        self.model.save_pretrained('out')\n\n"
            "    def load_trained(self, name):\n"
            "        self.model = AutoModelForSequenceClassification.from_pretrained(name)\n"
            "        self.model = self.accelerator.prepare(self.model)\n",
            18,
            9,
        ),
        # a DDPM trainer hands its prepared UNet to the pipeline it saves: the pipeline's
        # save_pretrained leaves the wrapper out
        Example(
            _PIPELINE.format(unet="model"),
            11,
            41,
        ),
        # a LoRA trainer whose construction prepares self.unet: every later method holds the
        # wrapper (a diffusion LoRA fine-tuning's save_model)
        Example(
            _LORA_TRAINER
            + "    def save_model(self, path):\n"
            + "        if self.accelerator.is_main_process:\n"
            + "            self.unet.save_pretrained(path)\n",
            27,
            13,
        ),
        # an asymmetric bi-encoder's training step: the forward past the wrapper
        Example(
            HEADER
            + "import torch\n"
            + "model = torch.nn.Linear(4, 1)\n"
            + "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + "for x, y in loader:\n"
            + "    raw_model = accelerator.unwrap_model(model)\n"
            + "    loss = (raw_model(x) - y).pow(2).mean()\n"
            + "    accelerator.backward(loss)\n"
            + "    optimizer.step()\n",
            9,
            13,
        ),
        # a Lightning-like model's own training_step, whose body runs self(x), called through
        # unwrap_model: DDP's forward never runs, the gradients are never averaged
        Example(
            HEADER
            + _STEP_MODEL
            + "for i, (x, y) in enumerate(loader):\n"
            + "    loss = accelerator.unwrap_model(model).training_step((x, y), i)\n"
            + "    accelerator.backward(loss)\n"
            + "    optimizer.step()\n",
            19,
            12,
        ),
        # a robot-policy trainer: its optimizer built from lr groups of the policy's (or its
        # inner model's) parameters, the policy unwrapped once to count them and again per
        # batch for the training forward
        Example(
            HEADER
            + "import torch\n"
            + "policy = make_policy(cfg)\n"
            + "groups = []\n"
            + "inner = policy.model if hasattr(policy, 'model') else policy\n"
            + "params = [p for p in inner.parameters() if p.requires_grad]\n"
            + "groups.append({'params': params, 'lr': 1e-4})\n"
            + "optimizer = torch.optim.AdamW(groups)\n"
            + "policy, optimizer, loader = accelerator.prepare(policy, optimizer, loader)\n"
            + "uw = accelerator.unwrap_model(policy)\n"
            + "print(sum(p.numel() for p in uw.parameters()))\n"
            + "for batch in loader:\n"
            + "    uw = accelerator.unwrap_model(policy)\n"
            + "    loss, parts = uw(batch)\n"
            + "    accelerator.backward(loss)\n"
            + "    optimizer.step()\n",
            15,
            19,
        ),
        Example(  # a block of the model's ModuleList looked at after training: the advice
            # unwraps the model and keeps the item (``unwrap_model(model).blocks[0]``)
            HEADER
            + "import torch\n"
            + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + "for x, y in loader:\n"
            + "    accelerator.backward(model(x).sum())\n"
            + "    optimizer.step()\n"
            + "with torch.no_grad():\n"
            + "    maps = model.blocks[0].attn(x)\n",
            9,
            12,
        ),
        Example(  # the same block run in the training step: its layers run outside forward
            HEADER
            + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + "for x, y in loader:\n"
            + "    hidden = model.blocks[0](x)\n"
            + "    accelerator.backward((model(x) + hidden).sum())\n"
            + "    optimizer.step()\n",
            5,
            14,
        ),
        Example(  # a Sequential indexed through the wrapper: DDP cannot be indexed
            HEADER
            + "import torch\n"
            + "model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))\n"
            + "model = accelerator.prepare(model)\n"
            + "torch.save(model[1].state_dict(), 'head.pt')\n",
            6,
            12,
        ),
        Example(  # lucidrains/PaLM-rlhf-pytorch train.py: sampling from the prepared model
            HEADER
            + "model, optim = accelerator.prepare(model, optim)\n"
            + "for i in range(10):\n"
            + "    loss = model(batch, return_loss=True)\n"
            + "    accelerator.backward(loss)\n"
            + "    sample = model.generate(512, prime)\n",
            7,
            14,
        ),
        Example(  # the same, the prepared model moved again: .to() hands the wrapper back
            HEADER
            + "model, optim = accelerator.prepare(model, optim)\n"
            + "model = model.to(accelerator.device).train()\n"
            + "accelerator.backward(model(batch, return_loss=True))\n"
            + "sample = model.generate(512, prime)\n",
            6,
            10,
        ),
        Example(
            HEADER
            + "from transformers import AutoModelForCausalLM\n\n\n"
            + "def main():\n"
            + "    model = AutoModelForCausalLM.from_pretrained('gpt2')\n"
            + "    model = accelerator.prepare(model)\n"
            + "    print(model.config.hidden_size)\n",
            9,
            11,
        ),
        Example(  # a diffusion autoencoder's step loop (``while``, batches from next()):
            # its encode runs the model's layers, so unwrapping it is no fix
            HEADER
            + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + "model.train()\nit = iter(loader)\nstep = 0\n"
            + "while step < max_steps:\n"
            + "    z = model.encode(next(it))\n"
            + "    accelerator.backward(model.decode(z).pow(2).mean())\n"
            + "    optimizer.step()\n"
            + "    step += 1\n",
            8,
            9,
        ),
        Example(  # a layer run by name in the training step: unwrapping it is no fix either
            HEADER
            + "import torch\nfrom torch import nn\n\n\n"
            + "class AutoEncoder(nn.Module):\n"
            + "    def __init__(self):\n"
            + "        super().__init__()\n"
            + "        self.encoder = nn.Linear(4, 2)\n\n"
            + "    def forward(self, x):\n"
            + "        return self.encoder(x)\n\n\n"
            + "model = AutoEncoder()\n"
            + "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            + "model, optimizer = accelerator.prepare(model, optimizer)\n"
            + "for x in batches:\n"
            + "    loss = model.encoder(x).pow(2).mean()\n"
            + "    accelerator.backward(loss)\n",
            20,
            12,
        ),
        Example(  # a branch only several processes take: that is where the wrapper is
            HEADER
            + "model = accelerator.prepare(model)\n"
            + "accelerator.backward(model(batch).loss)\n"
            + "if accelerator.num_processes > 1:\n    model.remove_caches()\n",
            6,
            5,
        ),
        Example(  # the test is of another object: this model is still wrapped there
            HEADER
            + "model = accelerator.prepare(model)\n"
            + "accelerator.backward(model(batch).loss)\n"
            + "if hasattr(ema, 'module'):\n    pass\nelse:\n    model.generate(cond)\n",
            8,
            5,
        ),
        Example(  # U-DiT: a checkpoint from the wrapper's module, which one process lacks
            HEADER
            + "import torch\n"
            + "model, opt, loader = accelerator.prepare(model, opt, loader)\n"
            + "accelerator.backward(model(batch).loss)\n"
            + "if accelerator.is_main_process:\n"
            + "    torch.save({'model': model.module.state_dict()}, 'ckpt.pt')\n",
            7,
            26,
        ),
        Example(  # the plugin built on every run, but a --cpu run leaves DeepSpeed out
            "import torch\nfrom accelerate import Accelerator, DeepSpeedPlugin\n"
            + "plugin = DeepSpeedPlugin(zero_stage=2)\n"
            + "accelerator = Accelerator(deepspeed_plugin=plugin, cpu=args.cpu)\n"
            + "model, opt, loader = accelerator.prepare(model, opt, loader)\n"
            + "accelerator.backward(model(batch).loss)\n"
            + "print(model.module.config)\n",
            7,
            7,
        ),
        Example(  # DeepSpeed turned on by the script's own flag: a run without it (one
            # process) gets the model itself, which has no ``module``
            "import torch\nfrom accelerate import Accelerator, DeepSpeedPlugin\n"
            + "plugin = DeepSpeedPlugin(zero_stage=2) if args.deepspeed else None\n"
            + "accelerator = Accelerator(deepspeed_plugin=plugin)\n"
            + "model, opt, loader = accelerator.prepare(model, opt, loader)\n"
            + "accelerator.backward(model(batch).loss)\n"
            + "if accelerator.is_main_process:\n"
            + "    torch.save(model.module.state_dict(), 'ckpt.pt')\n",
            8,
            16,
        ),
        Example(  # the DeepSpeed Accelerator in one arm of the flag's test, a plain one in the
            # other: a run without the flag (one process) gets the model itself
            "import torch\nfrom accelerate import Accelerator, DeepSpeedPlugin\n"
            + "if args.zero:\n"
            + "    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))\n"
            + "else:\n    accelerator = Accelerator()\n"
            + "model, opt, loader = accelerator.prepare(model, opt, loader)\n"
            + "accelerator.backward(model(batch).loss)\n"
            + "print(model.module.config)\n",
            9,
            7,
        ),
        Example(  # the same test in the script's own factory of its Accelerator
            "import torch\nfrom accelerate import Accelerator, DeepSpeedPlugin\n"
            + "def get_accelerator(args):\n"
            + "    if args.deepspeed:\n"
            + "        return Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))\n"
            + "    return Accelerator()\n"
            + "accelerator = get_accelerator(args)\n"
            + "model, opt, loader = accelerator.prepare(model, opt, loader)\n"
            + "accelerator.backward(model(batch).loss)\n"
            + "print(model.module.config)\n",
            10,
            7,
        ),
        Example(  # two trainers: the DeepSpeed one's Accelerator does not wrap the plain one's
            "import torch\nfrom accelerate import Accelerator, DeepSpeedPlugin\n"
            + "def train_with_deepspeed(model, opt, loader):\n"
            + "    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))\n"
            + "    model, opt, loader = accelerator.prepare(model, opt, loader)\n"
            + "    accelerator.backward(model(batch).loss)\n"
            + "def train_plain(model, opt, loader):\n"
            + "    accelerator = Accelerator()\n"
            + "    model, opt, loader = accelerator.prepare(model, opt, loader)\n"
            + "    accelerator.backward(model(batch).loss)\n"
            + "    print(model.module.config)\n",
            11,
            11,
        ),
        Example(  # PixArt-alpha's train(): the module's prepared model read through the
            # wrapper's module in a function the main block calls after ``prepare``; the file
            # also names FSDP, whose wrapper has ``module`` too, but one process gets neither
            _GLOBAL_MODEL.format(rebind=""),
            10,
            23,
        ),
        # without FSDP, the model's own attribute read through the wrapper there
        Example(_plain_global_model(""), 10, 23),
        # ... in a function the module defines under an ``if`` and calls there
        Example(_MODEL_READ_IN_A_FUNCTION_UNDER_AN_IF.format(rebind=""), 14, 17),
        # the trainer kept the prepared model by a tuple assignment: its constructor's read
        # and its step's are both the wrapper's
        Example(_TUPLE_KEPT_TRAINER.format(read="self.model.GAT.causal_matrix"), 8, 20),
        Example(_TUPLE_KEPT_TRAINER.format(read="self.model.GAT.causal_matrix"), 12, 17),
        # a model of an imported class: its parameters go to an optimizer, or the file unwraps
        # it (cgftp loads its weights through unwrap_model), so prepare wrapped a module
        Example(
            _IMPORTED_CLASS_MODEL.format(
                shows="optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            ),
            8,
            12,
        ),
        Example(
            _IMPORTED_CLASS_MODEL.format(
                shows="accelerator.unwrap_model(model).load_state_dict(torch.load(path))\n"
            ),
            8,
            12,
        ),
        # a base trainer's prepare() hands everything to its accelerator's
        Example(_BASE_PREPARE.format(body="self.accelerator.prepare(*args)"), 20, 16),
        Example(  # qiuqiangkong/audio_understanding: an encoder from an imported helper, never
            # called itself, only through the wrapper's module
            HEADER
            + "from train import get_audio_encoder\n"
            + "encoder = get_audio_encoder(configs)\n"
            + "encoder, llm, opt, loader = accelerator.prepare(encoder, llm, opt, loader)\n"
            + "for audio in loader:\n"
            + "    latent = encoder.module.encode(audio=audio)\n"
            + "    accelerator.backward(llm(latent).loss)\n",
            7,
            14,
        ),
        Example(  # Asad-Ismail/Grounding-Dino-FineTuning: the prepared model handed back to its
            # trainer object, then read through that attribute
            HEADER
            + "model, opt, loader = accelerator.prepare(trainer.model, trainer.optimizer, loader)\n"
            + "trainer.model = model\n"
            + "for images, captions in loader:\n"
            + "    outputs = trainer.model(images, captions=captions)\n"
            + "    loss = trainer.criterion(outputs, tokenizer=trainer.model.tokenizer)\n"
            + "    accelerator.backward(loss)\n",
            7,
            49,
        ),
        Example(  # an image-fusion PPO script: the prepared model handed to its evaluation
            # helper, which calls the model's own encode through the wrapper
            HEADER
            + "import torch\n\n\n"
            + "def evaluate(accelerator, model, loader):\n"
            + "    for a, b in loader:\n"
            + "        mu = model.encode(a, b)\n"
            + "        accelerator.gather_for_metrics(mu)\n\n\n"
            + "model = torch.nn.Linear(4, 4)\n"
            + "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            + "model, opt, loader = accelerator.prepare(model, opt, loader)\n"
            + "accelerator.backward(model(x).sum())\n"
            + "evaluate(accelerator, model, loader)\n",
            8,
            14,
        ),
        # a trainer that builds its model by class name (``getattr(transformers, cls)``) and
        # only ever samples from it: prepared beside an optimizer over its parameters
        Example(
            _GENERATING_TRAINER.format(
                made="getattr(transformers, cls).from_pretrained(name)", model="self.model"
            ),
            14,
            16,
        ),
        # the same, its optimizer made elsewhere: loaded by from_pretrained, so a model
        Example(
            _GENERATING_TRAINER.format(
                made="transformers.AutoModel.from_pretrained(name)", model="self.model"
            ).replace("AdamW(model.parameters(), lr=1e-5)", "AdamW(params, lr=1e-5)"),
            14,
            16,
        ),
        # main saves and samples through the trainer's attribute after training
        Example(
            _DRIVEN_TRAINER + "    trainer.model.save_pretrained('out')\n",
            18,
            5,
        ),
        # the trainer handed to a helper: the parameter is the same instance
        Example(
            _DRIVEN_TRAINER + "    finish(trainer)\n\n\n"
            "def finish(trainer):\n    trainer.model.save_pretrained('out')\n",
            22,
            5,
        ),
        # made by a factory, and the model read through a local bound to the attribute
        Example(
            _DRIVEN_TRAINER.replace("trainer = Trainer('gpt2')", "trainer = make('gpt2')")
            + "    model = trainer.model\n    print(model.config)\n\n\n"
            "def make(name):\n    return Trainer(name)\n",
            19,
            11,
        ),
        # a runner that holds the trainer as self.trainer
        Example(
            _DRIVEN_TRAINER
            + "    Runner().sample(ids)\n\n\nclass Runner:\n    def __init__(self):\n"
            "        self.trainer = Trainer('gpt2')\n\n"
            "    def sample(self, ids):\n        return self.trainer.model.generate(ids)\n",
            26,
            16,
        ),
        # the same runner made by another module of the project (``from runner import
        # Runner``): nothing in this file names it, but it holds a trainer with an accelerator
        Example(
            _DRIVEN_TRAINER + "\n\nclass Runner:\n    def __init__(self):\n"
            "        self.trainer = Trainer('gpt2')\n\n"
            "    def sample(self, ids):\n        return self.trainer.model.generate(ids)\n",
            25,
            16,
        ),
        # a method of the trainer that returns the wrapper
        Example(
            _DRIVEN_TRAINER.replace(
                "\n\ndef main", "    def get_model(self):\n        return self.model\n\n\ndef main"
            )
            + "    trainer.get_model().save_pretrained('out')\n",
            20,
            5,
        ),
        # a research repo's base trainer: the model it is handed is prepared in construction
        # and known as one by its evaluation's eval(), then asked for the model's own loss
        Example(
            "import torch\nfrom accelerate import Accelerator\n\n\n"
            "class BaseTrainer:\n"
            "    def __init__(self, model, optimizer, loader, args):\n"
            "        self.args = args\n"
            "        self.accelerator = Accelerator(gradient_accumulation_steps=args.accumulate)\n"
            "        self.model, self.optimizer, self.loader = self.accelerator.prepare(\n"
            "            model, optimizer, loader\n"
            "        )\n\n"
            "    @torch.no_grad()\n"
            "    def evaluate(self):\n"
            "        self.model.eval()\n"
            "        for batch in self.loader:\n"
            "            outputs = self.model.compute_loss(**batch)\n",
            17,
            23,
        ),
        # a cycle trainer hands the member it prepared in construction (never called by its own
        # name) to a method that runs it as the generator: the parameter is the wrapper
        Example(_CYCLE.format(generator="model_gen"), 18, 21),
        # a teacher frozen in its own function under the same local name: the student
        # prepared in main() trains, so it is wrapped
        Example(
            HEADER
            + "import torch\nimport torchvision\n\n\n"
            + "def make_teacher():\n"
            + "    model = torchvision.models.resnet50()\n"
            + "    model.requires_grad_(False)\n"
            + "    return model\n\n\n"
            + "def main(loader):\n"
            + "    teacher = make_teacher()\n"
            + "    model = torchvision.models.resnet18()\n"
            + "    optimizer = build_optimizer(model)\n"
            + "    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + "    print(model.fc.weight.shape)\n",
            18,
            11,
        ),
        # prepare_model wraps as prepare does (a model prepared on its own, then generating)
        Example(
            HEADER
            + "model = accelerator.prepare_model(model)\n"
            + "optimizer, loader = accelerator.prepare(optimizer, loader)\n"
            + "for batch in loader:\n    accelerator.backward(model(batch))\n"
            + "out = model.generate(ids)\n",
            7,
            7,
        ),
    )
    good = (
        # lintreal41 (a TTS GRPO trainer): the reference model a method of the trainer builds
        # and freezes (``for p in copy.parameters(): p.requires_grad = False``) is prepared
        # unwrapped (no DistributedDataParallel without a parameter that trains): its own
        # ``forward_rl`` is there
        "import copy\nimport torch\nfrom accelerate import Accelerator\n\n\n"
        "class GRPOTrainer:\n"
        "    def __init__(self, model, ref_model=None):\n"
        "        self.accelerator = Accelerator()\n"
        "        self.model = model\n"
        "        self.optimizer = torch.optim.AdamW(model.parameters())\n"
        "        self.model, self.optimizer = self.accelerator.prepare(\n"
        "            self.model, self.optimizer\n"
        "        )\n"
        "        self.ref_model = self._init_ref_model(ref_model)\n"
        "        self.ref_model = self.accelerator.prepare(self.ref_model)\n\n"
        "    def _init_ref_model(self, ref_model):\n"
        "        if ref_model is not None:\n"
        "            return ref_model\n"
        "        model_copy = copy.deepcopy(self.accelerator.unwrap_model(self.model))\n"
        "        for param in model_copy.parameters():\n"
        "            param.requires_grad = False\n"
        "        return model_copy\n\n"
        "    def train(self, loader):\n"
        "        for batch in loader:\n"
        "            with torch.no_grad():\n"
        "                ref = self.ref_model.forward_rl(batch)\n"
        "            loss = (self.model(batch) - ref).pow(2).mean()\n"
        "            self.accelerator.backward(loss)\n"
        "            self.optimizer.step()\n",
        # ... and a lambda its own parameter's
        "from accelerate import Accelerator\n\n\n"
        "def main(model, optimizer, loader, registry):\n"
        "    accelerator = Accelerator()\n"
        "    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        "    best = max(registry, key=lambda model: model.score)\n"
        "    for batch in loader:\n"
        "        accelerator.backward(model(**batch).loss)\n"
        "        optimizer.step()\n"
        "    return accelerator.unwrap_model(model).generate(max_new_tokens=3), best\n",
        # review10b: the comprehension reads its own item's member, not the wrapper's
        "from accelerate import Accelerator\n\n\n"
        "def main(model, optimizer, loader, registry):\n"
        "    accelerator = Accelerator()\n"
        "    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        "    names = [model.name for model in registry]\n"
        "    for batch in loader:\n"
        "        accelerator.backward(model(**batch).loss)\n"
        "        optimizer.step()\n"
        "    return accelerator.unwrap_model(model).generate(max_new_tokens=3), names\n",
        # a later loop's target, nested or not, binds `model` anew to the plain module
        _NESTED_TARGETS.format(
            after="for (model, tag), z in [((net, 'raw'), 1)]:\n    print(model.weight)\n"
        ),
        _NESTED_TARGETS.format(
            after="for i, model in enumerate([net]):\n    print(model.weight)\n"
        ),
        _NESTED_TARGETS.format(
            after="for i, (model, tag) in enumerate([(net, 'raw')]):\n    print(model.weight)\n"
        ),
        # functions that bind ``model`` themselves (a default, a comprehension's, a lambda's
        # parameter, a walrus, ``except ... as``, a ``case`` capture, a local import, a loop's
        # name): none of them reads the module's prepared model
        "from accelerate import Accelerator\n\n\n"
        "def report(model=None):\n    print(model.config)\n\n\n"
        "def comp():\n    return [model.config for model in models]\n\n\n"
        "def lam():\n    return lambda model: model.config\n\n\n"
        "def walrus():\n    if (model := get()) is not None:\n        return model.config\n\n\n"
        "def excepted():\n    try:\n        pass\n    except Exception as model:\n"
        "        return model.config\n\n\n"
        "def matched(x):\n    match x:\n        case {'m': model}:\n"
        "            return model.config\n\n\n"
        "def imported():\n    from transformers import AutoModel as model\n"
        "    print(model.config)\n\n\n"
        "def looped():\n    for i, (name, model) in enumerate(zoo.items()):\n        pass\n"
        "    print(model.config)\n\n\n"
        "accelerator = Accelerator()\n"
        "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        "for x, y in loader:\n"
        "    accelerator.backward(model(x).sum())\n"
        "    optimizer.step()\n"
        "report(); comp(); lam(); walrus(); excepted(); matched(1); imported(); looped()\n",
        # the one call of the function that reads ``model.module`` is under a test that the
        # run has several processes: the wrapper is there whenever it runs
        "from accelerate import Accelerator\n\n\n"
        "def log():\n    print(model.module.h)\n\n\n"
        "accelerator = Accelerator()\n"
        "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        "if accelerator.num_processes > 1:\n    log()\n",
        # the base trainer's prepare() moves to the device: the model is no wrapper
        _BASE_PREPARE.format(body="tuple(a.to(self.accelerator.device) for a in args)"),
        # without FSDP, the model's own attribute read where the main block unwrapped the
        # model again before the call
        _plain_global_model("    model = accelerator.unwrap_model(model)\n"),
        # ... and in the function under an ``if``, the model unwrapped before the call
        _MODEL_READ_IN_A_FUNCTION_UNDER_AN_IF.format(
            rebind="    model = accelerator.unwrap_model(model)\n"
        ),
        # the tuple-kept trainer reading its model through unwrap_model
        _TUPLE_KEPT_TRAINER.format(
            read="self.accelerator.unwrap_model(self.model).GAT.causal_matrix"
        ).replace("        self.cum = self.model.GAT.causal_matrix.detach().clone()\n", ""),
        # an object of an imported class that nothing shows to be a module (a tokenizer, a
        # sampler): prepare hands it back as it is
        _IMPORTED_CLASS_MODEL.format(shows=""),
        # a reference model frozen in the function that prepares it: prepare leaves it as is
        HEADER
        + "import torchvision\n\n\n"
        + "def main(loader):\n"
        + "    model = torchvision.models.resnet50()\n"
        + "    for p in model.parameters():\n"
        + "        p.requires_grad = False\n"
        + "    model, loader = accelerator.prepare(model, loader)\n"
        + "    print(model.fc.weight.shape)\n",
        # a frozen reference model read through the same helper: prepare wraps no model
        # without a parameter that requires grad, so its own config is there
        HEADER
        + "import torch\n"
        + "from transformers import AutoModelForCausalLM\n"
        + "policy = AutoModelForCausalLM.from_pretrained('gpt2')\n"
        + "ref_model = AutoModelForCausalLM.from_pretrained('gpt2')\n"
        + "def log_probs(model, ids):\n"
        + "    ids = ids[:, : model.config.max_position_embeddings]\n"
        + "    return model(ids).logits.log_softmax(-1)\n"
        + "for param in ref_model.parameters():\n"
        + "    param.requires_grad = False\n"
        + "optimizer = torch.optim.AdamW(policy.parameters())\n"
        + "policy, ref_model, optimizer = accelerator.prepare(policy, ref_model, optimizer)\n"
        + "for ids in loader:\n"
        + "    with torch.no_grad():\n"
        + "        ref = log_probs(ref_model, ids)\n"
        + "    loss = (policy(ids).logits.log_softmax(-1) - ref).mean()\n"
        + "    accelerator.backward(loss)\n"
        + "    optimizer.step()\n",
        HEADER
        + "from transformers import AutoModelForSequenceClassification as Scorer\n"
        + "reward_model = Scorer.from_pretrained('rm', num_labels=1)\n"
        + "reward_model.requires_grad_(False)\n"
        + "reward_model, loader = accelerator.prepare(reward_model, loader)\n"
        + "limit = reward_model.config.max_position_embeddings\n",
        # the same method given the model itself through unwrap_model
        _CYCLE.format(generator="self.accelerator.unwrap_model(model_gen)"),
        # the pipeline gets the model itself
        _PIPELINE.format(unet="accelerator.unwrap_model(model)"),
        # a module-level trainer, and a function's own loop variable of the same name: the
        # trainers it is handed are not shown to be prepared
        _DRIVEN_TRAINER
        + "\n\ntrainer = Trainer('gpt2')\n\n\n"
        + "def report(trainers, ids):\n    for trainer in trainers:\n"
        + "        print(trainer.model.generate(ids))\n",
        # a helper handed a trainer here, and an object that prepared nothing there; a runner
        # whose trainer's model is bound again to the plain model; a method that unwraps
        _DRIVEN_TRAINER.replace(
            "\n\ndef main",
            "    def get_model(self):\n"
            "        return self.accelerator.unwrap_model(self.model)\n\n\ndef main",
        )
        + "    finish(trainer)\n    finish(Plain())\n    trainer.get_model().save_pretrained('o')\n"
        + "    other = Trainer('gpt2')\n"
        + "    other.model = other.accelerator.unwrap_model(other.model)\n"
        + "    finish_plain(other)\n\n\n"
        + "class Plain:\n    def __init__(self):\n"
        + "        self.model = AutoModelForCausalLM.from_pretrained('gpt2')\n\n\n"
        + "def finish(trainer):\n    trainer.model.save_pretrained('out')\n\n\n"
        + "def finish_plain(trainer):\n    trainer.model.save_pretrained('out')\n\n\n"
        + "class Runner:\n    def __init__(self):\n        self.trainer = Trainer('gpt2')\n\n"
        + "    def done(self):\n        t = self.trainer\n"
        + "        self.trainer.model = t.accelerator.unwrap_model(self.trainer.model)\n\n"
        + "    def sample(self, ids):\n        return self.trainer.model.generate(ids)\n",
        # the trainer's own accelerator unwraps the model main reads, or main binds it again
        _DRIVEN_TRAINER
        + "    trainer.accelerator.unwrap_model(trainer.model).save_pretrained('out')\n"
        + "    trainer.model = trainer.accelerator.unwrap_model(trainer.model)\n"
        + "    trainer.model.generate(ids)\n",
        # a trainer sampling through the unwrapped model
        _GENERATING_TRAINER.format(
            made="getattr(transformers, cls).from_pretrained(name)",
            model="self.accelerator.unwrap_model(self.model)",
        ),
        # the model's own methods before the prepare, and after construction through a name
        # bound again to the model itself
        _LORA_TRAINER
        + "    def save_model(self, path):\n"
        + "        self.unet = self.accelerator.unwrap_model(self.unet)\n"
        + "        self.unet.save_pretrained(path)\n",
        # a helper given the model itself at every call: unwrap_model ran in the caller
        HEADER
        + "import torch\n\n\n"
        + "def sample(net, cond):\n"
        + "    return net.generate(cond)\n\n\n"
        + "model = torch.nn.Linear(4, 4)\n"
        + "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "model, opt = accelerator.prepare(model, opt)\n"
        + "accelerator.backward(model(x).sum())\n"
        + "sample(accelerator.unwrap_model(model), cond)\n"
        + "sample(model, cond) if accelerator.num_processes == 1 else None\n",
        # a frozen teacher unwrapped in the training step: no optimizer trains it
        HEADER
        + "import torch\n"
        + "model, teacher = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)\n"
        + "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "model, teacher, optimizer = accelerator.prepare(model, teacher, optimizer)\n"
        + "for x, y in loader:\n"
        + "    target = accelerator.unwrap_model(teacher)(x)\n"
        + "    loss = (model(x) - target.detach()).pow(2).mean()\n"
        + "    accelerator.backward(loss)\n"
        + "    optimizer.step()\n",
        # the model's own validation_step through unwrap_model under no_grad: nothing of it
        # reaches a backward
        HEADER
        + _STEP_MODEL
        + "for i, (x, y) in enumerate(loader):\n"
        + "    accelerator.backward(torch.nn.functional.mse_loss(model(x), y))\n"
        + "    optimizer.step()\n"
        + "    with torch.no_grad():\n"
        + "        accelerator.unwrap_model(model).validation_step((x, y), i)\n",
        # the unwrapped model sampled under no_grad inside the training loop
        HEADER
        + "import torch\n"
        + "model = torch.nn.Linear(4, 1)\n"
        + "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "model, optimizer = accelerator.prepare(model, optimizer)\n"
        + "for x, y in loader:\n"
        + "    with torch.no_grad():\n"
        + "        sample = accelerator.unwrap_model(model)(x)\n"
        + "    accelerator.backward((model(x) - y).pow(2).mean())\n"
        + "    optimizer.step()\n",
        # the trainer handed the plain model back: its own attributes are there
        HEADER
        + "model, opt, loader = accelerator.prepare(trainer.model, trainer.optimizer, loader)\n"
        + "trainer.model = accelerator.unwrap_model(model)\n"
        + "plain = accelerator.unwrap_model(model)\n"
        + "trainer.head = plain\n"
        + "trainer.criterion(trainer.model(x), trainer.model.tokenizer, trainer.head.config)\n",
        # what prepare returned for several objects, indexed; a test that chooses the wrapper
        HEADER
        + "objs = accelerator.prepare(model, optimizer)\nfirst = objs[0]\n"
        + "net = accelerator.prepare(model)\n"
        + "head = net.module[1] if accelerator.num_processes > 1 else net[1]\n",
        HEADER
        + "model = accelerator.prepare(model)\n"
        + "sample = accelerator.unwrap_model(model).generate(prime)\n"
        + "model.train()\nparams = model.parameters()\nwith model.no_sync():\n    pass\n",
        # bound again to the model itself before the call
        HEADER
        + "unet = accelerator.prepare(unet)\n"
        + "unet = accelerator.unwrap_model(unet)\nunet.save_pretrained('out')\n",
        # a branch only DeepSpeed takes: its engine forwards attributes to the model
        "from accelerate import Accelerator, DistributedType\naccelerator = Accelerator()\n"
        + "model = accelerator.prepare(model)\nloss = model(batch)\n"
        + "if accelerator.distributed_type == DistributedType.DEEPSPEED:\n"
        + "    model.save_16bit_model('out')\n    print(model.config)\n",
        # written for DeepSpeed (its config-file optimizer): the engine answers the model's
        # attributes (EasyContext's train.py)
        "from accelerate import Accelerator\nfrom accelerate.utils import DummyOptim\n"
        + "accelerator = Accelerator()\noptim = DummyOptim(model.parameters(), lr=1e-5)\n"
        + "model, optim = accelerator.prepare(model, optim)\n"
        + "model.gradient_checkpointing_enable()\n",
        # DeepSpeed on every run (its plugin built unconditionally, or its config-file
        # optimizer): Accelerate wraps the model in DeepSpeed's engine on one process too, and
        # the engine's ``module`` is the model
        "import torch\nfrom accelerate import Accelerator, DeepSpeedPlugin\n"
        + "plugin = DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=1)\n"
        + "accelerator = Accelerator(deepspeed_plugin=plugin)\n"
        + "model, opt, loader = accelerator.prepare(model, opt, loader)\n"
        + "accelerator.backward(model(batch).loss)\n"
        + "if accelerator.is_main_process:\n"
        + "    torch.save(model.module.state_dict(), 'ckpt.pt')\n",
        # the same, the names imported under other names
        "import torch\nfrom accelerate import Accelerator as A, DeepSpeedPlugin as P\n"
        + "acc = A(deepspeed_plugin=P(zero_stage=3))\n"
        + "model, opt, loader = acc.prepare(model, opt, loader)\n"
        + "acc.backward(model(batch).loss)\n"
        + "print(model.module.config)\n",
        "import torch\nfrom accelerate import Accelerator\n"
        + "from accelerate.utils import DummyOptim\n"
        + "accelerator = Accelerator()\noptim = DummyOptim(model.parameters(), lr=1e-5)\n"
        + "model, optim = accelerator.prepare(model, optim)\n"
        + "accelerator.backward(model(batch).loss)\n"
        + "print(model.module.config)\n",
        # a test chooses the wrapper's module or the model itself
        HEADER
        + "model = accelerator.prepare(model)\n"
        + "accelerator.backward(model(batch).loss)\n"
        + "net = model.module if hasattr(model, 'module') else model\n"
        + "if accelerator.num_processes > 1:\n    weights = model.module.state_dict()\n",
        # RandAR's visualisation: the wrapper's module when there is one, else the model
        HEADER
        + "model = accelerator.prepare(model)\n"
        + "accelerator.backward(model(batch).loss)\n"
        + "if hasattr(model, 'module'):\n    gen = model.module.generate(cond)\n"
        + "else:\n    gen = model.generate(cond)\n"
        + "if not hasattr(model, 'module'):\n    model.remove_caches()\n",
        # the read only where a test found the attribute on that object (a teacher-correction
        # trainer's tokenizer, lerobot's policy update, a guard in an expression): the wrapper
        # fails the test, nothing raises
        "from accelerate import Accelerator\n\n\nclass Trainer:\n"
        + "    def __init__(self, model, optimizer):\n"
        + "        self.accelerator = Accelerator()\n"
        + "        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)\n\n"
        + "    def train(self, batch):\n"
        + "        self.accelerator.backward(self.model(**batch).loss)\n\n"
        + "    def save_model(self, out):\n"
        + "        if self.accelerator.is_main_process:\n"
        + "            self.accelerator.unwrap_model(self.model).save_pretrained(out)\n"
        + "            if hasattr(self.model, 'tokenizer'):\n"
        + "                self.model.tokenizer.save_pretrained(out)\n",
        HEADER
        + "policy, optimizer = accelerator.prepare(policy, optimizer)\n"
        + "accelerator.backward(policy(batch).loss)\n"
        + "if cfg.ema and has_method(policy, 'update'):\n    policy.update()\n"
        + "stats = hasattr(policy, 'stats') and policy.stats()\n",
        # a diffusion trainer's fallback: the wrapper's module where the model's own read fails
        HEADER
        + "model = accelerator.prepare(model)\n"
        + "try:\n    channels = model.config.out_channels\n"
        + "except AttributeError:\n    channels = model.module.config.out_channels\n"
        + "try:\n    model.save_pretrained('out')\n"
        + "except:\n    accelerator.unwrap_model(model).save_pretrained('out')\n",
        # the mirror (a T5 dialogue trainer): the wrapper's module first, the model itself where
        # a one-process run has no wrapper
        HEADER
        + "model = accelerator.prepare(model)\n"
        + "try:\n    out = model.module.generate(input_ids=ids)\n"
        + "except:\n    out = model.generate(input_ids=ids)\n",
        # the wrapper's own private state
        HEADER + "model = accelerator.prepare(model)\nhooks = len(model._comm_hooks)\n",
        # an attribute set on the wrapper, and the model's own attributes before prepare
        HEADER
        + "model.gradient_checkpointing_enable()\n"
        + "model, loader = accelerator.prepare(model, loader)\n"
        + "model.name = 'run'\nn = len(loader.dataset)\n",
        # evaluation_mode=True leaves the model unwrapped: an inference class's prepared copy
        # (a spelling corrector's encoder, resized after its prepare_model)
        HEADER
        + "model = accelerator.prepare_model(model, evaluation_mode=True)\n"
        + "loader = accelerator.prepare_data_loader(loader)\n"
        + "model.resize_token_embeddings(len(tokenizer))\n"
        + "preds = [accelerator.gather_for_metrics(model(b).logits) for b in loader]\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        facts = facts_of(script)
        yield from self._handed_to_a_pipeline(script)
        # DeepSpeed's engine and FSDP forward what they lack to the model; ``model.module`` is
        # missing on a one-process run whatever the multi-process run wraps the model in
        engine = _written_for_an_engine(script)
        if not engine:
            yield from self._indexed(script)
            yield from self._forward_past_the_wrapper(script)
        # one finding per attribute of one owner in a statement: ``model.weight.shape,
        # model.weight.dtype`` (or two ``model.module`` in one call) is one bug to fix
        reported: set[tuple[int, str, str]] = set()
        for attribute in facts.placement.attributes():
            found = list(self._attribute(script, facts, engine, attribute))
            if not found:
                continue
            key = (
                id(_statement_of(script, attribute)),
                script.module.code_for_node(attribute.value),
                attribute.attr.value,
            )
            if key not in reported:
                reported.add(key)
                yield from found

    def _attribute(
        self, script: ScriptModel, facts: Facts, engine: bool, attribute: cst.Attribute
    ) -> Iterator[Finding]:
        """The finding on one attribute read of a prepared (or wrapped) model, if any."""
        member = attribute.attr.value
        owner = attribute.value
        if member.startswith("_") or (engine and member != "module"):
            return  # private names: the wrapper's own state (``_comm_hooks``) or the model's
        held = _held_name(script, owner, attribute)
        constructed = held is None and holds_constructed_wrapper(script, owner, attribute)
        if held is None and not constructed:
            return
        if constructed and _frozen_in_its_class(script, dotted(owner), attribute):
            return  # a reference model the trainer froze: prepare left it unwrapped
        if member == "module":
            if isinstance(owner, cst.Name):
                yield from self._module_of_unwrapped(script, attribute, owner.value)
            return
        if member in names.MODULE_API or member in _WRAPPER_OWN:
            return
        if _binds(script, attribute):
            return
        if not constructed and not _prepared_model(
            script, held, attribute, called_as=dotted(owner)
        ):
            if not isinstance(owner, cst.Name):
                return
            if not holds_constructed_wrapper(script, owner, attribute):
                return
            constructed = True  # ``model = trainer.model``: the trainer's wrapper renamed
        if in_unwrapped_branch(script, attribute) or _falls_back(script, attribute):
            return  # ``if hasattr(model, "module"): ... else: model.generate(...)``
        if _tested_for_itself(script, attribute):
            return  # ``if hasattr(self.model, "tokenizer"):``: never read where missing
        if DDP in facts.ranks.backend_guards.reached_by_none(attribute):
            return  # a branch DDP never takes: DeepSpeed's engine, FSDP forward it
        spelled = dotted(owner) or held or script.module.code_for_node(owner)
        chain, rest = _chain(script, owner, attribute)
        call = script.parent(attribute)
        submodule = _submodule_run_in_training(script, facts, chain, {held, dotted(owner)})
        if call in facts.layers_outside_forward or submodule is not None:
            ran = script.module.code_for_node(submodule or attribute)
            yield self.finding(
                script,
                attribute,
                None,
                f"{ran}() runs the model's layers outside its forward during "
                f"training: on several processes the DistributedDataParallel wrapper has no "
                f"'{member}' (AttributeError), and called through unwrap_model its gradients "
                f"are never synchronised across ranks; compute it in the model's forward() "
                f"and call {spelled}(...)",
            )
            return
        accelerator = _accelerator_for(script, owner, attribute, constructed)
        rest = " ".join(rest.split())  # a subscript written over several lines: one line
        through = (
            f"{accelerator}.unwrap_model({spelled}){rest}"
            if accelerator is not None
            else f"unwrap_model({spelled}){rest} of the Accelerator that prepared it"
        )
        if (
            isinstance(call, cst.Call)
            and call.func is attribute
            and in_training_step(script, facts.placement, call)
            and not defined_by_a_module_class(script, member)
            and ({held, dotted(owner)} & _trained_models(script))
        ):
            # a method of a class this file cannot read, on a model an optimizer trains, in
            # a training step: through unwrap_model the layers it may run would train
            # unsynchronised (a frozen encoder's ``encode`` is plain unwrap_model advice)
            yield self.finding(
                script,
                attribute,
                None,
                f"{spelled}.{member}() runs on the DistributedDataParallel wrapper in a "
                f"training step: on several processes it has no '{member}' "
                f"(AttributeError). If it runs the model's layers, compute it in the model's "
                f"forward() and call {spelled}(...) (through unwrap_model their gradients "
                f"are never synchronised across ranks); if it does not, call {through}",
            )
            return
        yield self.finding(
            script,
            attribute,
            None,
            f"Call this through {through}: on "
            f"several processes prepare wraps {spelled} in DistributedDataParallel, which has "
            f"no '{member}' (AttributeError); a one-process run has no wrapper and hides it",
        )

    def _forward_past_the_wrapper(self, script: ScriptModel) -> Iterator[Finding]:
        """``raw_model = accelerator.unwrap_model(model)`` then ``raw_model(...)`` in a training
        step: the model's own forward, called past the DistributedDataParallel wrapper, leaves
        this step's gradients unreduced on every rank (each replica trains on its own shard and
        they drift apart, silently); the forward belongs to the prepared model itself."""
        trained = _trained_models(script)
        for call, model in facts_of(script).unwrapped_forwards.items():
            if model not in trained:
                continue  # a frozen teacher: nothing of its gradients is ever used
            if isinstance(call.func, cst.Attribute):
                member = call.func.attr.value
                yield self.finding(
                    script,
                    call,
                    None,
                    f"{member}() of the model unwrap_model returns runs {model}'s layers past "
                    "the DistributedDataParallel wrapper in this training step: on several "
                    "processes their gradients are never averaged across ranks and the replicas "
                    f"drift apart; compute it in the model's forward() and call the prepared "
                    f"{model}(...)",
                )
                continue
            yield self.finding(
                script,
                call,
                None,
                f"Call the prepared {model}(...) here, not the model unwrap_model returns: this "
                "training step's forward then runs past the DistributedDataParallel wrapper, "
                "so on several processes its gradients are never averaged across ranks and the "
                "replicas drift apart",
            )

    def _handed_to_a_pipeline(self, script: ScriptModel) -> Iterator[Finding]:
        """What ``prepare`` returned handed to a diffusers pipeline (``DDPMPipeline(unet=model,
        ...)``, ``StableDiffusionPipeline.from_pretrained(path, unet=unet)``): the pipeline
        reads the model's own attributes (``unet.config`` when it runs: AttributeError on the
        wrapper), and its ``save_pretrained`` finds no save method for a wrapper's class
        (DistributedDataParallel, DeepSpeed's engine): it leaves the component out of what it
        saves, with a warning only. A one-process run gets the model itself and hides it."""
        for call in script.calls:
            built = (dotted(call.func) or "").split(".")
            if not (
                built[-1].endswith("Pipeline")
                or (
                    len(built) > 1
                    and built[-1] == "from_pretrained"
                    and built[-2].endswith("Pipeline")
                )
            ):
                continue
            for argument in call.args:
                value = argument.value
                if argument.star or not isinstance(value, cst.Name):
                    continue
                if not _prepared_model(script, value.value, call) or _wrapper_tested(script, call):
                    continue
                accelerator = accelerator_at(script, call) or "accelerator"
                yield self.finding(
                    script,
                    value,
                    None,
                    f"Hand the pipeline {accelerator}.unwrap_model({value.value}): on several "
                    f"processes prepare wraps {value.value} (DistributedDataParallel), and the "
                    f"pipeline reads the model's own attributes ({value.value}.config when it "
                    "runs: AttributeError) while its save_pretrained finds no way to save the "
                    "wrapper and leaves this component out of the saved pipeline (a warning "
                    "only); a one-process run has no wrapper and hides it",
                )

    def _indexed(self, script: ScriptModel) -> Iterator[Finding]:
        """``model[1]`` on what ``prepare`` returned (a ``Sequential`` or ``ModuleList`` model):
        DistributedDataParallel defines no ``__getitem__`` (TypeError: not subscriptable), and a
        one-process run, which gets the model itself back, hides it (a re-ID trainer saved
        ``model[1].state_dict()`` after every epoch)."""
        for subscript in script.index.of_type(cst.Subscript):
            owner = subscript.value if isinstance(subscript, cst.Subscript) else None
            if not isinstance(owner, cst.Name) or _binds(script, subscript):
                continue
            if not _prepared_model(script, owner.value, subscript):
                continue
            if _wrapper_tested(script, subscript):
                continue
            if DDP in facts_of(script).ranks.backend_guards.reached_by_none(subscript):
                continue
            accelerator = accelerator_name(script, subscript)
            item = script.module.code_for_node(subscript).removeprefix(owner.value)
            yield self.finding(
                script,
                subscript,
                None,
                f"Index {accelerator}.unwrap_model({owner.value}){item} instead: on several "
                f"GPUs prepare wraps {owner.value} in DistributedDataParallel, which cannot be "
                "indexed (TypeError: not subscriptable); a one-process run has no wrapper and "
                "hides it",
            )

    def _module_of_unwrapped(
        self, script: ScriptModel, attribute: cst.Attribute, owner: str
    ) -> Iterator[Finding]:
        """``model.module.state_dict()`` on what ``prepare`` returned: only the multi-process
        wrapper has ``module``; one process gets the model itself back (U-DiT's checkpoint
        save). Not where a test chooses (``model.module if hasattr(model, "module") else
        model``, ``if accelerator.num_processes > 1:``)."""
        if _binds(script, attribute):
            return
        if not _prepared_model(script, owner, attribute, unknown_is_model=True):
            return
        if _wrapper_tested(script, attribute) or _falls_back(script, attribute):
            return
        if _wrapper_tested_at_every_call(script, attribute):
            return  # ``if accelerator.num_processes > 1: log()``: the test chooses at the call
        if _every_run_deepspeed(script) or _factories_deepspeed_on_every_run(script):
            return  # DeepSpeed's engine wraps the model on every run, one process included
        accelerator = accelerator_name(script, attribute)
        backends = backends_in_view(script)
        if DEEPSPEED in backends:
            wrapped = (
                f"prepare wraps {owner} in DeepSpeed's engine on a DeepSpeed run and in "
                "DistributedDataParallel on several processes, but a one-process run without "
                "DeepSpeed gets the model itself back"
            )
        elif FSDP in backends:
            wrapped = (
                f"prepare wraps {owner} in FSDP (version 1) on a launched FSDP run and in "
                "DistributedDataParallel on several processes, but FSDP2 (fully_shard) shards "
                "the model in place and a plain one-process run gets the model itself back"
            )
        elif not _builds_an_accelerator(script):
            # the Accelerator comes from elsewhere (a factory of another module), which may
            # set up DeepSpeed or FSDP: not "DDP only"
            wrapped = (
                f"prepare wraps {owner} in DistributedDataParallel on several processes (in "
                "DeepSpeed's engine or FSDP where the Accelerator, built elsewhere, sets them "
                "up), but a plain one-process run gets the model itself back"
            )
        else:
            wrapped = (
                f"prepare wraps {owner} in DistributedDataParallel only when several processes "
                "run, and a one-process run gets the model itself back"
            )
        yield self.finding(
            script,
            attribute,
            None,
            f"Use {accelerator}.unwrap_model({owner}) instead of {owner}.module: {wrapped}, "
            "which has no 'module' (AttributeError)",
        )


def _chain(
    script: ScriptModel, owner: cst.BaseExpression, attribute: cst.Attribute
) -> tuple[cst.BaseExpression, str]:
    """The attributes and items read from ``owner`` through ``attribute``, up to a method
    called on them (``model.blocks[0]`` of ``model.blocks[0].attn(x)``, ``model.blocks[0].attn``
    read as it is, ``model.embeddings.weight`` of ``...weight.detach()``), and what it reads
    past ``owner``, as written (``.blocks[0]``): the advice unwraps the owner and keeps the
    rest."""
    node: cst.BaseExpression = attribute
    while True:
        parent = script.parent(node)
        if (isinstance(parent, cst.Subscript) and parent.value is node) or (
            isinstance(parent, cst.Attribute)
            and parent.value is node
            and not _called(script, parent)
        ):
            node = parent
        else:
            break
    written, start = script.module.code_for_node(node), script.module.code_for_node(owner)
    rest = written[len(start) :] if written.startswith(start) else f".{attribute.attr.value}"
    return node, rest


def _called(script: ScriptModel, node: cst.BaseExpression) -> bool:
    parent = script.parent(node)
    return isinstance(parent, cst.Call) and parent.func is node


def _submodule_run_in_training(
    script: ScriptModel, facts: Facts, chain: cst.BaseExpression, models: set[str | None]
) -> cst.BaseExpression | None:
    """``model.blocks[0](x)``, ``model.layers[2].mlp(x)``: an item of a module container of a
    model an optimizer trains, called (or one of its members called) in a training step. An
    item of a container is a module, so the call runs layers outside the model's forward:
    through unwrap_model their gradients are never synchronised. What is called, or None."""
    if not any(isinstance(n, cst.Subscript) for n in walk(chain)):
        return None
    called: cst.BaseExpression | None = chain if _called(script, chain) else None
    member = script.parent(chain)
    if (
        called is None
        and isinstance(member, cst.Attribute)
        and member.value is chain
        and member.attr.value not in names.MODULE_API
        and _called(script, member)
    ):
        called = member
    if called is None or not (models & _trained_models(script)):
        return None
    call = script.parent(called)
    assert isinstance(call, cst.Call)
    return called if in_training_step(script, facts.placement, call) else None


def _accelerator_for(
    script: ScriptModel, owner: cst.BaseExpression, at: cst.CSTNode, constructed: bool
) -> str | None:
    """The accelerator to unwrap with at ``at``: the one in scope, or for a trainer's model read
    outside its class (``constructed``) the trainer's own (`constructed_accelerator`). None:
    none is reachable from here."""
    found = accelerator_at(script, at)
    if found is not None:
        return found
    return constructed_accelerator(script, owner, at) if constructed else None


#: What a test that chooses between the wrapper and the model reads.
def _wrapper_tested(script: ScriptModel, attribute: cst.Attribute) -> bool:
    """``attribute`` is read under (or beside) a test of whether the model is wrapped or the
    run has several processes: ``hasattr(model, "module")``, ``isinstance(model, DDP)``,
    ``accelerator.num_processes > 1``, ``distributed_type != NO``."""
    for ancestor in script.ancestors(attribute):
        test = None
        if isinstance(ancestor, (cst.If, cst.IfExp, cst.While)):
            test = ancestor.test
        elif isinstance(ancestor, cst.BooleanOperation):
            test = ancestor.left
        if test is None:
            continue
        code = script.module.code_for_node(test)
        if "isinstance(" in code or any(word in code for word in WRAPPER_TESTS):
            return True
    return False


def _wrapper_tested_at_every_call(script: ScriptModel, node: cst.CSTNode, depth: int = 0) -> bool:
    """The function around ``node`` runs only under a test of the wrapper (`_wrapper_tested`):
    every call of it in the file is under one, or in a function whose every call is, and no
    call is hidden from the file (a reference handed on, a method called through an object it
    cannot follow)."""
    graph = script.call_graph
    function = script.index.enclosing_function(node)
    if function is None or depth > 3:
        return False
    calls = [call for call, _ in graph.calls_of(function)]
    if not calls or graph.uncertain_callers(function) or graph.references(function):
        return False
    return all(
        _wrapper_tested(script, call) or _wrapper_tested_at_every_call(script, call, depth + 1)
        for call in calls
    )


def _tested_for_itself(script: ScriptModel, attribute: cst.Attribute) -> bool:
    """``attribute`` is read only where a test found it on that very object: ``if
    hasattr(self.model, "tokenizer"): self.model.tokenizer.save_pretrained(out)``, lerobot's
    ``if has_method(policy, "update"): policy.update()``, ``hasattr(m, "x") and m.x()``. The
    wrapper fails the test, so the read raises no AttributeError there."""
    owner = dotted(attribute.value)
    if owner is None:
        return False
    member = attribute.attr.value
    child: cst.CSTNode = attribute
    for ancestor in script.ancestors(attribute):
        if isinstance(ancestor, (cst.If, cst.IfExp)) and child is ancestor.body:
            tests = [ancestor.test]
        elif isinstance(ancestor, cst.BooleanOperation) and child is ancestor.right:
            tests = [ancestor.left] if isinstance(ancestor.operator, cst.And) else []
        else:
            tests = []
        for test in tests:
            if any(_asks_for(node, owner, member) for node in _conjuncts(test)):
                return True
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
            return False
        child = ancestor
    return False


def _conjuncts(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _conjuncts(test.left) + _conjuncts(test.right)
    return [test]


def _asks_for(test: cst.BaseExpression, owner: str, member: str) -> bool:
    """A call handed the object and the attribute's name: ``hasattr(model, "generate")``."""
    if not isinstance(test, cst.Call) or len(test.args) < 2:
        return False
    first, second = test.args[0].value, test.args[1].value
    return (
        dotted(first) == owner
        and isinstance(second, cst.SimpleString)
        and second.evaluated_value == member
    )


#: What an ``except`` must catch for the wrapper's missing attribute to land in it.
_CATCHES_MISSING = frozenset({"AttributeError", "Exception", "BaseException"})


def _falls_back(script: ScriptModel, attribute: cst.Attribute) -> bool:
    """``attribute`` is one side of a ``try`` that falls back between the model and its wrapper:
    read in the ``try`` body with a handler that catches the AttributeError and reaches the same
    object through the wrapper (``except AttributeError: model.module.config``,
    ``accelerator.unwrap_model(model)``), or ``model.module`` read in such a handler after the
    body read ``model`` directly, or ``model.generate`` read in such a handler after the body
    read ``model.module.generate`` (the one-process run, where ``.module`` is missing, lands
    there), and that ``model.module`` read in the body. A handler that only logs is no
    fallback: the read it swallows is still lost."""
    owner = dotted(attribute.value)
    if owner is None:
        return False
    through_wrapper = (f"{owner}.module", f"unwrap_model({owner})")
    previous: cst.CSTNode = attribute
    for ancestor in script.ancestors(attribute):
        if isinstance(ancestor, cst.Try):
            if contains(ancestor.body, attribute):
                return any(
                    _catches_missing(handler)
                    and (
                        any(
                            word in script.module.code_for_node(handler.body)
                            for word in through_wrapper
                        )
                        or (attribute.attr.value == "module" and _reads_directly(handler, owner))
                    )
                    for handler in ancestor.handlers
                )
            if not (isinstance(previous, cst.ExceptHandler) and _catches_missing(previous)):
                return False
            if attribute.attr.value == "module":
                return any(
                    isinstance(node, cst.Attribute) and dotted(node.value) == owner
                    for node in walk(ancestor.body)
                )
            # the mirror: the body reads through the wrapper (``model.module.generate``), and
            # the handler reads the model directly where there is no wrapper (one process)
            return any(
                isinstance(node, cst.Attribute) and dotted(node) == f"{owner}.module"
                for node in walk(ancestor.body)
            )
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
            return False
        previous = ancestor
    return False


def _reads_directly(handler: cst.ExceptHandler, owner: str) -> bool:
    """The handler reads a member of ``owner`` itself, not through ``.module``
    (``except: out = model.generate(ids)``): the one-process run's side of the fallback."""
    return any(
        isinstance(node, cst.Attribute)
        and dotted(node.value) == owner
        and node.attr.value != "module"
        for node in walk(handler.body)
    )


def _catches_missing(handler: cst.ExceptHandler) -> bool:
    """A bare ``except:``, or one whose types name AttributeError or a base of it."""
    if handler.type is None:
        return True
    kinds = handler.type.elements if isinstance(handler.type, cst.Tuple) else [handler.type]
    for kind in kinds:
        value = kind.value if isinstance(kind, cst.Element) else kind
        spelled = dotted(value) or ""
        if spelled.rsplit(".", 1)[-1] in _CATCHES_MISSING:
            return True
    return False


#: Names that say a script is written for DeepSpeed or FSDP (``DummyOptim`` exists only for
#: DeepSpeed's config-file optimizer; ``fsdp_plugin``, ``FullyShardedDataParallelPlugin``).
_ENGINE_WORDS = ("DummyOptim", "DummyScheduler", "deepspeed", "DeepSpeed", "fsdp", "FSDP",
                 "FullyShardedDataParallel")  # fmt: skip


def _written_for_an_engine(script: ScriptModel) -> bool:
    """The file names DeepSpeed or FSDP in its code: its prepared model is an engine or an
    FSDP module that answers the model's attributes, at least on the runs it was written for."""
    if not any(word in script.source for word in _ENGINE_WORDS):
        return False  # no such word in the text: none in the code (most files end here)
    for node in script.index.of_type(cst.Name):
        if isinstance(node, cst.Name) and any(word in node.value for word in _ENGINE_WORDS):
            return True
    for node in script.index.of_type(cst.Attribute):
        if isinstance(node, cst.Attribute) and any(w in node.attr.value for w in _ENGINE_WORDS):
            return True
    return False


def _factories_deepspeed_on_every_run(script: ScriptModel) -> bool:
    """Every Accelerator of the file comes from a factory of another module of the project
    (``accelerator = build_accelerator()`` of ``setup_accel.py``), and each such factory builds
    it on every run for DeepSpeed (`_every_run_deepspeed` of that function alone): the model is
    DeepSpeed's engine on one process as well, and ``model.module`` is right there too. A file
    that also builds one itself, or holds one it was handed, is not judged here."""
    project = script.project
    load = project.load_alone or project.load if project is not None else None
    bindings = script.of_kind(Kind.ACCELERATOR)
    if project is None or load is None or not bindings or _builds_an_accelerator(script):
        return False
    factories = project.accelerator_factories(script)
    for binding in bindings:
        value = binding.value
        name = dotted(value.func) if isinstance(value, cst.Call) else None
        if binding.received or name is None or name not in factories:
            return False
        qualified = script.imports.resolve(name)
        split = split_member(qualified, project.path) if qualified else None
        other = load(split[0]) if split is not None else None
        if other is None or not _every_run_deepspeed(other, within=split[1]):
            return False
    return True


def _every_run_deepspeed(script: ScriptModel, within: str | None = None) -> bool:
    """Every run of the file prepares for DeepSpeed: each Accelerator it builds (there is at
    least one) is built on every run of its function with a ``DeepSpeedPlugin``
    (``deepspeed_plugin=DeepSpeedPlugin(...)``, or a name bound to one only, on every run), or
    it makes DeepSpeed's config-file optimizer (``DummyOptim``) outside any branch. Accelerate
    then wraps the model in DeepSpeed's engine whatever the process count (the plugin sets
    ``ACCELERATE_USE_DEEPSPEED``, which selects DeepSpeed on one process too), and the engine's
    ``module`` is the model: ``model.module`` is right on each of its runs. One Accelerator
    built without the plugin (the other arm of ``if args.deepspeed``, a second trainer's) may
    be the one whose ``prepare`` gave the model: then nothing is known. Names are resolved
    through the imports (``from accelerate import Accelerator as A``)."""
    if "DeepSpeedPlugin" not in script.source and "DummyOptim" not in script.source:
        return False
    accelerators = []
    for call in script.calls:
        if within is not None and not _inside_function(script, call, within):
            continue
        name = _imported_as(script, call.func)
        if name == "DummyOptim" and not conditional(script, call, branches=BRANCHES):
            return True
        if name == "Accelerator":
            accelerators.append(call)
    return bool(accelerators) and all(_deepspeed_on_every_run(script, c) for c in accelerators)


def _statement_of(script: ScriptModel, node: cst.CSTNode) -> cst.CSTNode:
    """The statement ``node`` is part of (a simple one, or a compound one's header)."""
    for ancestor in script.ancestors(node):
        if isinstance(ancestor, cst.SimpleStatementLine | cst.BaseCompoundStatement):
            return ancestor
    return script.module


def _inside_function(script: ScriptModel, node: cst.CSTNode, name: str) -> bool:
    """``node`` lies in the module-level function ``name`` (a factory of Accelerators)."""
    return any(script.inside(node, f) for f in top_level_functions(script.module, name))


def _builds_an_accelerator(script: ScriptModel) -> bool:
    """The file builds an Accelerator itself (else one it got from a factory elsewhere)."""
    return any(_imported_as(script, call.func) == "Accelerator" for call in script.calls)


def _imported_as(script: ScriptModel, node: cst.BaseExpression) -> str:
    """The last part of the qualified name ``node`` refers to through the file's imports
    (``A`` -> ``Accelerator`` after ``from accelerate import Accelerator as A``)."""
    qualified = script.qualified(node)
    spelled = next(iter(qualified)) if len(qualified) == 1 else (dotted(node) or "")
    return spelled.rsplit(".", 1)[-1]


def _deepspeed_on_every_run(script: ScriptModel, call: cst.Call) -> bool:
    """``Accelerator(deepspeed_plugin=...)`` built on every run of its function, with a plugin
    built on every run, and no ``cpu=`` that a run may set (a CPU run leaves DeepSpeed out)."""
    if conditional(script, call, branches=BRANCHES):
        return False  # ``if args.deepspeed: return Accelerator(deepspeed_plugin=...)``
    cpu = keyword_value(call, "cpu")
    if cpu is not None and not (isinstance(cpu, cst.Name) and cpu.value == "False"):
        return False  # ``cpu=args.cpu``: a CPU run leaves DeepSpeed out
    plugin = keyword_value(call, "deepspeed_plugin")
    if _a_deepspeed_plugin(script, plugin):
        return True
    if not isinstance(plugin, cst.Name):
        return False
    bound = script.index.assignments_to(plugin.value)
    return bool(bound) and all(
        _a_deepspeed_plugin(script, getattr(b, "value", None))
        and not conditional(script, b, branches=BRANCHES)
        for b in bound
    )


def _a_deepspeed_plugin(script: ScriptModel, value: cst.BaseExpression | None) -> bool:
    return isinstance(value, cst.Call) and _imported_as(script, value.func) == "DeepSpeedPlugin"


def _held_name(script: ScriptModel, owner: cst.BaseExpression, at: cst.CSTNode) -> str | None:
    """The plain name whose object ``owner`` holds at ``at``: the name itself, or for an
    attribute (``trainer.model``) the name it was last set to above ``at`` in the same function
    (``trainer.model = model`` after ``model, ... = accelerator.prepare(trainer.model, ...)``, as
    a Grounding DINO fine-tuning hands the prepared model back to its trainer), or the attribute
    itself where ``prepare`` set it there (``self.model, self.optimizer, ... =
    self.accelerator.prepare(self.model, ...)`` at the top of a trainer's ``train()``). None: an
    attribute set elsewhere, or to anything but a name."""
    if isinstance(owner, cst.Name):
        return owner.value
    spelling = dotted(owner)
    if spelling is None or not isinstance(owner, cst.Attribute):
        return None
    here, scope = script.order(at), script.scope_of(at)
    last = None
    for assign in (
        *script.index.assignments_to(spelling),
        *script.index.unpacked_assignments_to(spelling),
    ):
        if script.scope_of(assign) is not scope or script.order(assign) >= here:
            continue
        if last is None or script.order(assign) > script.order(last):
            last = assign
    prepared = [
        p.call
        for p in script.prepare_calls
        if spelling in p.outputs
        and script.scope_of(p.call) is scope
        and script.order(p.call) < here
        and (last is None or script.order(p.call) > script.order(last))
    ]
    if prepared:
        return spelling  # ``self.model, ... = self.accelerator.prepare(self.model, ...)`` above
    if last is None:
        return None
    value = value_assigned_to(last, spelling)
    if not isinstance(value, cst.Name) or len(assigned_targets(last)) != 1:
        return None  # (``self.model, self.optimizer = model, optimizer``: ``model``)
    return value.value


def _binds(script: ScriptModel, node: cst.Attribute | cst.Subscript) -> bool:
    """``model.x = ...``, ``model[0] = ...`` (or ``del model.x``): set on the wrapper, not
    read."""
    parent = script.parent(node)
    if isinstance(parent, cst.AssignTarget) and parent.target is node:
        return True
    if isinstance(parent, (cst.AugAssign, cst.AnnAssign)) and parent.target is node:
        return True
    return isinstance(parent, cst.Del)


#: Methods only a module has: what an object of unknown kind is called with shows it is one.
_MODULE_ONLY_METHODS = ("train", "eval", "parameters", "named_parameters")


def _prepared_model(
    script: ScriptModel,
    name: str,
    at: cst.CSTNode,
    unknown_is_model: bool = False,
    called_as: str | None = None,
) -> bool:
    """``name`` holds a model that ``prepare`` returned above ``at`` in the same function (or at
    module level), and nothing bound ``name`` again in between. ``unknown_is_model``: an output
    of unknown kind counts as a model even if the file never calls it; reading its ``module``
    says the author takes it for a wrapped model (an audio encoder built by an imported helper
    and only ever used as ``audio_encoder.module.encode(audio)``). ``called_as``: another
    spelling of the object (``trainer.model``) whose calls also show it is a model."""
    if _bound_by_a_comprehension(script, name, at):
        return False  # ``[model.name for model in registry]``: the loop's own ``model``
    facts = facts_of(script)
    here = script.order(at)
    scope = script.scope_of(at)
    last = None
    for prepare in script.prepare_calls:
        if name not in prepare.outputs or script.order(prepare.call) >= here:
            continue
        if script.scope_of(prepare.call) is not scope:
            continue
        if last is None or script.order(prepare.call) > script.order(last):
            last = prepare.call
    if last is None:
        calls = _calls_reading_a_global(script, name, at)
        if calls:  # ``train()`` reads the module's ``model``, prepared before each call
            return all(
                _prepared_model(script, name, call, unknown_is_model, called_as) for call in calls
            )
        return _parameter_given_prepared_model(script, name, at, unknown_is_model)
    kind = facts.flow.kind_of(name, at)
    if kind is None:  # unknown: a model if the file calls it (``model(batch)``), switches its
        # mode (``model.train()``), takes its parameters (``model.parameters()``, for an
        # optimizer), accumulates its gradients (``accelerator.accumulate(model)``) or unwraps
        # it (``accelerator.unwrap_model(model)``): only a module has these
        spellings = {name, called_as} - {None}
        modes = {f"{s}.{m}" for s in spellings for m in _MODULE_ONLY_METHODS}
        called = any(
            dotted(c.func) in spellings | modes
            or (
                isinstance(c.func, cst.Attribute)
                and c.func.attr.value in ("accumulate", "unwrap_model")
                and any(dotted(a.value) in spellings for a in c.args)
            )
            for c in script.calls
        )
        if not unknown_is_model and not called:
            return False
    elif kind is not Kind.MODEL and not facts.flow.is_model_name(name, at):
        return False
    if _frozen_when_prepared(script, name, last):
        return False  # no parameter trains: prepare leaves it unwrapped (no DDP without grads)
    statement_of_prepare = script.order(last)
    for assign in script.index.assignments_to(name):
        if script.scope_of(assign) is not scope:
            continue
        if keeps_the_object(assign, name):
            continue  # ``model = model.to(device)``: the same wrapper
        if statement_of_prepare < script.order(assign) < here and not _is_the_prepare(assign, last):
            return False
    # bound again otherwise: a loop's target, nested or not (``for (model, tag), z in ...``,
    # ``for i, model in enumerate(models)``), an unpacking, a ``with ... as``, a walrus
    for spelled in binding_spellings(script, name):
        if isinstance(script.parent(spelled), cst.AssignTarget):
            continue  # ``model = ...``: judged above
        if _comprehension_target(script, spelled):
            continue  # ``[m.name for model in registry]``: binds in the comprehension alone
        if (
            statement_of_prepare < script.order(spelled) < here
            and script.scope_of(spelled) is scope
        ):
            return False
    return True


_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


def _comprehension_target(script: ScriptModel, spelled: cst.Name) -> bool:
    """``spelled`` is in the target of a comprehension's ``for`` (or a lambda's parameter):
    Python 3 binds it in the comprehension's own scope, never in the function around it
    (review10b: ``[model.name for model in registry]`` after the prepare had made the
    prepared ``model`` count as rebound)."""
    for ancestor in script.ancestors(spelled):
        if isinstance(ancestor, cst.CompFor):
            return script.inside(spelled, ancestor.target)
        if isinstance(ancestor, cst.Lambda):
            return script.inside(spelled, ancestor.params)  # ``key=lambda model: ...``
        if isinstance(ancestor, cst.BaseStatement):
            return False
    return False


def _bound_by_a_comprehension(script: ScriptModel, name: str, at: cst.CSTNode) -> bool:
    """``at`` reads ``name`` inside a comprehension whose ``for`` binds it
    (``[model.name for model in registry]``), or a lambda's parameter of that name: the loop's
    own item, not the prepared model.
    Not the first ``for``'s iterable, which the code around the comprehension evaluates."""
    for ancestor in script.ancestors(at):
        if isinstance(ancestor, cst.Lambda):
            if script.inside(at, ancestor.body) and any(
                isinstance(node, cst.Name) and node.value == name for node in walk(ancestor.params)
            ):
                return True  # ``key=lambda model: model.score``: the lambda's own parameter
            continue
        if isinstance(ancestor, cst.BaseStatement):
            return False
        if not isinstance(ancestor, _COMPREHENSIONS):
            continue
        loop: cst.CompFor | None = ancestor.for_in
        if script.inside(at, ancestor.for_in.iter):
            continue
        while loop is not None:
            if any(isinstance(node, cst.Name) and node.value == name for node in walk(loop.target)):
                return True
            loop = loop.inner_for_in
    return False


def _calls_reading_a_global(script: ScriptModel, name: str, at: cst.CSTNode) -> list[cst.Call]:
    """``name`` read at ``at`` in a top-level function that never binds it (PixArt's ``train()``
    logging ``model.module.h``): the module's ``name``, as it is at each call of the function.
    The calls, when every one is the module's own code (``train()`` under ``if __name__ ==
    "__main__":`` after the ``prepare``); else none (a call from another function may run
    before the module binds it)."""
    function = script.index.enclosing_function(at)
    if function is None or any(
        isinstance(ancestor, cst.FunctionDef | cst.ClassDef | cst.Lambda)
        for ancestor in script.ancestors(function)
    ):
        return []
    calls = [call for call, _ in script.call_graph.calls_of(function)]
    if not calls or any(script.scope_of(call) is not script.module for call in calls):
        return []  # (asked first: the scopes below cost more)
    # a local of its own (a parameter, a loop's or a ``with``'s name, a lambda's parameter, a
    # walrus, ``except ... as``, a ``case`` capture, a local import): not the module's
    if not means_module_binding(script, name, at):
        return []
    for node in script.index.of_type(cst.Global):  # ``global model`` in it: it may bind the
        # module's name itself
        if any(n.name.value == name for n in node.names) and script.inside(node, function.body):
            return []
    return calls


def _parameter_given_prepared_model(
    script: ScriptModel, name: str, at: cst.CSTNode, unknown_is_model: bool, depth: int = 0
) -> bool:
    """``name`` is a parameter of the function around ``at`` (not bound again in it), and every
    call of that function in the file passes a model ``prepare`` returned: ``def evaluate(model,
    loader): model.encode(x)`` called as ``evaluate(model, loader)`` after ``model, ... =
    accelerator.prepare(model, ...)`` holds the same wrapper. A function never called here, or
    called once with anything else (a model of its own, ``unwrap_model(model)``), is not; one
    called with a frozen model too (a reference model beside the policy) is, by its other calls."""
    return _given(script, name, at, unknown_is_model, depth) == "wrapped"


def _given(
    script: ScriptModel, name: str, at: cst.CSTNode, unknown_is_model: bool, depth: int
) -> str | None:
    """What every call of the function around ``at`` passes as its parameter ``name``:
    ``"wrapped"`` when each passes a prepared model and one at least a wrapped one,
    ``"frozen"`` when each passes a model prepared with every parameter frozen (which prepare
    leaves unwrapped), None otherwise (`_parameter_given_prepared_model`)."""
    function = script.index.enclosing_function(at)
    if function is None or depth > 3 or not has_parameter(function, name):
        return None
    scope = script.scope_of(at)
    if any(script.scope_of(a) is scope for a in script.index.assignments_to(name)):
        return None
    passed = facts_of(script).flow.call_site_arguments(name, at)
    if not passed:
        # called from the project's other modules only (nanoT5's ``train(model, ...)`` of
        # ``main.py``): every call there hands the model ``prepare`` returned
        given = script.given_parameters.get(function, {}).get(name)
        if given is not None and given.prepared and given.kind is Kind.MODEL:
            # the callers cannot say whether it trains (prepare leaves a frozen reference
            # model unwrapped): the function here must train it
            return "wrapped" if _trains(function, name) else None
        return None
    wrapped = False
    for argument in passed:
        if holds_constructed_wrapper(script, argument.value, argument):
            wrapped = True
            continue  # ``save(trainer.model)``: the wrapper a trainer's construction prepared
        if not isinstance(argument.value, cst.Name):
            return None
        outer = argument.value.value
        if _frozen_prepared(script, outer, argument):
            continue  # a frozen reference model beside the policy: the model itself, no wrapper
        if _prepared_model(script, outer, argument, unknown_is_model):
            wrapped = True
            continue
        further = _given(script, outer, argument, unknown_is_model, depth + 1)
        if further is None:
            return None
        wrapped = wrapped or further == "wrapped"
    return "wrapped" if wrapped else "frozen"


def _trains(function: cst.FunctionDef, name: str) -> bool:
    """``function`` trains its ``name``: it calls ``name.train()`` and runs a ``backward``
    (nanoT5's ``train(model, ...)``), so prepare wrapped it (a frozen model stays unwrapped)."""
    calls = [node for node in walk(function.body) if isinstance(node, cst.Call)]
    return any(dotted(c.func) == f"{name}.train" for c in calls) and any(
        isinstance(c.func, cst.Attribute) and c.func.attr.value == "backward" for c in calls
    )


def _frozen_prepared(script: ScriptModel, name: str, at: cst.CSTNode) -> bool:
    """``name`` was prepared in the scope of ``at``, above it, with every parameter frozen
    (`_frozen_when_prepared`)."""
    scope, here = script.scope_of(at), script.order(at)
    return any(
        name in prepare.outputs
        and script.scope_of(prepare.call) is scope
        and script.order(prepare.call) < here
        and _frozen_when_prepared(script, name, prepare.call)
        for prepare in script.prepare_calls
    )


def _frozen_in_its_class(script: ScriptModel, name: str | None, at: cst.CSTNode) -> bool:
    """``self.<name>`` read at ``at`` was prepared in the class around ``at`` with every
    parameter frozen (`_frozen_when_prepared`): a trainer's reference model."""
    if not name or not name.startswith("self."):
        return False
    owner = script.index.nearest(at, cst.ClassDef)
    # one answer per attribute and class: a trainer reads ``self.vae.config`` many times
    known: dict[tuple[str, int], bool] = script.__dict__.setdefault("_frozen_in_class", {})
    key = (name, id(owner))
    if key not in known:
        known[key] = _frozen_in(script, name, owner)
    return known[key]


def _frozen_in(script: ScriptModel, name: str, owner: cst.ClassDef | None) -> bool:
    ours = [
        prepare.call
        for prepare in script.prepare_calls
        if name in prepare.outputs and script.index.nearest(prepare.call, cst.ClassDef) is owner
    ]
    return (
        owner is not None
        and bool(ours)
        and all(_frozen_when_prepared(script, name, call) for call in ours)
    )


def _frozen_when_prepared(script: ScriptModel, name: str, prepare: cst.Call) -> bool:
    """Every parameter of ``name`` was frozen before ``prepare`` (``for p in
    name.parameters(): p.requires_grad = False``, ``name.requires_grad_(False)``) and no
    optimizer of the file trains it: a reward or reference model in an RLHF loop. Accelerate
    (and accelify's runtime) wrap in DistributedDataParallel only a model with a parameter that
    requires grad, so ``prepare`` returns the model itself and its own attributes are there."""
    if name in _trained_models(script):
        return False
    before = script.order(prepare)
    # the same object as the prepared one: a local of the prepare's own function (a same-named
    # local of another function is another model), an attribute of the same class
    holder = (cst.ClassDef, cst.FunctionDef) if "." in name else cst.FunctionDef
    owner = _held_by(script, prepare, holder)
    if _built_frozen(script, name, before, holder, owner):
        return True
    for call in script.calls:
        func = call.func
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value == "requires_grad_"
            and dotted(func.value) == name
            and len(call.args) == 1
            and isinstance(call.args[0].value, cst.Name)
            and call.args[0].value.value == "False"
            and script.order(call) < before
            and _held_by(script, call, holder) is owner
        ):
            return True
    for node in walk(script.module):
        if (
            isinstance(node, cst.For)
            and isinstance(node.iter, cst.Call)
            and isinstance(node.iter.func, cst.Attribute)
            and node.iter.func.attr.value == "parameters"
            and dotted(node.iter.func.value) == name
            and isinstance(node.target, cst.Name)
            and script.order(node) < before
            and _held_by(script, node, holder) is owner
            and any(
                isinstance(statement, cst.Assign)
                and dotted(statement.targets[0].target) == f"{node.target.value}.requires_grad"
                and isinstance(statement.value, cst.Name)
                and statement.value.value == "False"
                for line in node.body.body
                if isinstance(line, cst.SimpleStatementLine)
                for statement in line.body
            )
        ):
            return True
    return False


def _built_frozen(
    script: ScriptModel,
    name: str,
    before: int,
    holder: type | tuple[type, ...],
    owner: cst.CSTNode | None,
) -> bool:
    """``name`` was bound, above ``before`` and in ``owner``, to what a function of the file
    returns after freezing it (F5-TTS's GRPO trainer: ``self.ref_model =
    self._init_ref_model(...)``, whose ``model_copy = copy.deepcopy(...)`` has every parameter
    set ``requires_grad = False`` before ``return model_copy``): the model it builds is
    frozen. (A model the caller hands in and the helper returns as it is, is the caller's: not
    known to train, so not known to be wrapped either.)"""
    for assign in script.index.assignments_to(name):
        value = assign.value
        if (
            not isinstance(value, cst.Call)
            or script.order(assign) >= before
            or _held_by(script, assign, holder) is not owner
        ):
            continue
        found = script.call_graph.callee(value)
        if found is None:
            continue
        function = found[0]
        returned = {
            node.value.value
            for node in walk(function.body)
            if isinstance(node, cst.Return) and isinstance(node.value, cst.Name)
        }
        if any(_freezes(function, local) for local in returned):
            return True
    return False


def _freezes(function: cst.FunctionDef, name: str) -> bool:
    """``function`` freezes every parameter of its local ``name`` (``name.requires_grad_(False)``
    or ``for p in name.parameters(): p.requires_grad = False``)."""
    for node in walk(function.body):
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "requires_grad_"
            and dotted(node.func.value) == name
            and len(node.args) == 1
            and isinstance(node.args[0].value, cst.Name)
            and node.args[0].value.value == "False"
        ):
            return True
        if (
            isinstance(node, cst.For)
            and isinstance(node.iter, cst.Call)
            and isinstance(node.iter.func, cst.Attribute)
            and node.iter.func.attr.value == "parameters"
            and dotted(node.iter.func.value) == name
            and isinstance(node.target, cst.Name)
            and any(
                isinstance(statement, cst.Assign)
                and dotted(statement.targets[0].target) == f"{node.target.value}.requires_grad"
                and isinstance(statement.value, cst.Name)
                and statement.value.value == "False"
                for line in node.body.body
                if isinstance(line, cst.SimpleStatementLine)
                for statement in line.body
            )
        ):
            return True
    return False


def _held_by(
    script: ScriptModel, node: cst.CSTNode, holder: type | tuple[type, ...]
) -> cst.CSTNode | None:
    """The function around ``node`` (for an attribute, the class around it: ``self.ref`` frozen
    in ``__init__`` and prepared in ``setup``), as `_frozen_when_prepared` compares them."""
    found = script.index.nearest(node, holder)
    if isinstance(found, cst.FunctionDef) and holder != cst.FunctionDef:
        found = script.index.nearest(found, cst.ClassDef) or found
    return found


def _is_the_prepare(assign: cst.Assign, prepare: cst.Call) -> bool:
    return assign.value is prepare


def _trained_models(script: ScriptModel) -> set[str]:
    """Models an optimizer trains: built from their parameters, or prepared in the same call as
    an optimizer whose models are not known (``model, optimizer = accelerator.prepare(model,
    optimizer)`` where a helper of the file built the optimizer). A frozen teacher prepared
    beside an optimizer over ``model.parameters()`` is not trained."""
    owners = optimizer_models(script)
    trained = set().union(*owners.values())
    optimizers = script.names_of(Kind.OPTIMIZER)
    for prepare in script.prepare_calls:
        beside = [name for name in prepare.outputs if name in optimizers or "optim" in name]
        if any(not owners.get(name) for name in beside):
            trained.update(prepare.outputs)
        trained.update(_aliases_prepared(script, prepare, trained))
    return trained


def _aliases_prepared(script: ScriptModel, prepare: PrepareCall, trained: set[str]) -> set[str]:
    """Outputs of ``prepare`` bound, in its function and above it, to a model an optimizer
    trains: a trainer's ``self.model = model`` before ``self.optimizer =
    AdamW(model.parameters())`` and ``self.model, self.optimizer = prepare(self.model,
    self.optimizer)`` prepares the trained model under its attribute's name."""
    scope, here = script.scope_of(prepare.call), script.order(prepare.call)
    return {
        output
        for output in prepare.outputs
        if output
        and output not in trained
        and any(
            script.scope_of(assign) is scope
            and script.order(assign) < here
            and assign.value is not None
            and dotted(assign.value) in trained
            for assign in script.index.assignments_to(output)
        )
    }
