"""PPOPolicy: actor-critic model, action distribution, GAE postprocessing and the PPO loss."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxplan import batch as sb
from jaxplan.distributions import distribution_for
from jaxplan.envs import ActionSpace
from jaxplan.gae import compute_gae
from jaxplan.models import build_model
from jaxplan.policy import PolicyState
from jaxplan.ppo.config import PPOConfig, PPOHParams
from jaxplan.ppo.loss import ppo_loss
from jaxplan.vtrace import vtrace


class PPOPolicy:
    """Implements `jaxplan.policy.Policy` for PPO (static: shapes and fixed options only)."""

    def __init__(self, obs_shape: tuple[int, ...], action_space: ActionSpace, config: PPOConfig):
        self.obs_shape = tuple(obs_shape)
        self.dist = distribution_for(action_space)
        self.config = config
        # the custom model or RLlib's default for the observation shape (jaxplan.models)
        self.net = build_model(self.obs_shape, self.dist.num_inputs, config.model)
        self.model = self.net.module
        self.use_kl_loss = config.kl_coeff > 0
        # Adam without its learning rate: the (traced) lr is applied in `apply_gradients`.
        # `optax.flatten` runs the optimizer on one vector of all params: the same update, but
        # one set of kernels instead of one per parameter array (less compile and run time).
        clip = optax.clip_by_global_norm(config.grad_clip) if config.grad_clip else optax.identity()
        self.tx = optax.flatten(optax.chain(clip, optax.scale_by_adam(eps=1e-8)))

    def init(self, key: jax.Array, hparams: Any = None) -> PolicyState:
        """Fresh params and optimizer state. `hparams`: the config's traced hyper-parameters
        (None), a `PPOHParams`, or a mapping of some of its fields (`{"lr": 1e-3}`) to use
        instead; a bad field or value is a `ValueError` naming it."""
        hparams = PPOHParams.from_config(self.config).merged(hparams)
        params = self.net.init(key)
        return PolicyState(
            params=params,
            opt_state=self.tx.init(params),
            hparams=hparams,
            kl_coeff=jnp.float32(self.config.kl_coeff),
            version=jnp.zeros((), jnp.int32),
        )

    def value(self, params: Any, obs: jax.Array) -> jax.Array:
        """The critic's values: `obs [*B, *obs_shape] -> [*B]`."""
        return self.net.value(params, obs)

    def compute_actions(self, params: Any, obs: jax.Array, key: jax.Array, *, explore=True):
        inputs = self.net.policy(params, obs)
        if explore:
            actions = self.dist.sample(key, inputs)
        else:
            actions = self.dist.deterministic_sample(inputs)
        extras = {
            sb.ACTION_LOGP: self.dist.log_prob(inputs, actions),
            sb.ACTION_DIST_INPUTS: inputs,
        }
        return actions, extras

    def postprocess_trajectory(self, params: Any, hparams: PPOHParams, traj: sb.SampleBatch):
        """Values of every observation and of every reached observation in one batched critic
        call, then truncation-correct GAE over the time axis; with `vtrace`, V-trace
        advantages and value targets instead, correcting for the params that acted (their
        log-probs are in the trajectory) not being `params` (async rollouts)."""
        obs_and_next = jnp.concatenate([traj[sb.OBS], traj[sb.NEXT_OBS]], axis=0)
        values = self.net.value(params, obs_and_next)
        vf_preds, next_values = jnp.split(values, 2, axis=0)
        fragment = (
            traj[sb.REWARDS],
            vf_preds,
            next_values,
            traj[sb.TERMINATEDS],
            traj[sb.TRUNCATEDS],
            hparams.gamma,
            hparams.lambda_,
        )
        if self.config.vtrace:
            inputs = self.net.policy(params, traj[sb.OBS])
            value_targets, advantages = vtrace(
                traj[sb.ACTION_LOGP],
                self.dist.log_prob(inputs, traj[sb.ACTIONS]),
                *fragment,
                clip_rho_threshold=self.config.vtrace_clip_rho_threshold,
                clip_c_threshold=self.config.vtrace_clip_c_threshold,
                clip_pg_rho_threshold=self.config.vtrace_clip_pg_rho_threshold,
            )
        else:
            advantages, value_targets = compute_gae(*fragment)
        return {
            **traj,
            sb.VF_PREDS: vf_preds,
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

    def apply_gradients(self, state: PolicyState, grads: Any) -> PolicyState:
        updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
        lr = state.hparams.lr
        params = jax.tree.map(lambda p, u: p - lr * u, state.params, updates)
        return state.replace(params=params, opt_state=opt_state)
