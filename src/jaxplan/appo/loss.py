"""APPO's loss as a free function of arrays: RLlib's `appo_surrogate_loss` (PPO's clipped
surrogate on V-trace or GAE advantages, an unclipped value loss, entropy, optional KL)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxplan import devices
from jaxplan.ppo.loss import clipped_ratio_surrogate, explained_variance


def appo_loss(
    *,
    logp: jax.Array,
    behaviour_logp: jax.Array,
    target_logp: jax.Array | None,
    advantages: jax.Array,
    kl: jax.Array,
    entropy: jax.Array,
    values: jax.Array,
    value_targets: jax.Array,
    hparams,
    kl_coeff: jax.Array,
    use_kl_loss: bool,
    axis_name: str | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Total APPO loss over a batch (all inputs `[B]`) and RLlib's learner statistics.

    With V-trace (`target_logp` given: the target network's log-probs of the actions) the
    ratio is `r = clip(mu / pi_target, 0, 2) * pi / mu` (RLlib's `is_ratio * exp(logp -
    behaviour_logp)`, `mu` the acting policy); without (`target_logp=None`, GAE advantages)
    `r = pi / mu`. `policy_loss = -mean(min(A r, A clip(r, 1 - clip_param, 1 + clip_param)))`,
    `vf_loss = 0.5 mean((V - value_targets)^2)`, `total = policy_loss + vf_loss_coeff vf_loss
    - entropy_coeff mean(entropy) [+ kl_coeff mean(kl)]` (the KL term with `use_kl_loss`;
    `kl` is KL(target || current) with V-trace, KL(acting || current) without).

    Stats: RLlib's `cur_lr, policy_loss, entropy, vf_loss, vf_explained_var`, with V-trace
    `mean_IS, var_IS` (of the clipped `mu / pi_target`), with `use_kl_loss` `KL_Coeff`; and
    always `kl`, `total_loss`, `entropy_coeff`. `axis_name`: the batch is split across that
    device axis (the trainer averages the loss and stats; `vf_explained_var` and `var_IS`
    are computed over all shards here).
    """
    stats = {}
    ratio = jnp.exp(logp - behaviour_logp)
    if target_logp is not None:
        is_ratio = jnp.clip(jnp.exp(behaviour_logp - target_logp), 0.0, 2.0)
        ratio = is_ratio * ratio
        mean_is, mean_sq = devices.mean(
            jnp.stack([jnp.mean(is_ratio), jnp.mean(jnp.square(is_ratio))]), axis_name
        )
        stats["mean_IS"] = mean_is
        stats["var_IS"] = mean_sq - jnp.square(mean_is)
    surrogate = clipped_ratio_surrogate(ratio, advantages, hparams.clip_param)
    policy_loss = -jnp.mean(surrogate)
    vf_loss = 0.5 * jnp.mean(jnp.square(values - value_targets))
    mean_entropy = jnp.mean(entropy)
    mean_kl = jnp.mean(kl)
    total = policy_loss + hparams.vf_loss_coeff * vf_loss - hparams.entropy_coeff * mean_entropy
    if use_kl_loss:
        total = total + kl_coeff * mean_kl
        stats["KL_Coeff"] = kl_coeff
    stats.update(
        {
            "cur_lr": hparams.lr,
            "entropy_coeff": hparams.entropy_coeff,
            "policy_loss": policy_loss,
            "vf_loss": vf_loss,
            "entropy": mean_entropy,
            "kl": mean_kl,
            "total_loss": total,
            "vf_explained_var": explained_variance(value_targets, values, axis_name),
        }
    )
    return total, jax.tree.map(jax.lax.stop_gradient, stats)
