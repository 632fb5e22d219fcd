"""PPOPolicy's optimizer: Adam (eps 1e-8) with a traced lr and optional global-norm clipping
equals optax's own `adam` / `chain(clip_by_global_norm, adam)` step for step."""

import jax
import numpy as np
import optax
import pytest

from jaxplan import PPOConfig
from jaxplan.envs import Discrete
from jaxplan.ppo.policy import PPOPolicy


@pytest.mark.parametrize("grad_clip", [None, 0.05])
def test_apply_gradients_matches_optax_adam(grad_clip):
    config = PPOConfig.from_dict(
        {"lr": 3e-3, "grad_clip": grad_clip, "model": {"fcnet_hiddens": [8]}}
    )
    policy = PPOPolicy((4,), Discrete(2), config)
    state = policy.init(jax.random.PRNGKey(0))
    reference = optax.adam(3e-3, eps=1e-8)
    if grad_clip:
        reference = optax.chain(optax.clip_by_global_norm(grad_clip), reference)
    ref_params, ref_state = state.params, reference.init(state.params)
    for i in range(3):
        grads = jax.tree.map(
            lambda p, i=i: jax.random.normal(jax.random.PRNGKey(i), p.shape), state.params
        )
        state = policy.apply_gradients(state, grads)
        updates, ref_state = reference.update(grads, ref_state, ref_params)
        ref_params = optax.apply_updates(ref_params, updates)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref_params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
