"""APPOPolicy: the actor-critic policy with a target network and RLlib's APPO loss."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxplan import batch as sb
from jaxplan.actor_critic import ActorCriticPolicy
from jaxplan.appo.config import APPOConfig, APPOHParams
from jaxplan.appo.loss import appo_loss
from jaxplan.envs import ActionSpace
from jaxplan.gae import compute_gae
from jaxplan.policy import PolicyState

MODEL, TARGET = "model", "target"


class APPOPolicy(ActorCriticPolicy):
    """Implements `jaxplan.policy.Policy` for APPO.

    Params are `{"model": the actor-critic, "target": its target copy}` (RLlib's
    `TargetNetworkMixin`; the target starts equal to the model, RLlib's `initialize_target`);
    the optimizer updates `"model"` only and `update_target` copies it into `"target"`.
    Rollouts act with `acting_params` (`{"model"}` alone, so lagged snapshots carry no
    target). With `vtrace`, postprocessing computes V-trace against the target network's
    policy (RLlib's `target_policy_logits`) with the model's values, and the loss takes the
    target's log-probs and KL in the loss, as RLlib does."""

    hparams_class = APPOHParams

    def __init__(self, obs_shape: tuple[int, ...], action_space: ActionSpace, config: APPOConfig):
        super().__init__(obs_shape, action_space, config)
        self.vtrace = bool(config.vtrace)
        self.use_kl_loss = bool(config.use_kl_loss)

    # ---- params -------------------------------------------------------------------------
    def init(self, key: jax.Array, hparams: Any = None) -> PolicyState:
        state = super().init(key, hparams)
        model = state.params
        return state.replace(params={MODEL: model, TARGET: model})

    def update_target(self, state: PolicyState) -> PolicyState:
        """The target network set to the model (RLlib's `update_target`)."""
        return state.replace(params={**state.params, TARGET: state.params[MODEL]})

    def acting_params(self, state: PolicyState, timestep: jax.Array) -> Any:
        return {MODEL: state.params[MODEL]}

    def apply_gradients(self, state: PolicyState, grads: Any) -> PolicyState:
        """One Adam step on the model at the traced `lr` (the target stays)."""
        model = state.params[MODEL]
        updates, opt_state = self.tx.update(grads[MODEL], state.opt_state, model)
        lr = state.hparams.lr
        model = jax.tree.map(lambda p, u: p - lr * u, model, updates)
        return state.replace(params={**state.params, MODEL: model}, opt_state=opt_state)

    # ---- acting and values --------------------------------------------------------------
    def compute_actions(self, params: Any, obs: jax.Array, key: jax.Array, *, explore=True):
        return super().compute_actions(params[MODEL], obs, key, explore=explore)

    def value(self, params: Any, obs: jax.Array) -> jax.Array:
        return self.net.value(params[MODEL], obs)

    # ---- postprocessing -----------------------------------------------------------------
    def postprocess_trajectory(self, params: Any, hparams: APPOHParams, traj: sb.SampleBatch):
        """`vf_preds` (the model's values) and, with `vtrace`, V-trace `advantages` and
        `value_targets` with the target network as the target policy; without it GAE
        (`use_gae=False`: lambda 1, RLlib's discounted returns minus the value;
        `use_critic=False`: discounted returns, no baseline and no bootstrap)."""
        rewards, values, next_values, terminated, truncated, gamma, lambda_ = self.fragment_values(
            params[MODEL], hparams, traj
        )
        if not self.config.use_critic:
            values, next_values = jnp.zeros_like(values), jnp.zeros_like(next_values)
        if not self.config.use_gae:
            lambda_ = 1.0
        fragment = (rewards, values, next_values, terminated, truncated, gamma, lambda_)
        if self.vtrace:  # the target network is V-trace's target policy (RLlib's APPO)
            value_targets, advantages = self.vtrace_targets(params[TARGET], traj, fragment)
        else:
            advantages, value_targets = compute_gae(*fragment)
        return {
            **traj,
            sb.VF_PREDS: values,
            sb.ADVANTAGES: advantages,
            sb.VALUE_TARGETS: value_targets,
        }

    # ---- loss ---------------------------------------------------------------------------
    def loss(
        self,
        params: Any,
        hparams: APPOHParams,
        kl_coeff: jax.Array,
        batch: sb.SampleBatch,
        axis_name: str | None = None,
    ):
        inputs, values = self.net(params[MODEL], batch[sb.OBS])
        actions = batch[sb.ACTIONS]
        if self.vtrace:  # the target network's policy, gradient-stopped (RLlib's detach)
            reference = jax.lax.stop_gradient(self.net.policy(params[TARGET], batch[sb.OBS]))
            target_logp = self.dist.log_prob(reference, actions)
        else:
            reference, target_logp = batch[sb.ACTION_DIST_INPUTS], None
        total, stats = appo_loss(
            logp=self.dist.log_prob(inputs, actions),
            behaviour_logp=batch[sb.ACTION_LOGP],
            target_logp=target_logp,
            advantages=batch[sb.ADVANTAGES],
            kl=self.dist.kl(reference, inputs),
            entropy=self.dist.entropy(inputs),
            values=values,
            value_targets=batch[sb.VALUE_TARGETS],
            hparams=hparams,
            kl_coeff=kl_coeff,
            use_kl_loss=self.use_kl_loss,
            axis_name=axis_name,
        )
        stats["var_gnorm"] = optax.tree.norm(params[MODEL])
        return total, stats
