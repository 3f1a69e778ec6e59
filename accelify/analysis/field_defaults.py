"""Class-body field defaults (``device: str = "cpu"`` of a dataclass or a config class) that the
file's constructions of the class override (``Config(device=args.device)``).

Such a default is not the value the script runs with: the instance's attribute is what the
construction passed, and every ``config.device`` (or ``self.device`` in the class) reads that
value. A rewrite of the default would change nothing the script reads and, at module level,
make an Accelerator before the script's own code runs; the conversion follows the passed value
to its reads instead. A construction from a mapping (``Config(**yaml.safe_load(f))``) may set
the field or not, as a file the script reads says: its default is left alone the same way (a
module-level Accelerator made for a default that the yaml overrides anyway, in a ``str`` field,
is what a user does not want).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from accelify.analysis.script_model import Binding, ScriptModel
from accelify.analysis.syntax import dotted


@dataclass
class OverriddenField:
    owner: cst.ClassDef
    field: str
    #: the constructions of ``owner`` that pass ``field``
    constructions: list[cst.Call]
    #: the argument each of them passes (the constructions that name it)
    passed: list[cst.BaseExpression]
    #: ``instance.field`` reads of the file (``self.field`` in the class too)
    reads: list[cst.Attribute]
    #: the constructions that pass a mapping (``Config(**overrides)``) and do not name the field
    unpacked: list[cst.Call] = field(default_factory=list)


def overridden_field(model: ScriptModel, binding: Binding) -> OverriddenField | None:
    """``binding`` as a field default of a class body whose every construction in the file
    passes that field (by keyword, or by position in a dataclass's field order) or a mapping
    that may (``**overrides``); None when it is no field, or some construction (or none at
    all) leaves the default in place."""
    owner = _class_body_owner(model, binding.statement)
    if owner is None or "." in binding.name:
        return None
    constructions = [call for call in model.calls if dotted(call.func) == owner.name.value]
    passed = [_passed(owner, call, binding.name) for call in constructions]
    unpacked = [
        call
        for call, value in zip(constructions, passed, strict=True)
        if value is None and any(argument.star == "**" for argument in call.args)
    ]
    if not constructions or sum(value is None for value in passed) > len(unpacked):
        return None
    reads = _reads(model, owner, binding.name)
    named = [value for value in passed if value is not None]
    return OverriddenField(owner, binding.name, constructions, named, reads, unpacked)


def _class_body_owner(model: ScriptModel, line: cst.CSTNode) -> cst.ClassDef | None:
    block = model.parent(line)
    owner = model.parent(block) if isinstance(block, cst.IndentedBlock) else None
    return owner if isinstance(owner, cst.ClassDef) else None


def _fields(owner: cst.ClassDef) -> list[str]:
    """A dataclass's fields in order: the annotated names of its body."""
    body = owner.body.body if isinstance(owner.body, cst.IndentedBlock) else []
    found = []
    for line in body:
        if isinstance(line, cst.SimpleStatementLine):
            for small in line.body:
                if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name):
                    found.append(small.target.value)
    return found


def _is_dataclass(owner: cst.ClassDef) -> bool:
    for decorator in owner.decorators:
        node = decorator.decorator
        name = dotted(node.func if isinstance(node, cst.Call) else node) or ""
        if name.rsplit(".", 1)[-1] == "dataclass":
            return True
    return False


def _passed(owner: cst.ClassDef, call: cst.Call, field: str) -> cst.BaseExpression | None:
    for argument in call.args:
        if argument.keyword is not None and argument.keyword.value == field:
            return argument.value
    if any(argument.star for argument in call.args):
        return None  # ``Config(**overrides)``: what it sets is not in the file
    if not _is_dataclass(owner):
        return None
    order = _fields(owner)
    positional = [a for a in call.args if a.keyword is None]
    if field in order and order.index(field) < len(positional):
        return positional[order.index(field)].value
    return None


def _reads(model: ScriptModel, owner: cst.ClassDef, field: str) -> list[cst.Attribute]:
    graph = model.call_graph
    found = []
    for node in model.index.of_type(cst.Attribute):
        if not isinstance(node, cst.Attribute) or node.attr.value != field:
            continue
        holder = dotted(node.value)
        if holder is None:
            continue
        if holder == "self":
            if model.index.enclosing_class_name(node) == owner.name.value:
                found.append(node)
        elif graph.instance_class(holder, node) == owner.name.value:
            found.append(node)
    return found
