"""Check 4: files the ranks share, read from the converted code.

A file the main process writes and every rank reads back (the best weights an early-stopping
object saved, reloaded for the test) races without a barrier between the two: rank 1 reads
nothing yet, last run's file, or half of one. Whether a run shows it depends on which rank gets
there first, so a passing run proves nothing; the check reads it from the code the way
``accelify lint`` does (ACC212, the same analysis). A ``# noqa`` does not silence it here: the
verdict says what the conversion does. Shown only where the conversion reads back a file that
one rank writes.
"""

from __future__ import annotations

from accelify.errors import UserError
from accelify.verify.checks import CheckResult

TITLE = "files written on the main process and read by every rank, read from the code"


def check_shared_files_code(code: str, label: str) -> CheckResult | None:
    """The check's result; None where the conversion reads back no file one rank writes (or
    does not parse: check 1 has said so already)."""
    from accelify.analysis.facts import facts_of
    from accelify.analysis.script_model import analyze
    from accelify.lint.registry import rule_by_code
    from accelify.source import parse

    try:
        script = analyze(parse(code.encode("utf-8"), label), code)
    except UserError:
        return None
    if not script.uses_accelerator:
        return None
    shared = facts_of(script).shared_files
    pairs = [*shared.written_by_one_rank_read_by_all, *shared.read_by_the_other_ranks]
    if not pairs:
        return None
    rule = rule_by_code("ACC212")
    assert rule is not None, "ACC212 is the rule this check runs"
    races = {finding.line for finding in rule.check(script)}
    result = CheckResult(TITLE, True, "", ["read", "written", "verdict"])
    for pair in pairs:
        found = pair[0] if isinstance(pair, tuple) else pair
        read, write = script.line(found.read), script.line(found.write)
        verdict = "RACE: no barrier between them" if read in races else "ordered"
        result.rows.append([str(read), str(write), verdict])
    raced = sorted(races & {int(row[0]) for row in result.rows})
    if raced:
        result.passed = False
        result.verdict = (
            f"FAIL: converted line {raced[0]} reads a file the main process writes, and nothing "
            "makes the other ranks wait for the write: they may read it before it is there, "
            "or half written (accelerator.wait_for_everyone() before the read)"
        )
    else:
        result.verdict = "pass: every read waits for the main process's write"
    return result
