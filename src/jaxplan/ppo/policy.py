"""PPOPolicy: the actor-critic policy with PPO's loss."""

from __future__ import annotations

from typing import Any

import jax

from jaxplan import batch as sb
from jaxplan.actor_critic import ActorCriticPolicy
from jaxplan.envs import ActionSpace
from jaxplan.ppo.config import PPOConfig, PPOHParams
from jaxplan.ppo.loss import ppo_loss


class PPOPolicy(ActorCriticPolicy):
    """Implements `jaxplan.policy.Policy` for PPO (static: shapes and fixed options only)."""

    hparams_class = PPOHParams

    def __init__(self, obs_shape: tuple[int, ...], action_space: ActionSpace, config: PPOConfig):
        super().__init__(obs_shape, action_space, config)
        self.use_kl_loss = config.kl_coeff > 0

    def loss(
        self,
        params: Any,
        hparams: PPOHParams,
        kl_coeff: jax.Array,
        batch: sb.SampleBatch,
        axis_name: str | None = None,
    ):
        inputs, values, batch = self.forward(params, batch)
        return ppo_loss(
            logp=self.dist.log_prob(inputs, batch[sb.ACTIONS]),
            old_logp=batch[sb.ACTION_LOGP],
            advantages=batch[sb.ADVANTAGES],
            kl=self.dist.kl(batch[sb.ACTION_DIST_INPUTS], inputs),
            entropy=self.dist.entropy(inputs),
            values=values,
            vf_preds=batch[sb.VF_PREDS],
            value_targets=batch[sb.VALUE_TARGETS],
            hparams=hparams,
            kl_coeff=kl_coeff,
            use_kl_loss=self.use_kl_loss,
            axis_name=axis_name,
        )
