"""StandardizeFields: `(x - mean) / max(1e-4, std)` per policy over the whole train batch."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from jaxplan import devices
from jaxplan.batch import MultiAgentBatch


def standardize(x: jax.Array, axis_name: str | None = None) -> jax.Array:
    """`(x - mean(x)) / max(1e-4, std(x))` with the population std, over all elements.

    With `axis_name` (inside `shard_map`, `x` one equal-sized shard per device) the mean and
    std are those of all shards together (two all-reduced passes), not of this shard."""
    mean = devices.mean(jnp.mean(x), axis_name)
    std = jnp.sqrt(devices.mean(jnp.mean(jnp.square(x - mean)), axis_name))
    return (x - mean) / jnp.maximum(1e-4, std)


class StandardizeFields:
    """Standardizes `fields` of every policy batch once, before SGD (a function of the item).
    A batch split across devices is standardized with the statistics of the whole batch."""

    def __init__(self, fields: Sequence[str]):
        if isinstance(fields, str):
            raise TypeError("StandardizeFields takes a sequence of field names, not one string")
        self.fields = tuple(fields)

    def __call__(self, batch: MultiAgentBatch) -> MultiAgentBatch:
        out = {}
        for pid, pb in batch.policy_batches.items():
            missing = [f for f in self.fields if f not in pb]
            if missing:
                raise KeyError(
                    f"StandardizeFields: policy {pid!r} batch has no field(s) {missing}; "
                    f"fields present: {sorted(pb)}"
                )
            out[pid] = {**pb, **{f: standardize(pb[f], batch.shard_axis) for f in self.fields}}
        return batch.replace(policy_batches=out)
