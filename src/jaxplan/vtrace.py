"""V-trace off-policy value targets and policy-gradient advantages (Espeholt et al. 2018).

With the trace-lambda of rlax and the same episode-end conventions as `jaxplan.gae`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def vtrace(
    behaviour_logp: jax.Array,
    target_logp: jax.Array,
    rewards: jax.Array,
    values: jax.Array,
    next_values: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    gamma: float | jax.Array,
    lambda_: float | jax.Array = 1.0,
    clip_rho_threshold: float | jax.Array = 1.0,
    clip_c_threshold: float | jax.Array = 1.0,
    clip_pg_rho_threshold: float | jax.Array = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """V-trace value targets and policy-gradient advantages of a time-major fragment.

    Args:
      behaviour_logp, target_logp: `[T, *B]`, log-probabilities of the taken actions under the
        acting (behaviour) policy `mu` and the target (learner) policy `pi`.
      rewards, values: `[T, *B]`; `values[t] = V(x_t)` under the learner's value function.
      next_values: `[T, *B]`, `V` of the observation step t actually reached (for a truncated
        step: of the final observation before the reset; for the last step of a fragment: of
        the next observation, the fragment-cut bootstrap).
      terminated, truncated: `[T, *B]` bool. Only `terminated` zeroes the bootstrap; both end
        the episode, so the trace is cut after either (and at the end of the fragment).
      gamma, lambda_: discount and trace lambda (scalars, may be traced).
      clip_rho_threshold, clip_c_threshold, clip_pg_rho_threshold: `rho-bar`, `c-bar` and the
        `rho-bar` of the policy-gradient advantage.

    Returns:
      `(vs, pg_advantages)`, both `[T, *B]` and gradient-stopped, with
      `rho_t = pi(a_t|x_t) / mu(a_t|x_t)`, `c_t = lambda min(c-bar, rho_t)`,
      `delta_t = min(rho-bar, rho_t) (r_t + gamma (1 - terminated_t) V(x'_t) - V(x_t))`,
      `vs_t - V(x_t) = delta_t + gamma (1 - done_t) c_t (vs_{t+1} - V(x_{t+1}))` (zero after the
      last step), and `pg_advantages_t = min(pg-rho-bar, rho_t) (r_t + gamma (1 - terminated_t)
      vs'_t - V(x_t))`, where `vs'_t = vs_{t+1}` inside an episode and `V(x'_t)` at an episode
      end or the fragment end.
    """
    dtype = values.dtype
    rhos = jnp.exp(target_logp - behaviour_logp).astype(dtype)
    clipped_rhos = jnp.minimum(clip_rho_threshold, rhos)
    cs = lambda_ * jnp.minimum(clip_c_threshold, rhos)
    pg_rhos = jnp.minimum(clip_pg_rho_threshold, rhos)

    discounts = gamma * (1.0 - terminated.astype(dtype))
    not_done = jnp.logical_not(jnp.logical_or(terminated, truncated))
    deltas = clipped_rhos * (rewards + discounts * next_values - values)
    decay = gamma * not_done.astype(dtype) * cs

    def backward(next_correction, inputs):
        delta, d = inputs
        correction = delta + d * next_correction
        return correction, correction

    _, corrections = jax.lax.scan(
        backward, jnp.zeros_like(values[0]), (deltas, decay), reverse=True
    )
    vs = values + corrections

    # vs_{t+1} inside an episode; the given next value at an episode end and at the fragment end.
    following_vs = jnp.concatenate([vs[1:], next_values[-1:]], axis=0)
    next_vs = jnp.where(not_done, following_vs, next_values)
    pg_advantages = pg_rhos * (rewards + discounts * next_vs - values)
    return jax.lax.stop_gradient(vs), jax.lax.stop_gradient(pg_advantages)
