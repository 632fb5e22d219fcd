"""PPO's loss terms as free functions of arrays (RLlib's PPO loss, PPO2-style value clipping)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxplan import devices


def clipped_surrogate(
    logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, clip_param: jax.Array
) -> jax.Array:
    """`[B] -> [B]`: `min(A r, A clip(r, 1 - eps, 1 + eps))` with `r = exp(logp - old_logp)`."""
    return clipped_ratio_surrogate(jnp.exp(logp - old_logp), advantages, clip_param)


def clipped_ratio_surrogate(
    ratio: jax.Array, advantages: jax.Array, clip_param: jax.Array
) -> jax.Array:
    """`[B] -> [B]`: `min(A r, A clip(r, 1 - eps, 1 + eps))` for a given ratio `r`."""
    return jnp.minimum(
        advantages * ratio, advantages * jnp.clip(ratio, 1.0 - clip_param, 1.0 + clip_param)
    )


def clipped_value_loss(
    values: jax.Array, vf_preds: jax.Array, value_targets: jax.Array, vf_clip_param: jax.Array
) -> jax.Array:
    """`[B] -> [B]`: `max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)`."""
    clipped = vf_preds + jnp.clip(values - vf_preds, -vf_clip_param, vf_clip_param)
    return jnp.maximum(jnp.square(values - value_targets), jnp.square(clipped - value_targets))


def explained_variance(
    targets: jax.Array, predictions: jax.Array, axis_name: str | None = None
) -> jax.Array:
    """`max(-1, 1 - Var(y - pred) / Var(y))` (RLlib's `explained_variance`). With `axis_name`
    (inside `shard_map`, equal-sized shards) the variances are those of all shards together."""

    both = jnp.stack([targets - predictions, targets])  # one all-reduce per pass for both
    mean = devices.mean(jnp.mean(both, axis=1), axis_name)
    var_err, var_y = devices.mean(jnp.mean(jnp.square(both - mean[:, None]), axis=1), axis_name)
    return jnp.maximum(-1.0, 1.0 - var_err / var_y)


def ppo_loss(
    *,
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    kl: jax.Array,
    entropy: jax.Array,
    values: jax.Array,
    vf_preds: jax.Array,
    value_targets: jax.Array,
    hparams,
    kl_coeff: jax.Array,
    use_kl_loss: bool,
    axis_name: str | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Total PPO loss over a minibatch (all inputs `[B]`) and RLlib's learner statistics.

    `total = mean(-surr) + [kl_coeff mean(KL)] + vf_loss_coeff mean(vf) - entropy_coeff
    mean(entropy)`; the KL term is present only when `use_kl_loss` (configured kl_coeff > 0).
    `axis_name`: the minibatch is split across that device axis; the loss and the mean
    statistics are this shard's (the trainer averages them across devices), and
    `vf_explained_var` is computed from all shards at once (its variance is not a mean).
    """
    policy_loss = -jnp.mean(clipped_surrogate(logp, old_logp, advantages, hparams.clip_param))
    vf_loss = jnp.mean(clipped_value_loss(values, vf_preds, value_targets, hparams.vf_clip_param))
    mean_kl = jnp.mean(kl)
    mean_entropy = jnp.mean(entropy)
    total = policy_loss + hparams.vf_loss_coeff * vf_loss - hparams.entropy_coeff * mean_entropy
    if use_kl_loss:
        total = total + kl_coeff * mean_kl
    stats = {
        "cur_kl_coeff": kl_coeff,
        "cur_lr": hparams.lr,
        "total_loss": total,
        "policy_loss": policy_loss,
        "vf_loss": vf_loss,
        "vf_explained_var": explained_variance(value_targets, values, axis_name),
        "kl": mean_kl,
        "entropy": mean_entropy,
        "entropy_coeff": hparams.entropy_coeff,
    }
    return total, jax.tree.map(jax.lax.stop_gradient, stats)
