"""DataLoaders the script shards itself, with a distributed sampler.

A loader built with ``sampler=DistributedSampler(...)`` (or a name bound to one) already gives
each rank its 1/N of the data: left out of ``accelerator.prepare`` it is sharded, and prepared
it is sharded twice (ACC402). A loader whose ``.sampler.set_epoch(epoch)`` the script calls
holds such a sampler too, made where the loader is (a project helper's
``get_dataloader(...)``): a plain sampler has no ``set_epoch``. Unless the file shows what the
sampler is: a loader built here with ``sampler=``/``batch_sampler=`` of a class of the file that
neither subclasses DistributedSampler nor reads a rank or a replica count (a project's bucket
sampler with its own ``set_epoch`` for the shuffle's seed), or of a torch sampler that does not
shard, reads the whole data set on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from accelify.analysis import names
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted, strip_self_methods, walk

_SAMPLER_KEYWORDS = frozenset({"sampler", "batch_sampler"})


@dataclass(frozen=True)
class ShardingSampler:
    """What shards a DataLoader by itself, as handed to it."""

    #: ``sampler`` or ``batch_sampler``
    keyword: str
    #: the DistributedSampler's call (None for a project's own class, or one made where the
    #: file does not show it)
    sampler: cst.Call | None = None
    #: the batch sampler built over it (``BatchSampler(DistributedSampler(ds), 8, False)``)
    batches: cst.Call | None = None
    #: a project's own sampler class that shards by the rank it is handed
    own: cst.ClassDef | None = None


def distributed_sampler_argument(script: ScriptModel, call: cst.Call) -> bool:
    """``DataLoader(data, sampler=s)`` where ``s`` is a DistributedSampler (a name bound to one,
    or the constructor's call in place)."""
    found = sharding_sampler(script, call)
    return found is not None and found.own is None


def sharding_sampler(script: ScriptModel, call: cst.Call) -> ShardingSampler | None:
    """What shards ``DataLoader(...)``'s data before ``prepare`` would: a DistributedSampler as
    its ``sampler=`` or under its ``batch_sampler=`` (`_distributed_sampler`), or a sampler class
    of the file that shards by the rank its call hands it (``BucketBatchSampler(lengths, 8,
    accelerator.num_processes, accelerator.process_index)``) or that derives from a
    DistributedSampler."""
    for argument in call.args:
        if argument.keyword is None or argument.keyword.value not in _SAMPLER_KEYWORDS:
            continue
        keyword = argument.keyword.value
        if _distributed_sampler(script, argument.value):
            made = _made(script, argument.value)
            if made is not None and not (script.call_names(made) & names.DISTRIBUTED_SAMPLERS):
                inner = made.args[0].value if made.args else None
                sampler = _made(script, inner) if inner is not None else None
                return ShardingSampler(keyword, sampler=sampler, batches=made)
            return ShardingSampler(keyword, sampler=made)
        made = _made(script, argument.value)
        own = _own_sharding_class(script, made) if made is not None else None
        if own is not None:
            return ShardingSampler(keyword, own=own)
    return None


def _made(script: ScriptModel, value: cst.BaseExpression, depth: int = 0) -> cst.Call | None:
    """The call that made ``value``: itself, or the one assignment of the name it reads."""
    if isinstance(value, cst.Call):
        return value
    name = dotted(value)
    if name is None or depth >= 4:
        return None
    bound = [a.value for a in script.index.assignments_to(name)]
    return _made(script, bound[0], depth + 1) if len(bound) == 1 else None


def _own_sharding_class(script: ScriptModel, made: cst.Call) -> cst.ClassDef | None:
    """The class of the file ``made`` builds, where it shards: it derives from a
    DistributedSampler, or it reads a rank or replica count (`_shards_itself`) and the call
    hands it the rank (``rank=accelerator.process_index``)."""
    classes = [
        c
        for c in script.index.of_type(cst.ClassDef)
        if isinstance(c, cst.ClassDef) and c.name.value == dotted(made.func)
    ]
    if len(classes) != 1 or not _shards_itself(script, classes[0]):
        return None
    handed_rank = any(script.reads_rank(argument.value) for argument in made.args)
    return classes[0] if handed_rank or _derives_from_distributed(script, classes[0]) else None


def _derives_from_distributed(script: ScriptModel, sampler: cst.ClassDef, depth: int = 0) -> bool:
    for base in sampler.bases:
        base_name = dotted(base.value) or ""
        if script.imports.resolve(base_name) in names.DISTRIBUTED_SAMPLERS:
            return True
        if depth < 8 and any(
            _derives_from_distributed(script, c, depth + 1)
            for c in script.index.of_type(cst.ClassDef)
            if isinstance(c, cst.ClassDef) and c.name.value == base_name and c is not sampler
        ):
            return True
    return False


def _distributed_sampler(script: ScriptModel, value: cst.BaseExpression, depth: int = 0) -> bool:
    """``value`` is a DistributedSampler: a name bound to one, the constructor's call, or a
    batch sampler built over one (``BatchSampler(DistributedSampler(ds), 8, False)``, or a name
    bound to it): the batches it yields hold this rank's indices only."""
    if dotted(value) in script.names_of(Kind.SAMPLER):
        return True
    name = dotted(value)
    if name is not None and depth < 4:
        bound = [a.value for a in script.index.assignments_to(name)]
        return bool(bound) and all(_distributed_sampler(script, v, depth + 1) for v in bound)
    if not isinstance(value, cst.Call):
        return False
    if script.call_names(value) & names.DISTRIBUTED_SAMPLERS:
        return True
    return depth < 4 and any(
        (argument.keyword is None or argument.keyword.value == "sampler")
        and _distributed_sampler(script, argument.value, depth + 1)
        for argument in value.args[:1] or ()
    )


def sharded_by_its_sampler(script: ScriptModel, loader: str | None) -> bool:
    """``loader`` is built with a DistributedSampler or a sampler class of the file that shards
    by the rank it is handed (`sharding_sampler`), or the script sets its sampler's epoch
    (``loader.sampler.set_epoch(epoch)``, `epoch_set_through`) and the file does not show that
    sampler reading the whole data set (`_whole_data_sampler`): each rank already reads its own
    part of the data. Lint (ACC402) and convert (which ``set_epoch`` goes) ask this one test."""
    if loader is None:
        return False
    for binding in script.of_kind(Kind.DATALOADER):
        value = strip_self_methods(binding.value)
        if (
            binding.name == loader
            and isinstance(value, cst.Call)
            and sharding_sampler(script, value) is not None
        ):
            return True  # a DistributedSampler, or a class of the file handed the rank
    epoch = epoch_set_through(script, loader)
    func = epoch.func if epoch is not None else None
    owner = func.value if isinstance(func, cst.Attribute) else None
    return isinstance(owner, cst.Attribute) and not _whole_data_sampler(
        script, loader, owner.attr.value
    )


def epoch_set_through(script: ScriptModel, loader: str) -> cst.Call | None:
    """``loader.sampler.set_epoch(epoch)`` (or ``.batch_sampler``): the script sets its own
    sampler's epoch through the loader. Prepared, the loader's ``batch_sampler`` is the
    Accelerator's shard wrapper (on several processes), which has no ``set_epoch``."""
    for call in script.calls:
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value == "set_epoch":
            owner = func.value
            if (
                isinstance(owner, cst.Attribute)
                and owner.attr.value in _SAMPLER_KEYWORDS
                and dotted(owner.value) == loader
            ):
                return call
    return None


#: The words a sampler that shards reads: its replica count and its rank.
_SHARDING_WORDS = frozenset(
    {"num_replicas", "rank", "get_rank", "get_world_size", "world_size", "process_index"}
)


def _whole_data_sampler(script: ScriptModel, loader: str, keyword: str) -> bool:
    """Every construction of ``loader`` in the file hands ``keyword`` (``sampler`` or
    ``batch_sampler``) a sampler that does not shard: a class of the file that neither
    subclasses DistributedSampler nor reads a rank or a replica count, or a torch sampler
    other than DistributedSampler."""
    values = [
        argument.value
        for binding in script.of_kind(Kind.DATALOADER)
        if binding.name == loader
        and isinstance(made := strip_self_methods(binding.value), cst.Call)
        for argument in made.args
        if argument.keyword is not None and argument.keyword.value == keyword
    ]
    return bool(values) and all(_does_not_shard(script, value) for value in values)


def _does_not_shard(script: ScriptModel, value: cst.BaseExpression) -> bool:
    if not isinstance(value, cst.Call):
        name = dotted(value)
        bound = [a.value for a in script.index.assignments_to(name)] if name else []
        return bool(bound) and all(_does_not_shard(script, v) for v in bound)
    called = script.call_names(value)
    if called & names.DISTRIBUTED_SAMPLERS:
        return False
    if any(n.startswith("torch.utils.data.") for n in called):
        return True  # RandomSampler, SequentialSampler, BatchSampler, ...
    classes = [
        c
        for c in script.index.of_type(cst.ClassDef)
        if isinstance(c, cst.ClassDef) and c.name.value == dotted(value.func)
    ]
    return len(classes) == 1 and not _shards_itself(script, classes[0])


def _shards_itself(script: ScriptModel, sampler: cst.ClassDef, depth: int = 0) -> bool:
    """The class subclasses a DistributedSampler or reads a rank or a replica count, itself or
    through a class of the file it subclasses (``BucketSampler(ShardSampler)``, where
    ``ShardSampler(DistributedSampler)``)."""
    for base in sampler.bases:
        base_name = dotted(base.value) or ""
        if "Distributed" in base_name or script.imports.resolve(base_name) in (
            names.DISTRIBUTED_SAMPLERS
        ):
            return True
        if depth < 8 and any(
            _shards_itself(script, c, depth + 1)
            for c in script.index.of_type(cst.ClassDef)
            if isinstance(c, cst.ClassDef) and c.name.value == base_name and c is not sampler
        ):
            return True
    return any(
        isinstance(node, (cst.Name, cst.Attribute))
        and (node.attr.value if isinstance(node, cst.Attribute) else node.value) in _SHARDING_WORDS
        for node in walk(sampler)
    )
