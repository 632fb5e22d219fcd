"""Flax models: an MLP actor (action-distribution inputs) and a separate MLP critic."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


def normc(std: float = 1.0):
    """RLlib's `normc_initializer`: a standard normal kernel `[in, out]` whose every column
    (one unit's incoming weights) is scaled to norm `std`. Cheap to compile (no QR)."""

    def init(key, shape, dtype=jnp.float32):
        w = jax.random.normal(key, shape, dtype)
        return w * (std / jnp.sqrt(jnp.sum(jnp.square(w), axis=0, keepdims=True)))

    return init


ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu, "elu": nn.elu, "swish": nn.swish, "linear": None}


class MLP(nn.Module):
    """`obs [..., *obs_shape] -> [..., num_outputs]`; observations are flattened first.

    Kernels use RLlib's normc init: std 1.0 for hidden layers, `output_gain` for the output
    layer (0.01 for policy logits and values, as RLlib's fcnet, so the initial policy is near
    uniform).
    """

    hiddens: Sequence[int]
    activation: str
    num_outputs: int
    output_gain: float
    obs_ndim: int

    @nn.compact
    def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:
        batch_shape = obs.shape[: obs.ndim - self.obs_ndim]
        x = obs.reshape(*batch_shape, -1).astype(jnp.float32)
        act = ACTIVATIONS[self.activation]
        for width in self.hiddens:
            x = nn.Dense(width, kernel_init=normc(1.0))(x)
            if act is not None:
                x = act(x)
        return nn.Dense(self.num_outputs, kernel_init=normc(self.output_gain))(x)


class ActorCritic(nn.Module):
    """`obs -> (action_dist_inputs [..., num_outputs], value [...])`.

    Separate actor and critic MLPs (RLlib's `vf_share_layers=False`), or one shared torso with a
    policy head and a value head.
    """

    hiddens: Sequence[int]
    activation: str
    num_outputs: int
    obs_ndim: int
    share_layers: bool = False

    def setup(self):
        if self.share_layers:
            self.torso = MLP(
                self.hiddens[:-1], self.activation, self.hiddens[-1], 1.0, self.obs_ndim
            )
            self.pi_head = nn.Dense(self.num_outputs, kernel_init=normc(0.01))
            self.v_head = nn.Dense(1, kernel_init=normc(0.01))
        else:
            self.actor = MLP(self.hiddens, self.activation, self.num_outputs, 0.01, self.obs_ndim)
            self.critic = MLP(self.hiddens, self.activation, 1, 0.01, self.obs_ndim)

    def _features(self, obs):
        x = self.torso(obs)
        act = ACTIVATIONS[self.activation]
        return act(x) if act is not None else x

    def policy(self, obs: jnp.ndarray) -> jnp.ndarray:
        if self.share_layers:
            return self.pi_head(self._features(obs))
        return self.actor(obs)

    def value(self, obs: jnp.ndarray) -> jnp.ndarray:
        if self.share_layers:
            return self.v_head(self._features(obs))[..., 0]
        return self.critic(obs)[..., 0]

    def __call__(self, obs: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
        if self.share_layers:
            x = self._features(obs)
            return self.pi_head(x), self.v_head(x)[..., 0]
        return self.actor(obs), self.critic(obs)[..., 0]
