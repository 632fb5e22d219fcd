"""Several seeds in one program, split over devices: each device trains its share of the seeds.

`train_seeds` and a several-seed `Runner` (so `jaxplan train --num-seeds N`) `vmap` a plan over a
leading seed axis. Where the default backend has several devices (this process's), they split
that axis over a one-axis mesh named `SEED_AXIS` with `jax.shard_map`: each device runs the
vmapped program on its share of the seeds, with no communication (the seeds are independent).
A seed count the devices do not divide is padded with copies of the last seed (3 seeds on 2
devices: 2 each; `seed_mesh`, `padded_seeds`), which the callers drop: what comes back has
`num_seeds` rows. A plan on its own data-parallel mesh (`num_devices`) and a multi-process run
keep one device.

On the CPU, JAX has one device unless told otherwise, and XLA's runtime runs a small-matmul RL
program mostly on one core (1.05 cores busy for one seed, 1.55 for 8 vmapped seeds of the
peers' fixed work on 2 cores). `use_cpu_devices()` makes the CPU backend one device per core,
which must happen before JAX's backend starts: right after `import jax`, before any JAX
operation. `jaxplan train` does it for several seeds (`--cpu-devices`). Measured on 2 cores
(benchmarks/README.md, "Issue 14: several seeds split over the CPU's cores"): 8 seeds
1.91-2.04x the steps/s of one device, 3 seeds (padded to 4) 1.81-1.84x. One seed stays on
one device: data-parallel SGD over two CPU devices is slower at these sizes (0.65x: every
minibatch's all-reduce and the per-op overheads do not halve).

A seed's floats may differ in the last bits with its program's seed count per device (XLA
compiles a vmap over 4 seeds differently from one over 8), and RL amplifies such differences,
so runs with different device counts are not bitwise the same; the same command on the same
machine gives the same run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

SEED_AXIS = "seeds"
"""Name of the mesh axis the seeds are split over."""

_FORCE_FLAG = "xla_force_host_platform_device_count"


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask; `os.cpu_count()` elsewhere)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def use_cpu_devices(num_devices: int | None = None) -> bool:
    """Makes JAX's CPU backend `num_devices` devices (default `cpu_cores()`), for the seeds of
    `train_seeds` / `Runner` to split over. Call it right after `import jax`.

    Returns False and changes nothing where that is already decided: JAX's backends have
    started (any JAX operation starts them), or the CPU device count was set already
    (`jax_num_cpu_devices`, `JAX_NUM_CPU_DEVICES` or `XLA_FLAGS=--xla_force_host_platform_
    device_count=N`, which win). Raises `ValueError` for `num_devices < 1`."""
    n = cpu_cores() if num_devices is None else num_devices
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"num_devices must be an int >= 1 (or None: one per core), got {n!r}")
    if jax.config.jax_num_cpu_devices != -1 or _FORCE_FLAG in os.environ.get("XLA_FLAGS", ""):
        return False
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:  # the backend already started (JAX's own check)
        return False
    return True


def seed_mesh(num_seeds: int, plan_mesh: Mesh | None = None) -> Mesh | None:
    """The mesh `num_seeds` seeds split over: the first `d` devices of the default backend
    (this process's), `d` the fewest that give each device as few seeds as all of them would
    (`ceil(num_seeds / d)`), so 8 seeds on 2 devices: 2 (4 each), 3 seeds: 2 (2 each, one
    slot padded: `padded_seeds`), 6 seeds on 4 devices: 3 (2 each). None where that is one
    device, where the plan has its own data-parallel mesh `plan_mesh`, or in a multi-process
    run (its processes train one model together)."""
    if plan_mesh is not None or jax.process_count() > 1:
        return None
    devices = jax.local_devices()
    per_device = -(-num_seeds // min(num_seeds, len(devices)))
    d = -(-num_seeds // per_device)
    return None if d == 1 else Mesh(np.asarray(devices[:d]), (SEED_AXIS,))


def padded_seeds(num_seeds: int, mesh: Mesh | None) -> int:
    """The seed axis's length on `mesh`: `num_seeds` rounded up to a multiple of its size (the
    extra slots train copies of the last seed, dropped from what the callers return)."""
    d = 1 if mesh is None else mesh.size
    return -(-num_seeds // d) * d


def pad_seeds(x: Any, length: int) -> Any:
    """`x` (an array, or a pytree of them, with a leading seed axis) padded to `length` rows
    along it by repeating its last row (numpy stays numpy)."""

    def pad(a):
        extra = length - a.shape[0]
        if extra == 0:
            return a
        xp = np if isinstance(a, np.ndarray) else jax.numpy
        return xp.concatenate([a, xp.repeat(a[-1:], extra, axis=0)])

    return jax.tree.map(pad, x)


def spread_seeds(fn: Callable, mesh: Mesh | None, in_specs: Any = None) -> Callable:
    """`fn`, a function vmapped over a leading seed axis of its inputs and outputs, run with
    that axis split over `mesh` (`seed_mesh`): every output sharded along it. `in_specs`: one
    `PartitionSpec` per positional argument (pytrees of them allowed), default all split
    (`P(SEED_AXIS)`); `P()` for an argument shared by all seeds. `fn` itself for no mesh."""
    if mesh is None:
        return fn
    spec = P(SEED_AXIS)

    def spread(*args):
        specs = (spec,) * len(args) if in_specs is None else in_specs
        # check_vma=False: no collectives inside, and the plan's scans start carries from
        # constants (replicated) that the seeds' data turns per-device
        shard = jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=spec, check_vma=False)
        return shard(*args)

    return spread
