"""Pytrees of host arrays as msgpack files, written atomically so an interrupted save never
leaves a half-written file in place of a good one (`jaxplan.results` keeps a run's whole state
this way)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
from flax import serialization


def save(path: str | os.PathLike, tree: Any) -> Path:
    """Writes `tree` (pytrees of arrays, flax structs, numbers, lists) to `path`: a temporary
    file in the same directory, fsynced, then renamed over `path`. Device arrays must be
    addressable from this process (replicated arrays are)."""
    path = Path(path)
    data = serialization.to_bytes(jax.device_get(tree))
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def restore(path: str | os.PathLike, target: Any) -> Any:
    """Reads a file written by `save` into the structure of `target` (e.g. a fresh
    `{"policies": state.policies, "counters": state.counters, "seeds": [...]}`)."""
    return serialization.from_bytes(target, Path(path).read_bytes())
