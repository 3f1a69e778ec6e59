"""Which calls are collectives, on which backend: the one table every rule and step asks.

A collective completes only when every rank calls it, so a rank that skips one leaves the
others waiting (a hang). Whether a call is one depends on the backend and, for a few
checkpoint calls, on whose runtime runs the script:

- HF Accelerate: ``save_state``/``load_state`` are collectives under FSDP and DeepSpeed (each
  rank writes its shard or engine files); under DDP they are not (unless
  ``automatic_checkpoint_naming`` is on), and a main-process-only ``save_state`` saves only that
  rank's RNG state. ``get_state_dict``/``save_model`` gather the full weights under FSDP and
  ZeRO-3 only.
- accelify's runtime: ``save_state`` and ``load_state`` are collectives on every backend (a
  barrier makes the checkpoint complete before any rank goes on); the rest as HF.

``unwrap_model``, ``print``, ``log`` and ``save`` are never collectives.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass

import libcst as cst

from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import argument_value, children_of, dotted, keyword_value

DDP, FSDP, DEEPSPEED, ZERO3 = "ddp", "fsdp", "deepspeed", "deepspeed-zero3"
EVERY_BACKEND = frozenset({DDP, FSDP, DEEPSPEED, ZERO3})
SHARDING = frozenset({FSDP, DEEPSPEED, ZERO3})
FULL_WEIGHTS_GATHERED = frozenset({FSDP, ZERO3})
#: The forward (or ``generate``) of a prepared model: FSDP gathers each layer's parameters
#: from every rank as it runs, so a forward on one rank waits for the others.
SHARDED_FORWARD = frozenset({FSDP})
BACKEND_NAMES = {DDP: "DDP", FSDP: "FSDP", DEEPSPEED: "DeepSpeed", ZERO3: "DeepSpeed ZeRO-3"}


@dataclass(frozen=True)
class Collective:
    """The backends on which a call is a collective, under each runtime."""

    hf: frozenset[str]
    accelify: frozenset[str]

    def on(self, runtime: str) -> frozenset[str]:
        return self.accelify if runtime == "accelify" else self.hf


_ALWAYS = Collective(EVERY_BACKEND, EVERY_BACKEND)

#: ``accelerator.<method>(...)``
ACCELERATOR_METHODS = {
    "wait_for_everyone": _ALWAYS,
    "gather": _ALWAYS,
    "gather_for_metrics": _ALWAYS,
    "reduce": _ALWAYS,
    "pad_across_processes": _ALWAYS,
    "check_trigger": _ALWAYS,
    "main_process_first": _ALWAYS,
    "local_main_process_first": _ALWAYS,
    "prepare": _ALWAYS,
    "backward": _ALWAYS,
    "save_state": Collective(SHARDING, EVERY_BACKEND),
    "load_state": Collective(SHARDING, EVERY_BACKEND),
    "get_state_dict": Collective(FULL_WEIGHTS_GATHERED, FULL_WEIGHTS_GATHERED),
    "save_model": Collective(FULL_WEIGHTS_GATHERED, FULL_WEIGHTS_GATHERED),
}

#: Functions, by qualified name: collectives whatever the backend.
FUNCTIONS = frozenset(
    {
        *(
            f"torch.distributed.{name}"
            for name in (
                "barrier",
                "all_reduce",
                "all_gather",
                "all_gather_object",
                "all_to_all",
                "broadcast",
                "broadcast_object_list",
                "reduce",
                "gather",
                "gather_object",
                "scatter",
                "reduce_scatter",
                "monitored_barrier",
            )
        ),
        *(
            f"accelerate.utils.{name}"
            for name in (
                "gather",
                "gather_object",
                "broadcast",
                "broadcast_object_list",
                "reduce",
                "pad_across_processes",
                "wait_for_everyone",
            )
        ),
    }
)

#: The collectives that combine every rank's values into one: what makes an evaluation metric
#: cover the whole set (methods of any receiver: ``accelerator.gather``, ``dist.all_reduce``).
GATHERING_METHODS = frozenset(
    {"gather", "gather_for_metrics", "reduce", "all_gather", "all_reduce"}
)
GATHERING_FUNCTIONS = frozenset(
    name
    for name in FUNCTIONS
    if name.rsplit(".", 1)[-1].startswith(("all_gather", "all_reduce"))
    or name.rsplit(".", 1)[-1] in ("gather", "gather_object", "reduce")
)


def combines_ranks(script: ScriptModel, call: cst.Call) -> bool:
    """``accelerator.gather(x)``, ``dist.all_reduce(t)``: a call that combines every rank's
    values. Not an indexing op of the same name (``torch.gather(t, 1, index)``,
    ``logits.gather(1, y)``) nor ``functools.reduce(f, xs)``: they take two arguments, or resolve
    to an import that is no collective."""
    names = script.call_names(call)
    if names & GATHERING_FUNCTIONS:
        return True
    func = call.func
    if not (isinstance(func, cst.Attribute) and func.attr.value in GATHERING_METHODS):
        return False
    if script.imports.resolve(dotted(func) or "") is not None:
        return False  # ``torch.gather``, ``functools.reduce``: an import that is no collective
    if dotted(func.value) in script.names_of(Kind.ACCELERATOR):
        return True  # ``accelerator.reduce(loss, "mean")``: its reduction is the second argument
    positional = [a for a in call.args if a.keyword is None and not a.star]
    keywords = {a.keyword.value for a in call.args if a.keyword is not None}
    return func.attr.value not in ("gather", "reduce") or (
        len(positional) < 2 and not keywords & {"dim", "index"}
    )


#: The calls that hand every rank one rank's value: after them the ranks agree, as after a
#: combining one (``accelerator.broadcast``, ``dist.broadcast_object_list``).
BROADCASTING_METHODS = frozenset({"broadcast", "broadcast_object_list"})
#: ``torch.distributed`` collectives that write their result into their first argument: after
#: ``dist.all_reduce(t)`` every rank holds the same ``t``; the result of the call is None.
IN_PLACE_FUNCTIONS = frozenset(
    f"torch.distributed.{name}"
    for name in (
        "all_reduce",
        "all_gather",
        "all_gather_object",
        "broadcast",
        "broadcast_object_list",
    )
)


def agrees_across_ranks(script: ScriptModel, call: cst.Call) -> bool:
    """After ``call`` every rank holds the same value: it combines every rank's values
    (``accelerator.reduce``, ``dist.all_reduce``) or hands one rank's to all
    (``accelerator.broadcast``). Not ``logits.gather(1, y)`` nor ``torch.gather``."""
    if combines_ranks(script, call):
        return True
    if any(
        name.rsplit(".", 1)[-1] in BROADCASTING_METHODS
        for name in script.call_names(call) & FUNCTIONS
    ):
        return True
    func = call.func
    return (
        isinstance(func, cst.Attribute)
        and func.attr.value in BROADCASTING_METHODS
        and script.imports.resolve(dotted(func) or "") is None
    )


def agreed_in_place(script: ScriptModel, call: cst.Call) -> cst.BaseExpression | None:
    """``t`` of ``dist.all_reduce(t)`` (``dist.broadcast(t, 0)``): the collective writes every
    rank's agreed value into it. None for a call that returns its result (``accelerator.reduce``
    hands back a new tensor and leaves its argument as it was)."""
    if not script.call_names(call) & IN_PLACE_FUNCTIONS:
        return None
    first = next((a for a in call.args if a.keyword is None and not a.star), None)
    return first.value if first is not None else None


#: Words that show a script means to run on a sharding backend, also turned on through its own
#: flag or config (``--deepspeed``, ``args.use_fsdp``, a plugin built from args).
_MENTIONS = {
    FSDP: (
        "FSDP",
        "fsdp_plugin",
        "FullyShardedDataParallel",
        "fully_shard",
        "--fsdp",
        "use_fsdp",
        "args.fsdp",
        "config.fsdp",
    ),
    DEEPSPEED: (
        "DEEPSPEED",
        "deepspeed_plugin",
        "DeepSpeedPlugin",
        "import deepspeed",
        "zero_stage",
        "--deepspeed",
        "use_deepspeed",
        "args.deepspeed",
        "config.deepspeed",
        "ds_config",
    ),
}


def runtime_of(script: ScriptModel) -> str:
    """``accelify`` when the script's Accelerator is ours, else ``hf``."""
    bound = script.imports.bound.values()
    return "accelify" if any(name.split(".")[0] == "accelify" for name in bound) else "hf"


def backends_in_view(script: ScriptModel) -> frozenset[str]:
    """DDP always; FSDP and DeepSpeed (with ZeRO-3) when the script names them, other than to
    rule them out (``assert accelerator.distributed_type != DistributedType.FSDP``). Kept per
    complete analysis: a dozen rules ask, some once per call."""
    kept = script.__dict__.get("_backends_in_view")
    if kept is not None:
        return kept
    found = _backends_in_view(script)
    if script.complete:
        script.__dict__["_backends_in_view"] = found
    return found


def _backends_in_view(script: ScriptModel) -> frozenset[str]:
    code = script.source
    found = {DDP}
    mentions = {b: _mentions(code, b) for b in (FSDP, DEEPSPEED)}
    if any(mentions.values()):
        code = _without_prose(code)
        for refusal in _refusals(script):
            code = code.replace(script.module.code_for_node(refusal), "")
    if mentions[FSDP] and _mentions(code, FSDP, usage=script.source):
        found.add(FSDP)
    if mentions[DEEPSPEED] and _mentions(code, DEEPSPEED, usage=script.source):
        found.add(DEEPSPEED)
        if not _zero_stage_pinned_below_3(script):
            found.add(ZERO3)
    return frozenset(found)


#: A launch config file for DeepSpeed named in the script (``accelerate launch --config_file
#: configs/deepspeed_zero3.yaml``, in its usage text or as a default path): the run it is
#: launched with selects DeepSpeed, though the code itself never says so.
_LAUNCH_CONFIG = {
    FSDP: re.compile(r"fsdp[\w.-]*\.ya?ml\b", re.IGNORECASE),
    DEEPSPEED: re.compile(
        r"(?:deepspeed|\bds_|\bzero[_-]?[0-3])[\w.-]*\.(?:ya?ml|json)\b", re.IGNORECASE
    ),
}


def _mentions(code: str, backend: str, usage: str | None = None) -> bool:
    """The script names ``backend``: in its code, or by the launch config it is run with,
    which ``usage`` (the whole text, comments and docstrings too: ``accelerate launch
    --config_file configs/fsdp.yaml train.py`` in the usage text) may name instead."""
    return any(word in code for word in _MENTIONS[backend]) or bool(
        _LAUNCH_CONFIG[backend].search(code if usage is None else usage)
    )


def _without_prose(source: str) -> str:
    """``source`` less its comments and docstrings (every string that is a statement of its
    own): a word there is prose, not a backend the script runs on (``# TODO: try FSDP later``
    above a DDP script is no FSDP run). The whole text where it does not tokenize."""
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    spans: list[tuple[int, int]] = []
    statement_start = True
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            kind = token.type
            if kind == tokenize.COMMENT or (kind == tokenize.STRING and statement_start):
                (row, col), (end_row, end_col) = token.start, token.end
                spans.append((starts[row - 1] + col, starts[end_row - 1] + end_col))
            # a string leaves the flag as it is: all of ``"a" "b"`` goes, ``x = "a"`` stays
            if kind not in (tokenize.NL, tokenize.COMMENT, tokenize.STRING):
                statement_start = kind in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    except (tokenize.TokenError, SyntaxError):
        return source
    pieces, at = [], 0
    for start, end in spans:
        pieces.append(source[at:start])
        at = end
    pieces.append(source[at:])
    return "".join(pieces)


#: Where a DeepSpeed JSON config (which may ask for ZeRO-3) comes in instead of the plugin's own
#: ``zero_stage``.
_DEEPSPEED_CONFIG_FILES = ("hf_ds_config", "ds_config", "deepspeed_config")


def _zero_stage_pinned_below_3(script: ScriptModel) -> bool:
    """``DeepSpeedPlugin(zero_stage=2, ...)``, every plugin the script builds with a literal stage
    under 3, and every DeepSpeed config the script spells a dict of (``{"zero_optimization":
    {"stage": 2}}``, handed as ``hf_ds_config``) one with a literal stage under 3, no config
    file named: the weights are whole on every rank, so what gathers them under ZeRO-3
    (``save_model``, ``get_state_dict``) is no collective here. A plugin's literal stage is
    what runs (the launcher's config only fills a stage left unset)."""
    if _LAUNCH_CONFIG[DEEPSPEED].search(script.source):
        return False  # ``ds_config.json``, ``deepspeed_zero3.yaml``: the stage is in the file
    stages: list[int] = []
    configs_here = any(word in script.source for word in _DEEPSPEED_CONFIG_FILES)
    for call in script.calls:
        if (dotted(call.func) or "").rsplit(".", 1)[-1] != "DeepSpeedPlugin":
            continue
        stage = keyword_value(call, "zero_stage")
        if isinstance(stage, cst.Integer):
            stages.append(stage.evaluated_value)
        elif keyword_value(call, "hf_ds_config") is not None:
            configs_here = True
        else:
            return False  # the stage comes from the launcher's config
    if configs_here:
        spelled = _config_stages(script)
        if not spelled:
            return False  # a config the file does not spell (a path, a setting)
        stages.extend(spelled)
    return bool(stages) and all(stage < 3 for stage in stages)


def _config_stages(script: ScriptModel) -> list[int]:
    """The stage of each ``{"zero_optimization": {"stage": N}}`` the file spells, and of each
    stage it sets in one (``ds_config["zero_optimization"]["stage"] = N``); empty where one of
    them is no literal (``"stage": args.stage``, ``[...]["stage"] = args.zero_stage``: the
    run's, ZeRO-3 perhaps) or none is spelled."""
    stages = []
    for node in script.index.of_type(cst.Dict):
        for element in node.elements:  # type: ignore[attr-defined]
            if not (
                isinstance(element, cst.DictElement)
                and isinstance(element.key, cst.SimpleString)
                and element.key.evaluated_value == "zero_optimization"
            ):
                continue
            stage = _stage_of(element.value)
            if not isinstance(stage, cst.Integer):
                return []
            stages.append(stage.evaluated_value)
    for node in script.index.of_type(cst.Assign):
        for target in node.targets:  # type: ignore[attr-defined]
            key = _subscript_key(target.target)
            if key == "stage" and "zero_optimization" in script.module.code_for_node(target):
                stage = node.value  # type: ignore[attr-defined]
            elif key == "zero_optimization":
                stage = _stage_of(node.value)  # type: ignore[attr-defined]
            else:
                continue
            if not isinstance(stage, cst.Integer):
                return []  # ``ds_config["zero_optimization"]["stage"] = args.zero_stage``
            stages.append(stage.evaluated_value)
    return stages


def _subscript_key(target: cst.BaseExpression) -> str | None:
    """``"stage"`` of ``ds_config["zero_optimization"]["stage"]``."""
    if not isinstance(target, cst.Subscript) or len(target.slice) != 1:
        return None
    index = target.slice[0].slice
    if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString):
        key = index.value.evaluated_value
        return key if isinstance(key, str) else None
    return None


def _stage_of(value: cst.BaseExpression) -> cst.BaseExpression | None:
    """The ``"stage"`` entry of a dict literal, or None."""
    if not isinstance(value, cst.Dict):
        return None
    return next(
        (
            e.value
            for e in value.elements
            if isinstance(e, cst.DictElement)
            and isinstance(e.key, cst.SimpleString)
            and e.key.evaluated_value == "stage"
        ),
        None,
    )


def _refusals(script: ScriptModel) -> list[cst.Assert]:
    """``assert x != DistributedType.FSDP`` (``not in``, ``is None``): a script that names a
    backend only to refuse it never runs on it."""
    found = []
    for node in script.index.of_type(cst.Assert):
        if not isinstance(node.test, cst.Comparison):
            continue
        if len(node.test.comparisons) != 1:
            continue
        comparison = node.test.comparisons[0]
        refuses = isinstance(comparison.operator, (cst.NotEqual, cst.NotIn)) or (
            isinstance(comparison.operator, cst.Is) and dotted(comparison.comparator) == "None"
        )
        if refuses:
            found.append(node)
    return found


def collective_backends(
    script: ScriptModel, call: cst.Call, accelerators: set[str]
) -> frozenset[str]:
    """Where ``call`` is a collective under the script's runtime; empty when it is none."""
    func = call.func
    if (
        isinstance(func, cst.Attribute)
        and func.attr.value in ACCELERATOR_METHODS
        and dotted(func.value) in accelerators
    ):
        if func.attr.value in _WEIGHTS_GATHERING and _never_prepared(script, call):
            return frozenset()
        if func.attr.value == "get_state_dict" and _of_an_optimizer(script, call):
            return OPTIMIZER_STATE_GATHERED.on(runtime_of(script))
        return ACCELERATOR_METHODS[func.attr.value].on(runtime_of(script))
    found = script.call_names(call) & FUNCTIONS
    if found:
        return frozenset() if _on_a_subgroup(call, found) else EVERY_BACKEND
    return frozenset()


#: ``accelerator.get_state_dict(optimizer)``: accelify's runtime gathers the optimizer's whole
#: state under FSDP and every ZeRO stage (each splits it); HF's takes models only and fails
#: alike on every rank, which is no hang.
OPTIMIZER_STATE_GATHERED = Collective(frozenset(), SHARDING)


def _of_an_optimizer(script: ScriptModel, call: cst.Call) -> bool:
    """``accelerator.get_state_dict(optimizer)``: the argument is an optimizer of the file."""
    from accelify.analysis.facts import facts_of  # facts is built on this module

    handed = argument_value(call, "model")
    name = dotted(handed) if handed is not None else None
    return name is not None and facts_of(script).flow.kind_of(name, call) is Kind.OPTIMIZER


#: The methods that gather a prepared model's full weights (under FSDP and ZeRO-3).
_WEIGHTS_GATHERING = frozenset({"save_model", "get_state_dict"})
#: Calls that hand back the object they are given (a prepared model stays one).
_HANDING_BACK = frozenset({"prepare", "prepare_model", "unwrap_model", "deepcopy", "copy"})


def _never_prepared(script: ScriptModel, call: cst.Call) -> bool:
    """``accelerator.save_model(ema_model, path)`` where ``ema_model`` is a name the call's own
    function (or the module) binds only to objects it makes (``EMAModel(...)``, a model loaded
    for export) and that no ``prepare`` returns anywhere in the file: no sharded engine or FSDP
    unit to gather weights from, so no collective (under ZeRO-3 it fails on every rank alike:
    an object DeepSpeed never wrapped has no ``zero_gather_16bit_weights_on_model_save``)."""
    model = argument_value(call, "model")
    name = dotted(model) if model is not None else None
    if name is None or "." in name or name in script.prepared_names:
        return False
    scope = script.scope_of(call)
    if isinstance(scope, cst.FunctionDef) and name in {
        p.name.value for p in (*scope.params.params, *scope.params.kwonly_params)
    }:
        return False
    assignments = [a for a in script.index.assignments_to(name) if script.scope_of(a) is scope]
    return bool(assignments) and all(
        isinstance(a.value, cst.Call)
        and (dotted(a.value.func) or "").rsplit(".", 1)[-1] not in _HANDING_BACK
        for a in assignments
    )


#: Where torch.distributed's collectives take their ``group`` positionally.
_GROUP_POSITION = {
    "barrier": 0, "broadcast": 2, "all_reduce": 2, "all_gather": 2, "broadcast_object_list": 2,
    "all_gather_object": 2, "reduce": 3, "gather": 3, "scatter": 3, "reduce_scatter": 3,
    "gather_object": 3, "all_to_all": 2,
}  # fmt: skip


def _on_a_subgroup(call: cst.Call, names: set[str]) -> bool:
    """A ``torch.distributed`` collective given a process group other than the world's
    (``group=model_update_group``): only that group's members take part, and which ranks those
    are is not in the code (OpenRLHF's and open-instruct's weight broadcast to vLLM runs on
    rank 0 alone, in a group of rank 0 and the engines). Whether a rank guard around it leaves
    a member out cannot be told, so it is no collective of every rank here."""
    name = next((n for n in names if n.startswith("torch.distributed.")), None)
    if name is None:
        return False
    group = argument_value(call, "group", _GROUP_POSITION.get(name.rsplit(".", 1)[-1]))
    if group is None:
        return False
    spelled = dotted(group) or ""
    return spelled != "None" and not spelled.endswith("group.WORLD")


def named(backends: frozenset[str]) -> str:
    names = [BACKEND_NAMES[b] for b in (DDP, FSDP, DEEPSPEED, ZERO3) if b in backends]
    if DEEPSPEED in backends:
        names = [n for n in names if n != BACKEND_NAMES[ZERO3]]
    return " and ".join(names)


def read_outside_agreement(script: ScriptModel, node: cst.CSTNode) -> set[str]:
    """The variables ``node`` reads outside every call that makes its value the same on every
    rank: ``step`` of ``accelerator.reduce(loss).isnan() or step > limit``, not ``loss``, which
    the test only sees reduced (every rank decides on the same sum)."""
    found: set[str] = set()
    pending = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, cst.Call) and agrees_across_ranks(script, current):
            continue
        if isinstance(current, cst.Name):
            found.add(current.value)
        elif isinstance(current, cst.Attribute):
            pending.append(current.value)  # ``x`` of ``x.mean``, not the member's name
        else:
            pending += children_of(current)
    return found
