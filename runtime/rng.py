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


def capture_as_accelerate(step: int = 0) -> dict[str, Any]:
    """This process's RNG state in HF Accelerate's ``random_states_<rank>.pkl`` form, which
    either library's ``load_state`` reads."""
    states: dict[str, Any] = {
        "step": step,
        "random_state": random.getstate(),
        "torch_manual_seed": torch.get_rng_state(),
    }
    if np is not None:
        states["numpy_random_seed"] = np.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["torch_cuda_manual_seed"] = torch.cuda.get_rng_state_all()
    return states


def restore_any(states: dict[str, Any]) -> None:
    """A checkpoint's RNG state: HF Accelerate's form, or accelify 0.1's (`capture`'s)."""
    if "random_state" not in states:
        restore(states)
        return
    random.setstate(states["random_state"])
    torch.set_rng_state(states["torch_manual_seed"])
    if np is not None and "numpy_random_seed" in states:
        np.random.set_state(states["numpy_random_seed"])
    if "torch_cuda_manual_seed" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["torch_cuda_manual_seed"])


#: What NumPy's RNG state needs to come back through ``torch.load(weights_only=True)``: arrays
#: of numbers and their dtypes (the same list HF Accelerate allows), nothing that runs code.
NUMPY_STATE_GLOBALS: list[Any] = []
if np is not None:
    import codecs

    _core = getattr(np, "_core", None) or np.core
    NUMPY_STATE_GLOBALS = [_core.multiarray._reconstruct, np.ndarray, np.dtype, codecs.encode]
    if hasattr(np, "dtypes"):
        NUMPY_STATE_GLOBALS.append(np.dtypes.UInt32DType)


def restore(states: dict[str, Any], parts: set[str] | None = None) -> None:
    """Put back what `capture` took (only ``parts`` of it, when named)."""
    wanted = parts if parts is not None else {"python", "torch", "numpy", "cuda"}
    if "python" in wanted:
        python = states["python"]
        random.setstate((python["version"], tuple(python["internal"]), python["gauss"]))
    if "torch" in wanted:
        torch.set_rng_state(states["torch"])
    numpy_state = states.get("numpy")
    if "numpy" in wanted and np is not None and numpy_state is not None:
        np.random.set_state(
            (
                numpy_state["kind"],
                numpy_state["keys"].numpy().astype(np.uint32),
                numpy_state["pos"],
                numpy_state["has_gauss"],
                numpy_state["cached_gaussian"],
            )
        )
    if "cuda" in wanted and "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def synchronize_rng_states(rng_types: list[str] | None = None, generator: Any = None) -> None:
    """Every rank takes rank 0's random state (Python, NumPy, torch, and the current CUDA
    device; or only the named ``rng_types``, as in Hugging Face Accelerate). Values drawn after
    this are the same on every rank; on one process it changes nothing, so a script that never
    seeded itself draws exactly what it drew before."""
    import torch.distributed as dist

    from accelify.runtime import pending_work

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    wanted = set(rng_types or ("python", "numpy", "torch", "cuda"))
    states: list[dict[str, Any] | None] = [None]
    if dist.get_rank() == 0:
        states[0] = capture()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            states[0]["cuda_current"] = torch.cuda.get_rng_state()
    with pending_work.tracked(True):
        dist.broadcast_object_list(states, src=0)
    state = states[0]
    assert state is not None
    restore(state, wanted & {"python", "torch", "numpy"})
    if "cuda" in wanted and "cuda_current" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda_current"])  # this rank's device takes rank 0's
    if "generator" in wanted and generator is not None:
        shared = [generator.get_state() if dist.get_rank() == 0 else None]
        with pending_work.tracked(True):
            dist.broadcast_object_list(shared, src=0)
        generator.set_state(shared[0])
