"""SAC's formulas as free functions of arrays (RLlib's `sac_torch_policy.actor_critic_loss`
for continuous actions and its `TorchSquashedGaussian`), each testable alone against a
float64 numpy reference. n-step transitions and the Huber loss are DQN's
(`jaxplan.dqn.loss`)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxplan.dqn.loss import huber_loss

MIN_LOG_STD = -5.0
MAX_LOG_STD = 2.0
"""RLlib's `MIN_LOG_NN_OUTPUT` / `MAX_LOG_NN_OUTPUT`: the policy's log-std is clipped to them."""


def squashed_gaussian_sample(inputs: jax.Array, noise: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Reparameterised sample of a tanh-squashed diagonal Gaussian and its log-density.

    `inputs [..., 2d] = concat(mean, log_std)` (log_std clipped to `[MIN_LOG_STD,
    MAX_LOG_STD]`), `noise [..., d]` standard normal. Returns `(a = tanh(u) [..., d],
    log pi(a) [...])` with `u = mean + exp(log_std) * noise` and
    `log pi(a) = sum_i [log N(u_i; mean_i, std_i) - log(1 - tanh(u_i)^2)]`, the last term
    computed as `2 (log 2 - u - softplus(-2u))` (exact; RLlib adds 1e-6 inside the log and
    re-derives `u` from `a` by atanh, which is the same up to that epsilon)."""
    d = noise.shape[-1]
    mean, log_std = inputs[..., :d], jnp.clip(inputs[..., d:], MIN_LOG_STD, MAX_LOG_STD)
    u = mean + jnp.exp(log_std) * noise
    normal_logp = -0.5 * noise**2 - log_std - 0.5 * math.log(2 * math.pi)
    log_det = 2.0 * (math.log(2.0) - u - jax.nn.softplus(-2.0 * u))
    return jnp.tanh(u), jnp.sum(normal_logp - log_det, axis=-1)


def soft_td_targets(
    rewards: jax.Array,
    terminateds: jax.Array,
    discount_steps: jax.Array,
    q_tp1: jax.Array,
    logp_tp1: jax.Array,
    alpha: jax.Array | float,
    gamma: jax.Array | float,
) -> jax.Array:
    """`[B]`: `r + gamma ** k * (1 - terminated) * (Q_target(s', a') - alpha log pi(a'|s'))`,
    with `a' ~ pi(.|s')` (the online policy) and `Q_target` the smaller of the twin target
    networks' values (n-step `r`, `k` steps summed; RLlib: `gamma ** n_step`)."""
    discount = gamma ** discount_steps.astype(jnp.float32)
    soft_value = q_tp1 - alpha * logp_tp1
    return rewards + discount * (1.0 - terminateds.astype(jnp.float32)) * soft_value


def critic_loss(
    q_selected: jax.Array,
    twin_q_selected: jax.Array | None,
    targets: jax.Array,
    importance_weights: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """`(sum over the Q networks of mean(w * huber(Q_i(s, a) - stop_grad(target))), td_error)`
    (all `[B]`): each network's loss only reaches its own params, so the sum's gradient is
    each of RLlib's per-network losses' gradient. `td_error` is RLlib's per-row
    `|td|` (twin: the mean of both networks' `|td|`), for prioritized replay. Huber, as
    RLlib 1.x's torch policy (its first TF version used `0.5 * MSE`)."""
    targets = jax.lax.stop_gradient(targets)
    td = jnp.abs(q_selected - targets)
    loss = jnp.mean(importance_weights * huber_loss(td))
    if twin_q_selected is None:
        return loss, td
    twin_td = jnp.abs(twin_q_selected - targets)
    loss = loss + jnp.mean(importance_weights * huber_loss(twin_td))
    return loss, 0.5 * (td + twin_td)


def actor_loss(alpha: jax.Array, logp_t: jax.Array, q_t_policy: jax.Array) -> jax.Array:
    """`mean(stop_grad(alpha) * log pi(a|s) - Q(s, a))`, `a ~ pi(.|s)` reparameterised, `Q`
    the smaller twin value (its networks' params stopped by the caller), all `[B]`."""
    return jnp.mean(jax.lax.stop_gradient(alpha) * logp_t - q_t_policy)


def alpha_loss(log_alpha: jax.Array, logp_t: jax.Array, target_entropy: float) -> jax.Array:
    """`-mean(log_alpha * stop_grad(log pi(a|s) + target_entropy))` (RLlib: the loss is in
    `log_alpha`, not alpha): alpha grows while the policy's entropy is below the target."""
    return -jnp.mean(log_alpha * jax.lax.stop_gradient(logp_t + target_entropy))
