"""A frame in an installed package is never "the user's line": every folder ``site`` installs
packages into counts (the system's, the user's, Debian's ``dist-packages``), not only the
running environment's purelib/platlib."""

from __future__ import annotations

import os
import site
import sys

from accelify.runtime import collective_record


def _covered(folder: str) -> bool:
    prefixes = collective_record.library_prefixes()
    return any((os.path.normpath(folder) + os.sep).startswith(p) for p in prefixes)


def test_sites_folders_are_library_folders(monkeypatch):
    monkeypatch.setattr(site, "getsitepackages", lambda: ["/opt/sys/lib/site-packages"])
    monkeypatch.setattr(site, "getusersitepackages", lambda: "/home/u/.local/site-packages")
    assert _covered("/opt/sys/lib/site-packages/trainer_lib")
    assert _covered("/home/u/.local/site-packages")


def test_debian_dist_packages_on_the_path_is_a_library_folder(monkeypatch):
    monkeypatch.setattr(sys, "path", [*sys.path, "/usr/lib/python3/dist-packages"])
    assert _covered("/usr/lib/python3/dist-packages/transformers")


def test_a_site_without_its_functions_is_no_error(monkeypatch):
    monkeypatch.delattr(site, "getsitepackages")
    monkeypatch.delattr(site, "getusersitepackages")
    assert collective_record.library_prefixes()
