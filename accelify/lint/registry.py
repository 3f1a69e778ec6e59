"""The rule catalog: one class per module in `accelify.rules`, sorted by code."""

from __future__ import annotations

import functools
import importlib
import inspect

from accelify.lint.rule import Rule


@functools.cache
def all_rules() -> tuple[Rule, ...]:
    package = importlib.import_module("accelify.rules")
    found = []
    for module_name in package.RULE_MODULES:
        module = importlib.import_module(f"accelify.rules.{module_name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Rule) and cls is not Rule and cls.__module__ == module.__name__:
                found.append(cls())
    return tuple(sorted(found, key=lambda rule: rule.code))


def rule_by_code(code: str) -> Rule | None:
    return next((rule for rule in all_rules() if rule.code == code.upper()), None)
