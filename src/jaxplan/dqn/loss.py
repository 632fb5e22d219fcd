"""DQN's formulas as free functions of arrays (RLlib's `dqn_torch_policy.build_q_losses` and
`_adjust_nstep`), each testable alone against a float64 numpy reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def nstep_transitions(
    rewards: jax.Array,
    next_obs: jax.Array,
    terminateds: jax.Array,
    truncateds: jax.Array,
    gamma: jax.Array | float,
    n_step: int,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """n-step transitions of a time-major fragment (inputs `[T, *B]`, `next_obs [T, *B,
    *obs_shape]`): per step t, `(sum_{j<k} gamma^j r_{t+j}, next_obs_{t+k-1},
    terminated_{t+k-1}, k)` with `k` the steps summed: `n_step`, or fewer where an episode
    ends (terminated or truncated) at `t+k-1 < t+n_step-1` or the fragment ends.

    RLlib's `_adjust_nstep` sums within one episode's batch and discounts the bootstrap by
    `gamma ** n_step` even where fewer steps were summed; here `k` is returned, so the
    bootstrap is `gamma ** k` (exact at fragment ends). A truncated end keeps its final
    observation and `terminated=False`, so the target bootstraps from it."""
    length = rewards.shape[0]
    ended = terminateds | truncateds
    out_r, out_obs, out_term = rewards, next_obs, terminateds
    k = jnp.ones(rewards.shape, jnp.int32)
    alive = ~ended
    for j in range(1, n_step):
        if j >= length:
            break

        def shift(x, j=j):  # x[t + j], padded at the end (masked below)
            pad = jnp.zeros((j, *x.shape[1:]), x.dtype)
            return jnp.concatenate([x[j:], pad], axis=0)

        valid = alive & (jnp.arange(length) < length - j).reshape(-1, *[1] * (rewards.ndim - 1))
        out_r = out_r + jnp.where(valid, gamma**j * shift(rewards), 0.0)
        obs_valid = valid.reshape(*valid.shape, *[1] * (next_obs.ndim - valid.ndim))
        out_obs = jnp.where(obs_valid, shift(next_obs), out_obs)
        out_term = jnp.where(valid, shift(terminateds), out_term)
        k = jnp.where(valid, j + 1, k)
        alive = valid & ~shift(ended)
    return out_r, out_obs, out_term, k


def double_q_best(q_tp1_target: jax.Array, q_tp1_online: jax.Array | None) -> jax.Array:
    """`[B, A] -> [B]`: the target network's value of the next action, chosen by the online
    network (`double_q`: `q_tp1_online`) or by the target itself (None: `max`)."""
    chooser = q_tp1_target if q_tp1_online is None else q_tp1_online
    best = jnp.argmax(chooser, axis=-1)
    return jnp.take_along_axis(q_tp1_target, best[..., None], axis=-1)[..., 0]


def td_targets(
    rewards: jax.Array,
    terminateds: jax.Array,
    discount_steps: jax.Array,
    q_tp1_best: jax.Array,
    gamma: jax.Array | float,
) -> jax.Array:
    """`[B]`: `r + gamma ** k * (1 - terminated) * Q_target(s', a*)` (n-step `r`, `k`)."""
    discount = gamma ** discount_steps.astype(jnp.float32)
    return rewards + discount * (1.0 - terminateds.astype(jnp.float32)) * q_tp1_best


def huber_loss(x: jax.Array, delta: float = 1.0) -> jax.Array:
    """RLlib's `huber_loss`: `0.5 x^2` where `|x| < delta`, else `delta (|x| - 0.5 delta)`."""
    absx = jnp.abs(x)
    return jnp.where(absx < delta, 0.5 * jnp.square(x), delta * (absx - 0.5 * delta))


def mse_loss(x: jax.Array) -> jax.Array:
    """RLlib's `td_error_loss_fn="mse"`: `0.5 x^2`."""
    return 0.5 * jnp.square(x)


TD_ERROR_LOSSES = {"huber": huber_loss, "mse": mse_loss}
"""`td_error_loss_fn` -> elementwise loss of the TD error."""


def q_loss(
    q_t_selected: jax.Array,
    targets: jax.Array,
    importance_weights: jax.Array,
    td_error_loss_fn: str = "huber",
) -> tuple[jax.Array, jax.Array]:
    """`(mean(w * loss(td_error)), td_error)` with `td_error = Q(s, a) - stop_grad(target)`
    (all `[B]`) and `loss` Huber (delta 1) or `0.5 x^2` (`td_error_loss_fn`)."""
    td_error = q_t_selected - jax.lax.stop_gradient(targets)
    loss = TD_ERROR_LOSSES[td_error_loss_fn](td_error)
    return jnp.mean(importance_weights * loss), td_error
