from collections.abc import Iterator

import libcst as cst

from accelify.analysis.collectives import DDP, combines_ranks, runtime_of
from accelify.analysis.facts import facts_of
from accelify.analysis.loss_sources import last_binding
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted
from accelify.lint.rule import HEADER, Example, Finding, Rule, accelerator_name

#: ``device_map`` values that spread one model over every GPU the process sees.
_SPREADING = frozenset({"auto", "balanced", "balanced_low_0", "sequential"})
#: What a script written for several processes calls besides a collective.
_SHARDING = ("gather_object", "split_between_processes")
#: Calls that load a model with a ``device_map``.
_LOADERS = ("from_pretrained", "pipeline")
#: PEFT classes whose ``from_pretrained`` wraps a base model the script loaded before.
_ADAPTER_CLASSES = ("PeftModel", "PeftMixedModel")

_LOAD = (
    "from transformers import AutoModelForCausalLM\n"
    "model = AutoModelForCausalLM.from_pretrained(name, device_map='auto')\n"
)


class DeviceMapOnEveryRank(Rule):
    """``from_pretrained(..., device_map="auto")`` (``"balanced"``, ``"sequential"``) in a script
    that runs one process per GPU: each process sees every GPU and spreads its own copy of the
    model over all of them, so N processes put N copies on each GPU (out of memory for a model
    that fits one GPU N times over less) and compute on the same devices. Handed to Hugging
    Face Accelerate's ``prepare``, the split model is refused outright on more than one process
    ("You can't train a model that has been loaded with device_map='auto' in any distributed
    mode"; a 4-bit or 8-bit model: "...on multiple devices in any distributed mode").
    Each rank loads its copy on its own device instead: ``device_map={"":
    accelerator.process_index}`` (TRL's ``get_kbit_device_map()``), or no device_map and
    ``.to(accelerator.device)``.

    Reported where the script runs several processes by design: the loaded model goes to
    ``prepare``, or the script prepares anything else (a DataLoader: each rank its shard) or
    gathers across ranks. A script with an Accelerator that prepares nothing and gathers
    nothing (one process running a model split over the GPUs), a branch only one process
    takes (``if accelerator.num_processes == 1:``) and a model only the main process loads are
    left alone."""

    code = "ACC421"
    name = "device-map-on-every-rank"
    message = (
        "Load each rank's copy onto its own device: device_map={'': accelerator.process_index}; "
        "with 'auto' each of the N processes spreads its copy over every GPU (N copies on each)"
    )
    why = "Every process spreads its own copy of the model over every visible GPU."
    bad = (
        # a caption-paraphrasing script: a sharded loader, gather_object, and each rank's
        # Llama spread over all the GPUs
        Example(
            HEADER
            + "from accelerate.utils import gather_object\n"
            + _LOAD
            + "loader = accelerator.prepare(loader)\n"
            + "for batch in loader:\n"
            + "    texts = gather_object(generate(model, batch))\n",
            5,
            63,
        ),
        # a QLoRA fine-tune: the 4-bit model is split over the GPUs, then prepared
        Example(
            HEADER
            + "import transformers\n"
            + "model = transformers.AutoModelForCausalLM.from_pretrained(\n"
            + "    args.model, device_map='auto', load_in_4bit=True\n)\n"
            + "model = get_peft_model(model, lora_cfg)\n"
            + "model, optim, loader = accelerator.prepare(model, optim, loader)\n",
            5,
            28,
        ),
        # a trainer's frozen reference model, prepared beside the policy
        Example(
            HEADER
            + "from transformers import AutoModelForCausalLM\n\n\n"
            + "class Trainer:\n"
            + "    def __init__(self):\n"
            + "        device_map = 'auto'\n"
            + "        self.ref = AutoModelForCausalLM.from_pretrained(\n"
            + "            ckpt, device_map=device_map\n        )\n"
            + "        self.model, self.ref = accelerator.prepare(self.model, self.ref)\n",
            10,
            30,
        ),
        # AutoPeftModel loads the base model itself, with this device_map
        Example(
            HEADER
            + "from peft import AutoPeftModelForCausalLM\n"
            + "model = AutoPeftModelForCausalLM.from_pretrained(adapter, device_map='auto')\n"
            + "model, loader = accelerator.prepare(model, loader)\n",
            4,
            70,
        ),
    )
    good = (
        # a generative-recommendation evaluator: its own DDP switch picks each rank's device,
        # 'auto' only for its one-process mode
        HEADER
        + "from transformers import AutoModelForCausalLM\n\n\n"
        + "def load(path, use_ddp):\n"
        + "    if use_ddp:\n"
        + "        device_map = {'': accelerator.local_process_index}\n"
        + "    else:\n"
        + "        device_map = 'auto'\n"
        + "    model = AutoModelForCausalLM.from_pretrained(path, device_map=device_map)\n"
        + "    model = accelerator.prepare(model)\n"
        + "    return model\n",
        # an adapter attached to a base loaded whole: PEFT reads this device_map only to
        # re-dispatch a base its own load offloaded, and this one has no device_map at all
        HEADER
        + "from peft import PeftModel\n"
        + "from transformers import AutoModelForCausalLM\n"
        + "base = AutoModelForCausalLM.from_pretrained(name)\n"
        + "model = PeftModel.from_pretrained(base, adapter, device_map='auto')\n"
        + "model, loader = accelerator.prepare(model, loader)\n",
        # each rank's copy on its own device
        HEADER
        + _LOAD.replace("'auto'", "{'': accelerator.process_index}")
        + "model, loader = accelerator.prepare(model, loader)\n",
        # one process runs a model split over the GPUs: nothing is sharded or gathered
        HEADER + _LOAD + "accelerator.print(model.generate(ids))\n",
        # one process loads it (the main process's judge): one copy over the GPUs
        HEADER
        + "from transformers import AutoModelForCausalLM\n"
        + "model, loader = accelerator.prepare(model, loader)\n"
        + "if accelerator.is_main_process:\n"
        + "    judge = AutoModelForCausalLM.from_pretrained(name, device_map='auto')\n",
        # only a one-process run takes this branch
        HEADER
        + "from transformers import AutoModelForCausalLM\n"
        + "if accelerator.num_processes == 1:\n"
        + "    model = AutoModelForCausalLM.from_pretrained(name, device_map='auto')\n"
        + "else:\n"
        + "    model = AutoModelForCausalLM.from_pretrained(name)\n"
        + "model, loader = accelerator.prepare(model, loader)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        facts = facts_of(script)
        several = _runs_several_processes(script)
        for call in script.calls:
            func = dotted(call.func) or ""
            if not func.endswith(_LOADERS):
                continue
            argument = next((a for a in call.args if _keyword(a) == "device_map"), None)
            if argument is None or not _spreads(script, argument.value, call):
                continue
            if _adapter_load(script, call):
                continue  # the base model's own load placed it
            if DDP in facts.ranks.backend_guards.reached_by_none(call):
                continue  # a branch only one process takes
            if script.under_rank_guard(call):
                continue  # loaded by one process only (a judge the main process runs)
            prepared = _prepared_as(script, call)
            if prepared is None and not several:
                continue
            accelerator = accelerator_name(script, call)
            where = f"{{'': {accelerator}.process_index}}"
            model = f"the model ({prepared})" if prepared else "the model"
            if prepared is not None and runtime_of(script) == "hf":
                text = (
                    f"Load {model} onto this rank's device: device_map={where} (or no "
                    f"device_map): with 'auto' each of the N processes spreads its copy over "
                    f"every GPU, and {accelerator}.prepare refuses a model split over devices on "
                    "more than one process (ValueError: can't train a model loaded with "
                    "device_map='auto' in any distributed mode)"
                )
            else:
                text = (
                    f"Load {model} onto this rank's device: device_map={where}; "
                    "with 'auto' "
                    "each of the N processes spreads its own copy over every GPU it sees: N "
                    "copies on each GPU (out of memory), every rank computing on the same devices"
                )
            yield self.finding(script, argument.value, message=text)


def _adapter_load(script: ScriptModel, call: cst.Call) -> bool:
    """``PeftModel.from_pretrained(base, path, device_map="auto")`` attaches an adapter to a
    model already loaded: PEFT reads its ``device_map`` only to re-dispatch a base that its own
    load offloaded to the CPU or disk, so the placement is the base model's load's (reported
    there when it spreads). ``AutoPeftModel*`` loads the base itself and is not one of these."""
    for name in script.qualified(call.func):
        parts = name.split(".")
        if parts[0] == "peft" and len(parts) >= 3 and parts[-2].startswith(_ADAPTER_CLASSES):
            return True
    return False


def _keyword(argument: cst.Arg) -> str | None:
    return argument.keyword.value if argument.keyword is not None else None


def _spreads(script: ScriptModel, value: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """``value`` is one of the spreading strings, or a name last bound to one above ``at``; not
    a name another arm of the function binds to this rank's own device (``if use_ddp:
    device_map = {"": accelerator.local_process_index} else: device_map = "auto"``): the
    script picks the spread for its one-process mode itself."""
    if isinstance(value, cst.Name):
        binding = last_binding(script, value.value, at)
        if not isinstance(binding, cst.Assign):
            return False
        if _a_rank_map_beside(script, value.value, at):
            return False
        value = binding.value
    return isinstance(value, cst.SimpleString) and value.evaluated_value in _SPREADING


def _a_rank_map_beside(script: ScriptModel, name: str, at: cst.CSTNode) -> bool:
    """``name`` is also bound, above ``at`` in its function, to a value that reads the rank."""
    placement = facts_of(script).placement
    function = placement.enclosing_function(at)
    for assign in script.assignments:
        if (
            isinstance(assign, cst.Assign)
            and script.order(assign) < script.order(at)
            and placement.enclosing_function(assign) is function
            and any(dotted(t.target) == name for t in assign.targets)
            and script.reads_rank(assign.value)
        ):
            return True
    return False


def _prepared_as(script: ScriptModel, call: cst.Call) -> str | None:
    """The name the loaded model is bound to, when that name is handed to ``prepare``."""
    parent = script.parent(call)
    if not isinstance(parent, cst.Assign) or len(parent.targets) != 1:
        return None
    name = dotted(parent.targets[0].target)
    if name is None:
        return None
    if any(name in prepare.inputs for prepare in script.prepare_calls):
        return name
    return None


def _runs_several_processes(script: ScriptModel) -> bool:
    """The script is written for several processes: it prepares something (a sharded loader, a
    wrapped model) or combines the ranks' values (``gather_object``, ``gather``, ``reduce``)."""
    if script.prepare_calls:
        return True
    return any(
        combines_ranks(script, call)
        or (dotted(call.func) or "").rsplit(".", 1)[-1]
        in ("gather_object", "split_between_processes")
        for call in script.calls
    )
