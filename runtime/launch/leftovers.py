"""The folders a launch keeps in the temporary folder (the ranks' records, the template's socket),
named after the process that owns them, and the sweep of those whose owner is gone.

Every way a launch ends removes its folders (Ctrl-C, SIGTERM, a rank or the template killed)
but one: the launcher itself killed by SIGKILL, which runs nothing. A later launch removes what
such a launcher left: a folder named ``accelify-KIND-NS-PID-...`` of this user, whose process
PID no longer exists in this process's PID namespace NS (the inode of ``/proc/self/ns/pid``: a
container that shares the temporary folder numbers its processes apart, and its folders are
never taken for gone). Standard library only.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

from accelify.runtime.launch.lifeline import alive

#: The kinds of folder: the launcher's records, the template's socket, the tests' fork server
KINDS = ("launch", "ranks", "forks")
_NAME = re.compile(r"accelify-(?P<kind>[a-z]+)-(?P<ns>\d+)-(?P<pid>\d+)-")


def _namespace() -> str:
    """This process's PID namespace, as a number ("0" where there is none to read)."""
    try:
        link = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return "0"
    digits = re.sub(r"\D", "", link)
    return digits or "0"


def prefix(kind: str) -> str:
    """The name's start for a folder of ``kind`` owned by this process."""
    return f"accelify-{kind}-{_namespace()}-{os.getpid()}-"


def sweep(folder: str | None = None) -> list[Path]:
    """Remove the folders of launches whose owner is gone (see above); the ones removed."""
    root = Path(folder or tempfile.gettempdir())
    try:
        names = os.listdir(root)
    except OSError:
        return []
    namespace, uid = _namespace(), os.getuid()
    removed = []
    for name in names:
        found = _NAME.match(name)
        if found is None or found["kind"] not in KINDS or found["ns"] != namespace:
            continue
        path = root / name
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid or _alive(int(found["pid"])):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    return pid <= 0 or alive(pid)  # pid 0 or below: not a process of ours to judge
