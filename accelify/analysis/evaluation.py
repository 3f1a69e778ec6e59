"""placeholder"""

from __future__ import annotations


class Evaluation: ...


def evaluation_of(loop, facts):
    return None
