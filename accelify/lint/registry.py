"""The rule catalog: every module of the `accelify.rules` package holds one rule class.

Rules are found by walking the package, so a new rule file is in the catalog without being
listed anywhere; a module without exactly one rule is an error, not a silent gap."""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil

from accelify.lint.rule import Rule

#: Codes that moved into their band (DESIGN: 1xx devices, 2xx processes and I/O, 3xx gradients
#: and optimizer, 4xx data and metrics, 5xx precision and checkpoints). The old codes still
#: select, ignore and suppress (in noqa comments) the rule, with a warning, for one release.
REDIRECTS = {"ACC204": "ACC503", "ACC305": "ACC504", "ACC502": "ACC306"}


class CatalogError(RuntimeError):
    """A rules module that does not define exactly one rule: a packaging bug, not user input."""


@functools.cache
def all_rules() -> tuple[Rule, ...]:
    package = importlib.import_module("accelify.rules")
    found = []
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"accelify.rules.{info.name}")
        classes = [
            cls
            for _, cls in inspect.getmembers(module, inspect.isclass)
            if issubclass(cls, Rule) and cls is not Rule and cls.__module__ == module.__name__
        ]
        if len(classes) != 1:
            raise CatalogError(f"{module.__name__} defines {len(classes)} rules; expected one")
        found.append(classes[0]())
    return tuple(sorted(found, key=lambda rule: rule.code))


def all_codes() -> tuple[str, ...]:
    return tuple(rule.code for rule in all_rules())


@functools.cache
def default_codes() -> frozenset[str]:
    """The rules that run when nothing is selected: each finding is a bug (a hang, a crash, a
    lost or corrupted file, a silently wrong number); the others run when selected."""
    return frozenset(rule.code for rule in all_rules() if rule.default)


def current_code(code: str) -> str:
    """The code a rule has now, for a code a user may have written before it moved."""
    code = code.upper()
    return REDIRECTS.get(code, code)


def rule_by_code(code: str) -> Rule | None:
    wanted = current_code(code)
    return next((rule for rule in all_rules() if rule.code == wanted), None)
