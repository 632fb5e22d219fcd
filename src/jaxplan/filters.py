"""RLlib's observation filters and reward clipping as pure functions (`ray/rllib/utils/filter.py`,
the sampler's `clip_rewards`).

`MeanStd` holds running statistics of raw observations (RLlib's `RunningStat`: count, mean and
`M2`, the sum of squared deviations); calling it filters observations as RLlib's
`MeanStdFilter(demean=True, destd=True, clip=10.0)` does:
`clip((obs - mean) / (std + 1e-8), -10, 10)` with `std = sqrt(M2 / (count - 1))` (and
`|mean|` while `count <= 1`, RLlib's `RunningStat.var`). The statistics are updated by
`merge` with the moments of a batch (`moments`, all-reduced over a device axis), Chan et
al.'s parallel update (RLlib's `RunningStat.update`), so the result does not depend on how the
observations were split into batches or devices (up to float rounding).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

OBSERVATION_FILTERS = ("NoFilter", "MeanStdFilter")
"""RLlib's `observation_filter` values jaxplan implements."""

CLIP = 10.0
"""RLlib's `MeanStdFilter(clip=10.0)`: filtered observations lie in [-10, 10]."""

EPS = 1e-8
"""Added to the std before dividing (RLlib's `MeanStdFilter`)."""


@struct.dataclass
class MeanStd:
    """Running statistics of observations of shape `obs_shape` (float32): `count []`,
    `mean [*obs_shape]` and `m2 [*obs_shape]` (sum of squared deviations from the mean)."""

    count: jax.Array
    mean: jax.Array
    m2: jax.Array

    @classmethod
    def empty(cls, obs_shape: tuple[int, ...]) -> MeanStd:
        zeros = jnp.zeros(obs_shape, jnp.float32)
        return cls(count=jnp.zeros((), jnp.float32), mean=zeros, m2=zeros)

    @property
    def var(self) -> jax.Array:
        """RLlib's `RunningStat.var`: `M2 / (count - 1)` (sample variance), `mean**2` while
        `count <= 1`."""
        return jnp.where(
            self.count > 1, self.m2 / jnp.maximum(self.count - 1, 1.0), jnp.square(self.mean)
        )

    @property
    def std(self) -> jax.Array:
        return jnp.sqrt(self.var)

    def __call__(self, obs: jax.Array) -> jax.Array:
        """Filters `obs [*B, *obs_shape]` (frozen: no update) -> float32 `[*B, *obs_shape]`."""
        x = (jnp.asarray(obs, jnp.float32) - self.mean) / (self.std + EPS)
        return jnp.clip(x, -CLIP, CLIP)

    def merge(self, other: MeanStd) -> MeanStd:
        """The statistics of both sets of observations (Chan et al.'s parallel update)."""
        count = self.count + other.count
        safe = jnp.maximum(count, 1.0)  # both empty: stays empty
        delta = other.mean - self.mean
        return MeanStd(
            count=count,
            mean=self.mean + delta * (other.count / safe),
            m2=self.m2 + other.m2 + jnp.square(delta) * (self.count * other.count / safe),
        )


def moments(
    obs: jax.Array, weight: jax.Array, axis_name: str | None = None, *, batch_ndim: int
) -> MeanStd:
    """The statistics of the observations `obs [*B, *obs_shape]` (`batch_ndim = len(B)`)
    counted with `weight [*B]` (0 or 1), over every device of `axis_name` when given (two
    all-reduces: counts and sums, then squared deviations from the global mean)."""
    x = jnp.asarray(obs, jnp.float32)
    w = jnp.asarray(weight, jnp.float32)
    axes = tuple(range(batch_ndim))
    wx = w.reshape(w.shape + (1,) * (x.ndim - batch_ndim))
    count, total = jnp.sum(w), jnp.sum(wx * x, axes)
    if axis_name is not None:
        count, total = jax.lax.psum((count, total), axis_name)
    mean = total / jnp.maximum(count, 1.0)
    m2 = jnp.sum(wx * jnp.square(x - mean), axes)
    if axis_name is not None:
        m2 = jax.lax.psum(m2, axis_name)
    return MeanStd(count=count, mean=mean, m2=m2)


def check_observation_filter(value: object) -> str:
    """`value` if it is one of `OBSERVATION_FILTERS`, else `ValueError` listing them."""
    if not isinstance(value, str) or value not in OBSERVATION_FILTERS:
        raise ValueError(
            f"observation_filter = {value!r} is not supported; valid values: "
            f"{list(OBSERVATION_FILTERS)}"
        )
    return value


def check_clip_rewards(value: object) -> bool | float | None:
    """RLlib's `clip_rewards`: None or False (no clipping), True (the sign) or a number
    `c > 0` (clip to [-c, c]); anything else is a `ValueError`."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value > 0:
        return float(value)
    raise ValueError(
        f"clip_rewards = {value!r}: expected None or False (no clipping), True (the sign of "
        "each reward) or a number c > 0 (clip to [-c, c])"
    )


def clip_rewards(rewards: jax.Array, clip: bool | float | None) -> jax.Array:
    """RLlib's sampler: `sign(r)` for `clip=True`, `clip(r, -c, c)` for a number `c`,
    `rewards` unchanged for None/False (static)."""
    if clip is None or clip is False:
        return rewards
    if clip is True:
        return jnp.sign(rewards)
    return jnp.clip(rewards, -clip, clip)
