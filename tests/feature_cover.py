"""Which cases the default run launches, where launching every case is the exhaustive run's job.

A case's features are the runtime calls, runtime imports and `Accelerator` arguments its
converted code uses (plus what its caller adds). The default run launches a greedy cover: cases
picked in turn, each adding the most features no picked case has (ties by name), until every
feature of every case is launched at least once, then the picked cases whose features the other
picked cases all have between them are dropped. A new case with a new feature is launched by
default without a list to edit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TypeVar

Case = TypeVar("Case")

_CALL = re.compile(r"accelerator\.(\w+)")
_IMPORT = re.compile(r"from (?:accelify|accelerate)(?:\.\w+)* import ([\w, ]+)")
_ACCELERATOR_ARGUMENTS = re.compile(r"Accelerator\(([^)]*)\)")


def runtime_features(converted: str) -> frozenset[str]:
    calls = {f"call {name}" for name in _CALL.findall(converted)}
    imports = {
        f"import {name.strip()}"
        for names in _IMPORT.findall(converted)
        for name in names.split(",")
    }
    arguments = {
        f"argument {name}"
        for inside in _ACCELERATOR_ARGUMENTS.findall(converted)
        for name in re.findall(r"(\w+)=", inside)
    }
    return frozenset(calls | imports | arguments)


def covering(features: Mapping[Case, frozenset[str]]) -> set[Case]:
    left = set().union(*features.values()) if features else set()
    picked: list[Case] = []
    while left:
        best = max(sorted(features, key=str), key=lambda case: len(features[case] & left))
        picked.append(best)
        left -= features[best]
    # A case picked early can end up adding nothing: the cases picked after it hold all its
    # features between them. Dropped, latest-picked first (the early picks cover the most).
    for case in reversed(list(picked)):
        rest = [other for other in picked if other != case]
        if features[case] <= set().union(*(features[other] for other in rest)):
            picked = rest
    return set(picked)
