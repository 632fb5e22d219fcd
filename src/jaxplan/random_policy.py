"""RandomPolicy: uniform random actions, no params (RLlib's `RandomPolicy`), for evaluating
envs and measuring acting throughput with the sample-only plan."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxplan import batch as sb
from jaxplan.envs import ActionSpace, Box, Discrete
from jaxplan.policy import PolicyState


class RandomPolicy:
    """Acts uniformly at random in `action_space`; implements the acting half of
    `jaxplan.policy.Policy` (it never trains: keep it out of `policies_to_train`).

    A `Box` action is drawn in [-1, 1] when `normalize_actions` (the rollouts map it onto the
    space's bounds), else in [low, high].
    """

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        action_space: ActionSpace,
        *,
        normalize_actions: bool = True,
    ):
        if not isinstance(action_space, Discrete | Box):
            raise TypeError(f"RandomPolicy supports Discrete and Box spaces, got {action_space}")
        self.obs_shape = tuple(obs_shape)
        self.action_space = action_space
        self.normalize_actions = normalize_actions

    def init(self, key: jax.Array, hparams: Any = None) -> PolicyState:
        del key
        return PolicyState(
            params={},
            opt_state=None,
            hparams=hparams,
            kl_coeff=jnp.zeros((), jnp.float32),
            version=jnp.zeros((), jnp.int32),
        )

    def compute_actions(self, params: Any, obs: jax.Array, key: jax.Array, *, explore=True):
        """Uniform random actions, `explore` or not (RLlib's RandomPolicy ignores it)."""
        batch = obs.shape[: obs.ndim - len(self.obs_shape)]
        space = self.action_space
        if isinstance(space, Discrete):
            actions = jax.random.randint(key, batch, 0, space.n)
            logp = jnp.full(batch, -jnp.log(space.n), jnp.float32)
        else:
            low = jnp.broadcast_to(jnp.asarray(space.low, jnp.float32), space.shape)
            high = jnp.broadcast_to(jnp.asarray(space.high, jnp.float32), space.shape)
            if self.normalize_actions:
                low, high = -jnp.ones_like(low), jnp.ones_like(high)
            actions = jax.random.uniform(key, (*batch, *low.shape), minval=low, maxval=high)
            logp = jnp.full(batch, -jnp.sum(jnp.log(high - low)), jnp.float32)
        return actions, {sb.ACTION_LOGP: logp}

    def postprocess_trajectory(self, params: Any, hparams: Any, traj: sb.SampleBatch):
        return dict(traj)

    def loss(self, *args, **kwargs):
        raise NotImplementedError("RandomPolicy does not train; leave it out of policies_to_train")

    def apply_gradients(self, state: PolicyState, grads: Any) -> PolicyState:
        raise NotImplementedError("RandomPolicy does not train; leave it out of policies_to_train")
