"""A2C's (and A3C's) loss as a free function of arrays: RLlib's `actor_critic_loss`, which
sums over the batch's rows (it does not average them)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxplan import devices
from jaxplan.ppo.loss import explained_variance


def a2c_loss(
    *,
    logp: jax.Array,
    advantages: jax.Array,
    entropy: jax.Array,
    values: jax.Array,
    value_targets: jax.Array,
    hparams,
    axis_name: str | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Total A2C loss over a batch (all inputs `[B]`) and RLlib's learner statistics:

    `policy_loss = -sum(logp A)`, `vf_loss = 0.5 sum((V - R)^2)`, `policy_entropy =
    sum(entropy)`, `total = policy_loss + vf_loss_coeff vf_loss - entropy_coeff
    policy_entropy`.

    `axis_name`: the batch is split across that device axis and the trainer averages the
    gradients and statistics across it; the sums are scaled by the number of devices so that
    the average is the sum over the whole batch (the one-device loss).
    """
    scale = devices.axis_size(axis_name)
    policy_loss = -jnp.sum(logp * advantages) * scale
    vf_loss = 0.5 * jnp.sum(jnp.square(values - value_targets)) * scale
    policy_entropy = jnp.sum(entropy) * scale
    total = policy_loss + hparams.vf_loss_coeff * vf_loss - hparams.entropy_coeff * policy_entropy
    stats = {
        "cur_lr": hparams.lr,
        "entropy_coeff": hparams.entropy_coeff,
        "policy_entropy": policy_entropy,
        "policy_loss": policy_loss,
        "vf_loss": vf_loss,
        "total_loss": total,
        "vf_explained_var": explained_variance(value_targets, values, axis_name),
    }
    return total, jax.tree.map(jax.lax.stop_gradient, stats)
