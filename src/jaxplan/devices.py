"""The data-parallel device mesh a plan runs on, and the collectives its stages use.

A plan on several devices runs its `step` inside `jax.shard_map` over a one-axis mesh named
`AXIS`: actor groups (and so rollouts and train-batch rows) are split across the axis, while
params, optimizer state, counters, the episode window and the key are replicated. Stages see
the axis through `MultiAgentBatch.shard_axis` / `WorkerSet.axis_name` and reduce over it with
the helpers below; without a mesh they are plain single-device code.

RLlib's `num_gpus` / jaxplan's `num_devices` is the number of devices in the mesh: `0` = no
mesh (one device, no `shard_map`), `N >= 1` = the first `N` devices of the default backend
(GPU, TPU or CPU), `-1` = all of them, across every process of a `jax.distributed` run.
RLlib's `_fake_gpus` takes the devices from the CPU backend instead (several CPU devices must
be set before JAX starts: `jaxplan.use_cpu_devices(N)` right after `import jax`, `jaxplan
train --cpu-devices N`, or `XLA_FLAGS=--xla_force_host_platform_device_count=N`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh

AXIS = "devices"
"""Name of the data-parallel mesh axis."""

_XLA_HINT = (
    "for N CPU devices: jaxplan train --cpu-devices N, jaxplan.use_cpu_devices(N) right after "
    "import jax, or XLA_FLAGS=--xla_force_host_platform_device_count=N before JAX starts"
)


def make_mesh(num_devices: int, *, fake_devices: bool = False) -> Mesh | None:
    """A one-axis mesh of `num_devices` devices (`-1` = all), or None for `0`.

    Raises `ValueError` naming what exists when more devices are asked for than there are, or
    when a multi-process run would leave some process without a device in the mesh."""
    if num_devices == 0:
        if jax.process_count() > 1:
            raise ValueError(
                f"num_devices=0 in a {jax.process_count()}-process run: the processes train one "
                "model on one mesh; use num_devices=-1 (all devices)"
            )
        return None
    if num_devices < -1:
        raise ValueError(f"num_devices must be -1 (all), 0 (no mesh) or >= 1, got {num_devices}")
    backend = "cpu" if fake_devices else None
    devices = jax.devices(backend)
    kind = f"{devices[0].platform} device(s)"
    n = len(devices) if num_devices == -1 else num_devices
    if n > len(devices):
        hint = _XLA_HINT if devices[0].platform == "cpu" else "use num_devices=-1 for all"
        raise ValueError(
            f"num_devices={num_devices} but only {len(devices)} {kind} exist "
            f"({jax.process_count()} process(es)); {hint}"
        )
    if jax.process_count() > 1 and n != len(devices):
        raise ValueError(
            f"num_devices={num_devices}: a {jax.process_count()}-process run uses every device "
            f"of every process; use num_devices=-1 or {len(devices)}"
        )
    return Mesh(np.asarray(devices[:n]), (AXIS,))


def axis_size(axis_name: str | None) -> int:
    """Static size of a mesh axis inside `shard_map` (1 for None)."""
    return 1 if axis_name is None else jax.lax.axis_size(axis_name)


def shard_index(axis_name: str | None) -> jax.Array:
    """This device's index along the axis (0 without one)."""
    return jnp.int32(0) if axis_name is None else jax.lax.axis_index(axis_name)


def local_slice(x: jax.Array, axis_name: str | None, axis: int = 0) -> jax.Array:
    """This device's contiguous `1/axis_size` share of `x` along `axis` (all of it without a
    mesh axis). `x` must be the same on every device (e.g. keys split from a shared key)."""
    n = axis_size(axis_name)
    if n == 1:
        return x
    size = x.shape[axis] // n
    return jax.lax.dynamic_slice_in_dim(x, shard_index(axis_name) * size, size, axis=axis)


def varying(x, axis_name: str | None):
    """`x` (replicated params) typed as varying over `axis_name` inside `shard_map`, so that a
    gradient with respect to it is this device's own gradient (identity without an axis).

    Inside `shard_map` JAX transposes the implicit broadcast of a replicated value into a
    `psum`: the gradient of a device's loss with respect to replicated params arrives already
    summed over the devices, and a `pmean` of it does not divide. Differentiating with respect
    to a varying copy gives each device its own gradient, which `mean` then averages."""
    if axis_name is None:
        return x
    return jax.tree.map(lambda v: jax.lax.pcast(v, (axis_name,), to="varying"), x)


def gather(x, axis_name: str | None, axis: int = 0):
    """Concatenates every device's `x` along `axis`, in device order; the result is the same
    on every device and typed as replicated for `shard_map`'s replication check."""
    if axis_name is None:
        return x
    try:  # an all-gather whose output shard_map knows is replicated
        from jax._src.lax.parallel import all_gather_invariant
    except ImportError:  # pragma: no cover - older/newer JAX: a psum of zero-padded shards
        return jax.tree.map(lambda v: _gather_by_psum(v, axis_name, axis), x)
    return all_gather_invariant(x, axis_name, axis=axis, tiled=True)


def gather_rows(x, axis_name: str | None, blocks: int = 1):
    """Every device's rows (the leading axis of every leaf of `x`), interleaved: each device's
    rows are `blocks` equal blocks of consecutive rows; the result is block 0 of every device in
    device order, then block 1, ... (`gather` along the rows for `blocks=1`). For rows laid out
    `[time, local groups, ...]` with the groups split across devices in order, that is the
    one-device order `[time, groups, ...]`. The same on every device; one all-gather."""
    if axis_name is None:
        return x

    def interleave(v):
        v = v.reshape(blocks, v.shape[0] // blocks, *v.shape[1:])
        return gather(v, axis_name, axis=1).reshape(-1, *v.shape[2:])

    return jax.tree.map(interleave, x)


def _gather_by_psum(x: jax.Array, axis_name: str, axis: int) -> jax.Array:
    n = axis_size(axis_name)
    parts = jnp.zeros((n, *x.shape), x.dtype).at[shard_index(axis_name)].set(x)
    full = jax.lax.psum(parts, axis_name)
    return jnp.concatenate(list(full), axis=axis)


def largest(x, axis_name: str | None):
    """Largest value across devices (identity without a mesh axis): for statistics, as it
    stops gradients (`pmax` has no derivative)."""
    return x if axis_name is None else jax.lax.pmax(jax.lax.stop_gradient(x), axis_name)


def mean(x, axis_name: str | None):
    """Mean across devices of every leaf of `x` (identity without a mesh axis), as one
    all-reduce of all leaves packed into a vector when they share a float dtype (one
    collective per minibatch instead of one per parameter array)."""
    if axis_name is None:
        return x
    leaves = jax.tree.leaves(x)
    dtypes = {leaf.dtype for leaf in leaves}
    if len(leaves) > 1 and len(dtypes) == 1 and jnp.issubdtype(dtypes.pop(), jnp.floating):
        flat, unravel = ravel_pytree(x)
        return unravel(jax.lax.pmean(flat, axis_name))
    return jax.lax.pmean(x, axis_name)
