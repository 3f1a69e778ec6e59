"""Prepared models whose forward is a collective under DDP: those that hold buffers.

DDP is built with ``broadcast_buffers=True`` (HF Accelerate's and accelify's default), and its
forward broadcasts the module's buffers from rank 0 whenever the last forward ran with
gradients on (``_pre_forward`` -> ``_sync_buffers`` in torch 2.13; in train mode and in eval
mode alike, also under ``torch.no_grad()``: the first no-grad forward after training still
syncs). Measured on 2 ranks (gloo, after three training steps): a forward on the main process
alone of a DDP model with a BatchNorm hangs, in eval or train mode, with or without
``no_grad``; the same model without buffers, or the one ``accelerator.unwrap_model`` returns,
runs. So ``if accelerator.is_main_process: evaluate(model, ...)`` hangs exactly when the
model holds buffers.

A model holds buffers here when it is made by a class of the file (or one it imports from
another module of the project, also through its module: ``net.Net()``) whose code builds a
BatchNorm (``SyncBatchNorm`` too) or calls ``register_buffer`` (also through the other classes
it builds, each looked up from the module that names it, and through its base classes), by
``nn.Sequential`` of such layers, or by a torchvision constructor of a
family built on BatchNorm (``resnet50()``), or a transformers model of a family whose
embeddings register buffers (``CLIPModel.from_pretrained(...)``: ``position_ids``; Llama's
rotary ``inv_freq``). Other models of other libraries are not judged (``AutoModel`` may be
any architecture)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis import names
from accelify.analysis.objects import bound_arguments
from accelify.analysis.project_modules import read
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted, walk

if TYPE_CHECKING:
    from accelify.analysis.facts import Facts
    from accelify.analysis.outside_callers import ProjectView

#: Layers that hold running statistics as buffers.
_BUFFERED_LAYERS = re.compile(r"^torch\.nn\.(?:modules\.\w+\.)?(?:Lazy)?(?:Sync)?BatchNorm\w*$")
#: torchvision families built on BatchNorm.
_BUFFERED_VISION = re.compile(
    r"^torchvision\.models\.(?:\w+\.)?(?:resnet|resnext|wide_resnet|densenet|efficientnet|"
    r"mobilenet|mnasnet|regnet|shufflenet|inception|googlenet|vgg\d+_bn)\w*$"
)
#: transformers families whose embeddings register buffers in every release that has them
#: (CLIP's and BERT's ``position_ids``, RoBERTa's too; the rotary ``inv_freq`` of Llama,
#: Mistral and Qwen2), made by their class or its ``from_pretrained``; not ``AutoModel``
#: (any architecture) nor families whose buffers came and went between releases.
_BUFFERED_TRANSFORMERS = re.compile(
    r"^transformers\.(?:models\.[\w.]+\.)?(?:CLIP|Bert|Roberta|XLMRoberta|Llama|Mistral|Qwen2)"
    r"(?:Model|For\w+|TextModel\w*|VisionModel\w*)(?:\.from_pretrained)?$"
)
#: Methods of a module that move it or switch its mode, returning it: they add no buffers.
_MOVES = frozenset({"to", "cuda", "cpu", "float", "half", "double", "bfloat16", "train", "eval"})
#: How many of the file's classes deep a class's layers are followed.
_DEPTH = 3


def buffered_prepared_models(script: ScriptModel) -> frozenset[str]:
    """The names ``prepare`` returns for models that hold buffers; empty where the file turns
    ``broadcast_buffers`` off (its forward then broadcasts nothing)."""
    memo = script.__dict__.get("_buffered_prepared_models")
    if memo is not None:
        return memo
    found: set[str] = set()
    if not _buffer_broadcast_off(script):
        models = script.of_kind(Kind.MODEL)
        for prepare in script.prepare_calls:
            arguments = [a.value for a in prepare.call.args]
            for given, output, argument in zip(
                prepare.inputs, prepare.outputs, arguments, strict=False
            ):
                if not output:
                    continue
                # a bound model, or one made in the call (``accelerator.prepare(Net(), opt)``)
                values = [b.value for b in models if b.name == given] if given else [argument]
                if any(_holds_buffers(script, value, _DEPTH) for value in values):
                    found.add(output)
    script.__dict__["_buffered_prepared_models"] = frozenset(found)
    return frozenset(found)


def _buffer_broadcast_off(script: ScriptModel) -> bool:
    """The file passes ``broadcast_buffers=False`` to a call (``DistributedDataParallelKwargs(
    broadcast_buffers=False)`` as a kwargs handler): its DDP forward then broadcasts nothing. A
    mention elsewhere (a comment, ``broadcast_buffers=True``, a config key) changes nothing."""
    return any(
        arg.keyword is not None
        and arg.keyword.value == "broadcast_buffers"
        and isinstance(arg.value, cst.Name)
        and arg.value.value == "False"
        for node in script.index.of_type(cst.Call)  # the analysis's walk, by type
        for arg in node.args  # type: ignore[attr-defined]
    )


def builds_no_buffers(script: ScriptModel, value: cst.BaseExpression) -> bool:
    """``value`` builds a module the file shows holds no buffers: made of ``torch.nn`` layers
    only, none of them a BatchNorm (``nn.Sequential(nn.Linear(2, 32), nn.ReLU(), ...)``).
    Anything else (a class, a library's model, a factory, a name) may hold some: False. A
    move or mode switch after it (``.to(device)``, ``.train()``) adds none."""
    while (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in _MOVES
    ):
        value = value.func.value
    if not isinstance(value, cst.Call):
        return False
    for node in walk(value):
        if isinstance(node, cst.Call) and not any(
            n.startswith("torch.nn.") for n in script.call_names(node)
        ):
            return False
    return not _holds_buffers(script, value, 0)


def _holds_buffers(
    script: ScriptModel,
    value: cst.BaseExpression,
    depth: int,
    file: Path | None = None,
    project: ProjectView | None = None,
) -> bool:
    """``value`` builds a module with buffers (see the module docstring). ``script`` is the
    linted file's analysis, or, with ``file``, that of the project module a class was read
    from (its own imports name the classes it builds); ``project``: the linted file's view."""
    project = project if project is not None else script.project
    for node in walk(value):
        if not isinstance(node, cst.Call):
            continue
        qualified = script.call_names(node)
        if any(_buffered_library_class(n) for n in qualified):
            return True
        made = dotted(node.func)
        if (
            made is not None
            and depth > 0
            and _class_holds_buffers(script, made, depth - 1, file, project)
        ):
            return True
    return False


def _buffered_library_class(qualified: str) -> bool:
    """A layer, torchvision family or transformers class whose instances hold buffers."""
    return bool(
        _BUFFERED_LAYERS.match(qualified)
        or _BUFFERED_VISION.match(qualified)
        or _BUFFERED_TRANSFORMERS.match(qualified)
    )


def _class_holds_buffers(
    script: ScriptModel,
    name: str,
    depth: int,
    file: Path | None = None,
    project: ProjectView | None = None,
) -> bool:
    """A class of the file, or one it imports from another module of the project (a reward
    model's ``from models.clip import CLIPForBinaryClassification``, also ``net.Net`` of ``from
    models import net``), read in its own module, which may import the classes it builds from
    a third one (a reward model's backbone). A class holds buffers also when one of its base
    classes does (``register_buffer`` in a base's ``__init__``, or a library class that holds
    them: ``class Encoder(CLIPModel)``)."""
    classes = [
        s for s in script.module.body if isinstance(s, cst.ClassDef) and s.name.value == name
    ]
    if not classes and project is not None:
        imported = project.class_imported_by(script, name, file or project.path)
        if imported is not None:
            script, found, file = imported
            classes = [found]
    for cls in classes:
        for node in walk(cls):
            if (
                isinstance(node, cst.Call)
                and isinstance(node.func, cst.Attribute)
                and node.func.attr.value == "register_buffer"
                and _registered_when_built(script, cls, node, project)
            ):
                return True
            if isinstance(node, cst.Call) and _holds_buffers(script, node, depth, file, project):
                return True
        if depth > 0 and any(
            _base_holds_buffers(script, base.value, depth - 1, file, project) for base in cls.bases
        ):
            return True
    return False


def _registered_when_built(
    script: ScriptModel, cls: cst.ClassDef, register: cst.Call, project: ProjectView | None
) -> bool:
    """``register`` runs for an instance: in the class's ``__init__`` (or outside its methods),
    or in a method some code calls (``.cache(`` in the class's module, the linted file or a
    module read for it, a subclass's). A buffer a method nobody calls would register is never
    there (review8a)."""
    method = next(
        (
            a
            for a in script.ancestors(register)
            if isinstance(a, cst.FunctionDef) and script.parent(script.parent(a)) is cls
        ),
        None,
    )
    if method is None or method.name.value == "__init__":
        return True
    called = f".{method.name.value}(".encode()
    if called in script.module.code.encode():
        return True
    # the linted file and the modules read for it so far (a subclass's module among them)
    return project is not None and any(
        called in read(file) for file in (project.path, *project.read)
    )


def _base_holds_buffers(
    script: ScriptModel,
    base: cst.BaseExpression,
    depth: int,
    file: Path | None,
    project: ProjectView | None,
) -> bool:
    """A base class (``class RewardModel(Normalised)``) whose instances hold buffers."""
    name = dotted(base)
    if name is None or name in {"object", "Module", "nn.Module", "torch.nn.Module"}:
        return False
    if _buffered_library_class(script.imports.resolve(name) or name):
        return True
    return _class_holds_buffers(script, name, depth, file, project)


def forward_syncs_buffers(script: ScriptModel, call: cst.Call) -> bool:
    """``call`` is the forward of a prepared model that holds buffers (``model(x)``, also
    through a helper's parameter its callers fill with one): under DDP a collective."""
    buffered = buffered_prepared_models(script)
    if not buffered:
        return False
    from accelify.analysis.facts import facts_of  # facts builds on the analysis modules

    flow = facts_of(script).flow
    if not flow.forward_of_prepared(call):
        return False
    func = call.func
    name = dotted(
        func.value if isinstance(func, cst.Attribute) and func.attr.value == "generate" else func
    )
    if _unwrapped_at(script, name, call, _DEPTH):
        return False
    return name in buffered or flow.outer_name(name, call) in buffered


def _unwrapped_at(script: ScriptModel, name: str | None, at: cst.CSTNode, depth: int) -> bool:
    """``name`` holds the bare module at ``at``: its last binding above ``at`` is
    ``accelerator.unwrap_model(...)`` or ``wrapped.module`` (the module DDP wraps, whose forward
    syncs nothing); for a helper's parameter, every caller passes such a name. A binding in a
    branch a run may skip does not count (`_may_be_skipped`), but one under a rank test
    (``model = accelerator.unwrap_model(model)`` under ``if is_main_process:``, where the
    forward on one rank goes) does, and so does one under a test every wrapped model passes
    (``if hasattr(model, "module"): model = model.module``)."""
    from accelify.analysis.facts import facts_of  # facts builds on the analysis modules
    from accelify.analysis.loss_sources import last_binding

    if name is None:
        return False
    binding = last_binding(script, name, at)
    facts = facts_of(script)
    if binding is not None:
        value = binding.value if isinstance(binding, cst.Assign | cst.AnnAssign) else None
        return value is not None and _unwraps(value) and not _may_be_skipped(facts, binding, at)
    function = facts.placement.enclosing_function(at)
    if function is None or depth == 0 or "." in name:
        return False
    passed = [
        argument.value
        for call, implicit in facts.flow.calls_of(function)
        for parameter, argument in bound_arguments(function, call, implicit)
        if parameter == name
    ]
    return bool(passed) and all(
        _unwraps(value) or _unwrapped_at(script, dotted(value), value, depth - 1)
        for value in passed
    )


#: Module methods that return the module itself: ``unwrap_model(model).to("cpu")`` is still
#: the unwrapped module.
_RETURNS_ITSELF = frozenset({"to", "cpu", "cuda", "eval", "train", "float", "half", "bfloat16"})


def _unwraps(value: cst.BaseExpression) -> bool:
    """``accelerator.unwrap_model(model)`` or ``model.module``, also moved or switched after
    (``accelerator.unwrap_model(model).to("cpu")``, ``.eval()``)."""
    while (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in _RETURNS_ITSELF
    ):
        value = value.func.value
    if isinstance(value, cst.Attribute):
        return value.attr.value == "module"
    return (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value == "unwrap_model"
    )


def _may_be_skipped(facts: Facts, binding: cst.CSTNode, at: cst.CSTNode) -> bool:
    """``binding`` sits in a branch ``at`` is not in, whose test is no rank test: a run may
    skip it (``if args.export: model = accelerator.unwrap_model(model)``) and reach ``at``
    with the wrapper. A branch on the main process (``if accelerator.is_main_process:``) is
    taken by the ranks a forward under the same test runs on, and one only a bare module
    skips (``if hasattr(model, "module"):``) by every wrapped model."""
    script = facts.model
    for ancestor in script.ancestors(binding):
        if isinstance(ancestor, cst.FunctionDef) or script.inside(at, ancestor):
            return False
        if (
            isinstance(ancestor, cst.If)
            and not facts.ranks.is_rank_test(ancestor.test)
            and not (
                _taken_when_wrapped(script, ancestor) and script.inside(binding, ancestor.body)
            )
        ):
            return True
        if isinstance(ancestor, cst.ExceptHandler):
            return True
    return False


def _taken_when_wrapped(script: ScriptModel, branch: cst.If) -> bool:
    """``branch``'s test holds whenever the model is wrapped, so the forward it guards from is
    the DDP one: ``if hasattr(model, "module"):``, ``if isinstance(model, DDP):`` (or a tuple
    of wrappers)."""
    test = branch.test
    if not (isinstance(test, cst.Call) and isinstance(test.func, cst.Name) and len(test.args) == 2):
        return False
    second = test.args[1].value
    if test.func.value == "hasattr":
        return isinstance(second, cst.SimpleString) and second.evaluated_value == "module"
    if test.func.value != "isinstance":
        return False
    kinds = [e.value for e in second.elements] if isinstance(second, cst.Tuple) else [second]
    return any(script.imports.resolve(dotted(kind) or "") in names.DDP_WRAPPERS for kind in kinds)
