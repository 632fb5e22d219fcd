"""Multi-process (multi-host) runs: start-up through `jax.distributed`, and the checks and
rules that keep processes in step.

Every process runs the same program on its own devices; the plan's mesh spans the devices of
all processes (`num_devices=-1`). Randomness needs no per-process seed: each actor group draws
from the shared key folded with its *global* group index, so processes never share a stream
and a run does not depend on how its devices are spread over processes (2 processes x 2
devices compute what 1 process x 4 devices does). Only process 0 writes results and
checkpoints (`is_writer`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping

import jax
import numpy as np

ENV_VARS = {
    "coordinator_address": "JAX_COORDINATOR_ADDRESS",
    "num_processes": "JAX_NUM_PROCESSES",
    "process_id": "JAX_PROCESS_ID",
}


def resolve_settings(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict | None:
    """The `jax.distributed.initialize` arguments from explicit values, else the environment
    variables `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`; None when
    none of them is set (a single-process run). Raises `ValueError` naming what is missing or
    malformed."""
    environ = os.environ if environ is None else environ
    given = {
        "coordinator_address": coordinator_address,
        "num_processes": num_processes,
        "process_id": process_id,
    }
    for name, var in ENV_VARS.items():
        if given[name] is None and environ.get(var):
            given[name] = environ[var]
    if all(v is None for v in given.values()):
        return None
    missing = [
        f"{n} (--{n.replace('_', '-')} or {ENV_VARS[n]})" for n, v in given.items() if v is None
    ]
    if missing:
        raise ValueError(
            "a multi-process run needs all three settings; missing: " + ", ".join(missing)
        )
    address = str(given["coordinator_address"])
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"coordinator address {address!r}: expected HOST:PORT, e.g. 10.0.0.1:1234")
    try:
        n, i = int(given["num_processes"]), int(given["process_id"])
    except ValueError:
        raise ValueError(
            f"num_processes {given['num_processes']!r} and process_id {given['process_id']!r} "
            "must be integers"
        ) from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"process_id must be in [0, num_processes={n}), got {i}")
    return {"coordinator_address": address, "num_processes": n, "process_id": i}


def initialize(settings: dict | None) -> bool:
    """Starts `jax.distributed` (before any other JAX call) when `settings` is not None.
    Returns whether this is a multi-process run."""
    if settings is None:
        return False
    jax.distributed.initialize(**settings)
    return jax.process_count() > 1


def is_writer() -> bool:
    """Whether this process writes results and checkpoints (process 0)."""
    return jax.process_index() == 0


def _digest(x: np.ndarray) -> int:
    return int.from_bytes(
        hashlib.blake2b(np.ascontiguousarray(x).tobytes(), digest_size=4).digest()
    )


def check_replicated(tree, what: str = "params") -> None:
    """Raises `RuntimeError` unless every replica of every leaf of `tree` is bitwise identical,
    on each of this process's devices and (via an all-gather of digests) on every process.
    Host-side and cheap for policy-sized trees; call it between compiled chunks."""
    paths, leaves = zip(*jax.tree_util.tree_flatten_with_path(tree)[0], strict=True)
    local = []
    for path, leaf in zip(paths, leaves, strict=True):
        shards = getattr(leaf, "addressable_shards", None)
        values = [np.asarray(s.data) for s in shards] if shards else [np.asarray(leaf)]
        digests = {_digest(v) for v in values}
        if len(digests) > 1:
            raise RuntimeError(
                f"{what}{jax.tree_util.keystr(path)} differs between this process's devices "
                f"(process {jax.process_index()})"
            )
        local.append(digests.pop())
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    mine = np.asarray(local, np.uint32).view(np.int32)
    every = np.asarray(multihost_utils.process_allgather(mine))  # [processes, leaves]
    for j, path in enumerate(paths):
        if len(set(every[:, j].tolist())) > 1:
            raise RuntimeError(
                f"{what}{jax.tree_util.keystr(path)} differs between processes "
                f"(digests by process: {every[:, j].tolist()})"
            )
