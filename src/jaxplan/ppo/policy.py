"""PPOPolicy: the actor-critic policy with PPO's loss (and V-trace advantages when async)."""

from __future__ import annotations

from typing import Any

import jax

from jaxplan import batch as sb
from jaxplan.actor_critic import ActorCriticPolicy
from jaxplan.envs import ActionSpace
from jaxplan.ppo.config import PPOConfig, PPOHParams
from jaxplan.ppo.loss import ppo_loss
from jaxplan.vtrace import vtrace


class PPOPolicy(ActorCriticPolicy):
    """Implements `jaxplan.policy.Policy` for PPO (static: shapes and fixed options only)."""

    hparams_class = PPOHParams

    def __init__(self, obs_shape: tuple[int, ...], action_space: ActionSpace, config: PPOConfig):
        super().__init__(obs_shape, action_space, config)
        self.use_kl_loss = config.kl_coeff > 0

    def postprocess_trajectory(self, params: Any, hparams: PPOHParams, traj: sb.SampleBatch):
        """Values of every observation and of every reached observation in one batched critic
        call, then truncation-correct GAE over the time axis; with `vtrace`, V-trace
        advantages and value targets instead, correcting for the params that acted (their
        log-probs are in the trajectory) not being `params` (async rollouts)."""
        if not self.config.vtrace:
            return super().postprocess_trajectory(params, hparams, traj)
        fragment = self.fragment_values(params, hparams, traj)
        inputs = self.net.policy(params, traj[sb.OBS])
        value_targets, advantages = vtrace(
            traj[sb.ACTION_LOGP],
            self.dist.log_prob(inputs, traj[sb.ACTIONS]),
            *fragment,
            clip_rho_threshold=self.config.vtrace_clip_rho_threshold,
            clip_c_threshold=self.config.vtrace_clip_c_threshold,
            clip_pg_rho_threshold=self.config.vtrace_clip_pg_rho_threshold,
        )
        return {
            **traj,
            sb.VF_PREDS: fragment[1],
            sb.ADVANTAGES: advantages,
            sb.VALUE_TARGETS: value_targets,
        }

    def loss(
        self,
        params: Any,
        hparams: PPOHParams,
        kl_coeff: jax.Array,
        batch: sb.SampleBatch,
        axis_name: str | None = None,
    ):
        inputs, values = self.net(params, batch[sb.OBS])
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
