"""DataLoaders the script shards itself, with a distributed sampler.

A loader built with ``sampler=DistributedSampler(...)`` (or a name bound to one) already gives
each rank its 1/N of the data: left out of ``accelerator.prepare`` it is sharded, and prepared
it is sharded twice (ACC402). A loader whose ``.sampler.set_epoch(epoch)`` the script calls
holds such a sampler too, made where the loader is (a project helper's
``get_dataloader(...)``): a plain sampler has no ``set_epoch``.
"""

from __future__ import annotations

import libcst as cst

from accelify.analysis import names
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted, strip_self_methods

_SAMPLER_KEYWORDS = frozenset({"sampler", "batch_sampler"})


def distributed_sampler_argument(script: ScriptModel, call: cst.Call) -> bool:
    """``DataLoader(data, sampler=s)`` where ``s`` is a DistributedSampler (a name bound to one,
    or the constructor's call in place)."""
    samplers = script.names_of(Kind.SAMPLER)
    for argument in call.args:
        if argument.keyword is None or argument.keyword.value not in _SAMPLER_KEYWORDS:
            continue
        value = argument.value
        if dotted(value) in samplers:
            return True
        if isinstance(value, cst.Call) and script.call_names(value) & names.DISTRIBUTED_SAMPLERS:
            return True
    return False


def sharded_by_its_sampler(script: ScriptModel, loader: str | None) -> bool:
    """``loader`` is built with a DistributedSampler, or the script sets its sampler's epoch
    (``loader.sampler.set_epoch(epoch)``): each rank already reads its own part of the data."""
    if loader is None:
        return False
    for binding in script.of_kind(Kind.DATALOADER):
        value = strip_self_methods(binding.value)
        if (
            binding.name == loader
            and isinstance(value, cst.Call)
            and distributed_sampler_argument(script, value)
        ):
            return True
    for call in script.calls:
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value == "set_epoch":
            owner = func.value
            if (
                isinstance(owner, cst.Attribute)
                and owner.attr.value in _SAMPLER_KEYWORDS
                and dotted(owner.value) == loader
            ):
                return True
    return False
