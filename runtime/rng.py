"""Seeding, and the RNG states a checkpoint carries in a form ``weights_only`` loading reads."""

from __future__ import annotations

import os
import random
from typing import Any

import torch

try:  # numpy is optional; scripts that seed it get it restored too
    import numpy as np
except ImportError:  # pragma: no cover - numpy ships with most torch installs
    np = None  # type: ignore[assignment]


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed Python, NumPy and torch (every device). ``device_specific`` adds the rank, so ranks
    draw different augmentations; ``deterministic`` asks torch for deterministic kernels."""
    if device_specific:
        seed += int(os.environ.get("RANK", "0"))
    random.seed(seed)
    if np is not None:
        np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def capture() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    states: dict[str, Any] = {
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
        "torch": torch.get_rng_state(),
    }
    if np is not None:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        states["numpy"] = {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore(states: dict[str, Any]) -> None:
    python = states["python"]
    random.setstate((python["version"], tuple(python["internal"]), python["gauss"]))
    torch.set_rng_state(states["torch"])
    numpy_state = states.get("numpy")
    if np is not None and numpy_state is not None:
        np.random.set_state(
            (
                numpy_state["kind"],
                numpy_state["keys"].numpy().astype(np.uint32),
                numpy_state["pos"],
                numpy_state["has_gauss"],
                numpy_state["cached_gaussian"],
            )
        )
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
