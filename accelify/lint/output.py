"""Findings as text (ruff's ``path:line:col: CODE message``), JSON, GitHub workflow
annotations, or SARIF 2.1.0 for code-scanning tools."""

from __future__ import annotations

import json
from collections import Counter

from accelify import __version__
from accelify.lint.finding import Finding

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def render(findings: list[Finding], output_format: str) -> str:
    if output_format == "json":
        return json.dumps([_as_dict(f) for f in findings], indent=2)
    if output_format == "github":
        return "\n".join(
            f"::error title=accelify ({f.code}),file={f.path},line={f.line},col={f.column}::"
            f"{f.code} {f.message}"
            for f in findings
        )
    if output_format == "sarif":
        return json.dumps(_sarif(findings), indent=2)
    return "\n".join(f"{f.path}:{f.line}:{f.column}: {f.code} {f.message}" for f in findings)


def statistics(findings: list[Finding]) -> str:
    counts = Counter(f.code for f in findings)
    messages = {f.code: f.message for f in findings}
    return "\n".join(
        f"{count:5d}  {code}  {messages[code]}" for code, count in counts.most_common()
    )


def _as_dict(finding: Finding) -> dict[str, object]:
    return {
        "code": finding.code,
        "message": finding.message,
        "filename": finding.path,
        "location": {"row": finding.line, "column": finding.column},
        "fixable": finding.fixable,
        "fix": {"edits": [finding.edit.as_dict()]} if finding.edit is not None else None,
    }


def _sarif(findings: list[Finding]) -> dict[str, object]:
    from accelify.lint.registry import all_rules

    rules = [
        {
            "id": rule.code,
            "name": rule.name,
            "shortDescription": {"text": rule.message},
            "fullDescription": {"text": " ".join((rule.__doc__ or "").split())},
            "help": {"text": rule.why or rule.message},
        }
        for rule in all_rules()
    ]
    results = [
        {
            "ruleId": f.code,
            "level": "error",
            "message": {"text": f.message},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": f.path},
                        "region": {"startLine": f.line, "startColumn": f.column},
                    }
                }
            ],
        }
        for f in findings
    ]
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "accelify",
                        "version": __version__,
                        "informationUri": "https://pypi.org/project/accelify/",
                        "rules": rules,
                    }
                },
                "results": results,
            }
        ],
    }
