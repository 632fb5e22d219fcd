"""Generalized Advantage Estimation (Schulman et al. 2016) with correct truncation handling."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def compute_gae(
    rewards: jax.Array,
    values: jax.Array,
    next_values: jax.Array,
    terminateds: jax.Array,
    truncateds: jax.Array,
    gamma: float | jax.Array,
    lambda_: float | jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Advantages and value targets of a time-major fragment.

    Args:
      rewards, values: `[T, *B]`; `values[t] = V(s_t)` under the acting params.
      next_values: `[T, *B]`, `V` of the observation step t actually reached (for a truncated
        step: of the final observation before the reset; for the last step of a fragment: of
        the next observation, the fragment-cut bootstrap).
      terminateds, truncateds: `[T, *B]` bool. Only `terminated` zeroes the bootstrap; both end
        the episode, so the advantage recursion restarts after either.
      gamma, lambda_: discount and GAE lambda (scalars, may be traced).

    Returns:
      `(advantages, value_targets)`, both `[T, *B]`, with
      `delta_t = r_t + gamma V(s'_t) (1 - terminated_t) - V(s_t)`,
      `A_t = delta_t + gamma lambda (1 - done_t) A_{t+1}` and `value_targets = A + values`.
    """
    not_terminated = 1.0 - terminateds.astype(values.dtype)
    not_done = 1.0 - jnp.logical_or(terminateds, truncateds).astype(values.dtype)
    deltas = rewards + gamma * next_values * not_terminated - values
    decay = gamma * lambda_ * not_done

    def backward(next_adv, inputs):
        delta, d = inputs
        adv = delta + d * next_adv
        return adv, adv

    _, advantages = jax.lax.scan(backward, jnp.zeros_like(values[0]), (deltas, decay), reverse=True)
    return advantages, advantages + values
