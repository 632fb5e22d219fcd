"""Action distributions parameterised by the model's flat output ("action_dist_inputs").

Each distribution is a set of pure functions of `inputs [..., num_inputs]`; batch dimensions are
arbitrary. KL is `KL(old || new)`, as RLlib's PPO loss uses it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxplan.envs import ActionSpace, Box, Discrete


def flat_draw(draw: Callable[..., jax.Array], key: jax.Array, shape, dtype) -> jax.Array:
    """`draw(key, shape, dtype)` (an elementwise `jax.random` sampler: `normal`, `gumbel`,
    `uniform`) drawn as one flat vector and reshaped: the same numbers (threefry fills a shape
    in row-major order), but under `vmap` over keys (one per actor group) XLA's CPU compile of
    the random-number loop is ~2x faster over `[keys, n]` than over `[keys, *shape]`."""
    return draw(key, (math.prod(shape),), dtype).reshape(shape)


@dataclasses.dataclass(frozen=True)
class Categorical:
    """Softmax over `num_actions` logits; actions are int32 of shape `[...]`."""

    num_actions: int

    @property
    def num_inputs(self) -> int:
        return self.num_actions

    def sample(self, key: jax.Array, inputs: jax.Array) -> jax.Array:
        # `jax.random.categorical`'s own rule (argmax of logits plus Gumbel noise), the noise
        # drawn flat: the same numbers, a rank-1 draw for XLA (see `flat_draw`)
        noise = flat_draw(jax.random.gumbel, key, inputs.shape, inputs.dtype)
        return jnp.argmax(inputs + noise, axis=-1).astype(jnp.int32)

    def deterministic_sample(self, inputs: jax.Array) -> jax.Array:
        """The most likely action (argmax of the logits; RLlib's `deterministic_sample`)."""
        return jnp.argmax(inputs, axis=-1).astype(jnp.int32)

    def log_prob(self, inputs: jax.Array, actions: jax.Array) -> jax.Array:
        logp = jax.nn.log_softmax(inputs, axis=-1)
        return jnp.take_along_axis(logp, actions[..., None].astype(jnp.int32), axis=-1)[..., 0]

    def entropy(self, inputs: jax.Array) -> jax.Array:
        logp = jax.nn.log_softmax(inputs, axis=-1)
        return -jnp.sum(jnp.exp(logp) * logp, axis=-1)

    def kl(self, old_inputs: jax.Array, new_inputs: jax.Array) -> jax.Array:
        old_logp = jax.nn.log_softmax(old_inputs, axis=-1)
        new_logp = jax.nn.log_softmax(new_inputs, axis=-1)
        return jnp.sum(jnp.exp(old_logp) * (old_logp - new_logp), axis=-1)


@dataclasses.dataclass(frozen=True)
class DiagGaussian:
    """Independent normals; inputs are `concat(mean, log_std)`, actions `[..., action_dim]`."""

    action_dim: int

    @property
    def num_inputs(self) -> int:
        return 2 * self.action_dim

    def _split(self, inputs):
        return inputs[..., : self.action_dim], inputs[..., self.action_dim :]

    def sample(self, key: jax.Array, inputs: jax.Array) -> jax.Array:
        mean, log_std = self._split(inputs)
        return mean + jnp.exp(log_std) * flat_draw(jax.random.normal, key, mean.shape, mean.dtype)

    def deterministic_sample(self, inputs: jax.Array) -> jax.Array:
        """The mean action (RLlib's `deterministic_sample`)."""
        return self._split(inputs)[0]

    def log_prob(self, inputs: jax.Array, actions: jax.Array) -> jax.Array:
        mean, log_std = self._split(inputs)
        z = (actions - mean) * jnp.exp(-log_std)
        return jnp.sum(-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi), axis=-1)

    def entropy(self, inputs: jax.Array) -> jax.Array:
        _, log_std = self._split(inputs)
        return jnp.sum(log_std + 0.5 * math.log(2 * math.pi * math.e), axis=-1)

    def kl(self, old_inputs: jax.Array, new_inputs: jax.Array) -> jax.Array:
        old_mean, old_log_std = self._split(old_inputs)
        new_mean, new_log_std = self._split(new_inputs)
        ratio = (jnp.exp(2 * old_log_std) + (old_mean - new_mean) ** 2) / (
            2 * jnp.exp(2 * new_log_std)
        )
        return jnp.sum(new_log_std - old_log_std + ratio - 0.5, axis=-1)


Distribution = Categorical | DiagGaussian


def distribution_for(space: ActionSpace) -> Distribution:
    """Categorical for `Discrete`, diagonal Gaussian for a flat `Box`."""
    if isinstance(space, Discrete):
        return Categorical(space.n)
    if isinstance(space, Box):
        if len(space.shape) != 1:
            raise ValueError(f"Box action spaces must be 1-D, got shape {space.shape}")
        return DiagGaussian(space.shape[0])
    raise ValueError(f"No action distribution for space {space!r}")
