"""SACPolicy: RLlib's SAC for continuous actions: a tanh-squashed Gaussian policy, twin Q
networks with Polyak-averaged target networks, the learnt entropy temperature, and one Adam
per part."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxplan import batch as sb
from jaxplan import devices
from jaxplan.dqn.policy import N_STEPS, PRIO_WEIGHTS, nstep_postprocess
from jaxplan.envs import ActionSpace, Box
from jaxplan.models import ACTIVATIONS
from jaxplan.policy import PolicyState
from jaxplan.sac import loss as sac_loss
from jaxplan.sac.config import SACConfig, SACHParams, SACModelConfig
from jaxplan.stages import replay
from jaxplan.stages.train_one_step import PER_ROW

PARTS = ("policy", "q", "twin_q", "log_alpha")
"""The params each optimizer updates (`twin_q` only with `twin_q`)."""


class DenseStack(nn.Module):
    """`x [..., n_in] -> [..., num_outputs]`: Dense layers `(width, activation name or None)`,
    then a linear output layer (RLlib's fcnet with its `post_fcnet` layers)."""

    layers: Sequence[tuple[int, str | None]]
    num_outputs: int

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        for width, activation in self.layers:
            x = nn.Dense(width)(x)
            act = ACTIVATIONS[activation] if activation is not None else None
            x = x if act is None else act(x)
        return nn.Dense(self.num_outputs)(x)


def dense_stack(model: SACModelConfig, num_outputs: int) -> DenseStack:
    layers = [(w, model.fcnet_activation) for w in model.fcnet_hiddens]
    layers += [(w, model.post_fcnet_activation) for w in model.post_fcnet_hiddens]
    return DenseStack(tuple(layers), num_outputs)


class SACPolicy:
    """Implements `jaxplan.policy.Policy` for SAC (static: shapes and fixed options).

    Params are `{"policy", "q", ("twin_q",) "log_alpha", "target": {"q", ("twin_q")}}`; one
    Adam (eps 1e-7, global-norm `grad_clip` per part, as RLlib's per-optimizer clipping) per
    part in `PARTS` at its `optimization.*` learning rate, all from one loss whose terms reach
    only their own part (RLlib's separate actor, critic and alpha losses on the same batch).
    Actions live in `[-1, 1]^d` (the rollouts map them onto the env's bounds); the loss
    samples the policy with its own key (`loss_takes_key`)."""

    hparams_class = SACHParams
    loss_takes_key = True

    def __init__(self, obs_shape: tuple[int, ...], action_space: ActionSpace, config: SACConfig):
        if not isinstance(action_space, Box):
            raise ValueError(
                f"SAC needs a continuous (Box) action space, got {action_space!r}; discrete "
                "actions are not supported (use dqn, or ppo)"
            )
        if len(action_space.shape) != 1:
            raise ValueError(f"SAC needs 1-D Box actions, got shape {action_space.shape}")
        if len(obs_shape) == 3:
            raise ValueError(
                f"SAC takes vector observations; {list(obs_shape)} images need a conv torso, "
                "which SAC does not build"
            )
        self.obs_shape = tuple(obs_shape)
        self.action_dim = int(action_space.shape[0])
        self.config = config
        te = config.target_entropy
        self.target_entropy = -float(np.prod(action_space.shape)) if te == "auto" else float(te)
        self.actor = dense_stack(config.policy_model, 2 * self.action_dim)
        self.critic = dense_stack(config.Q_model, 1)
        self.parts = PARTS if config.twin_q else tuple(p for p in PARTS if p != "twin_q")
        lrs = config.optimization
        rates = {
            "policy": lrs.actor_learning_rate,
            "q": lrs.critic_learning_rate,
            "twin_q": lrs.critic_learning_rate,
            "log_alpha": lrs.entropy_learning_rate,
        }
        clip = optax.clip_by_global_norm(config.grad_clip) if config.grad_clip else optax.identity()
        self.tx = {
            part: optax.flatten(optax.chain(clip, optax.adam(rates[part], eps=1e-7)))
            for part in self.parts
        }

    # ---- params -------------------------------------------------------------------------
    def init(self, key: jax.Array, hparams: Any = None) -> PolicyState:
        hparams = SACHParams.from_config(self.config).merged(hparams)
        k_pi, k_q, k_twin = jax.random.split(key, 3)
        obs = jnp.zeros((1, int(np.prod(self.obs_shape))), jnp.float32)
        params = {
            "policy": self.actor.init(k_pi, obs),
            "q": self.critic.init(k_q, jnp.zeros((1, obs.shape[1] + self.action_dim))),
            "log_alpha": jnp.float32(np.log(self.config.initial_alpha)),
        }
        if self.config.twin_q:
            params["twin_q"] = self.critic.init(
                k_twin, jnp.zeros((1, obs.shape[1] + self.action_dim))
            )
        params["target"] = {p: params[p] for p in ("q", "twin_q") if p in params}  # hard copy
        return PolicyState(
            params=params,
            opt_state={p: self.tx[p].init(params[p]) for p in self.parts},
            hparams=hparams,
            kl_coeff=jnp.float32(0.0),
            version=jnp.zeros((), jnp.int32),
        )

    def _flat(self, obs: jax.Array) -> jax.Array:
        batch = obs.shape[: obs.ndim - len(self.obs_shape)]
        return obs.reshape(*batch, -1).astype(jnp.float32)

    def dist_inputs(self, params: Any, obs: jax.Array) -> jax.Array:
        """`obs [*B, *obs_shape] -> concat(mean, log_std) [*B, 2 action_dim]`."""
        return self.actor.apply(params["policy"], self._flat(obs))

    def q_values(self, q_params: Any, obs: jax.Array, actions: jax.Array) -> jax.Array:
        """One Q network's `Q(obs, actions)`: `[*B]`."""
        x = jnp.concatenate([self._flat(obs), actions.astype(jnp.float32)], axis=-1)
        return self.critic.apply(q_params, x)[..., 0]

    def min_q(self, nets: Any, obs: jax.Array, actions: jax.Array) -> jax.Array:
        """The smaller of the twin networks' values in `nets` (`{"q", ("twin_q")}`): `[*B]`."""
        q = self.q_values(nets["q"], obs, actions)
        if "twin_q" in nets:
            q = jnp.minimum(q, self.q_values(nets["twin_q"], obs, actions))
        return q

    def value(self, params: Any, obs: jax.Array) -> jax.Array:
        """The (twin-min) Q value of the deterministic action: `[*B]`."""
        actions, _ = self.compute_actions(params, obs, jax.random.PRNGKey(0), explore=False)
        return self.min_q(params, obs, actions)

    def update_target(self, state: PolicyState) -> PolicyState:
        """Polyak averaging of the target Q networks (RLlib's `update_target(tau)`):
        `target <- tau * online + (1 - tau) * target`, `tau` the traced hyper-parameter."""
        tau = state.hparams.tau
        params = state.params
        target = jax.tree.map(
            lambda online, old: tau * online + (1.0 - tau) * old,
            {p: params[p] for p in params["target"]},
            params["target"],
        )
        return state.replace(params={**params, "target": target})

    # ---- acting -------------------------------------------------------------------------
    def compute_actions(self, params: Any, obs: jax.Array, key: jax.Array, *, explore=True):
        """Normalised actions `[*B, action_dim]` in `[-1, 1]`: `tanh` of a Gaussian sample, or
        with `explore=False` of its mean (RLlib's deterministic squashed Gaussian)."""
        inputs = self.dist_inputs(params, obs)
        if not explore:
            return jnp.tanh(inputs[..., : self.action_dim]), {}
        noise = jax.random.normal(key, (*inputs.shape[:-1], self.action_dim))
        actions, _ = sac_loss.squashed_gaussian_sample(inputs, noise)
        return actions, {}

    # ---- learning -----------------------------------------------------------------------
    def postprocess_trajectory(self, params: Any, hparams: SACHParams, traj: sb.SampleBatch):
        """n-step transitions over the fragment's time axis (DQN's `nstep_transitions`:
        `rewards`, `new_obs`, `terminateds` become the n-step ones, `n_steps` their counts);
        with `no_done_at_end` no row is terminal (RLlib's: every end bootstraps)."""
        terminateds = traj[sb.TERMINATEDS]
        if self.config.no_done_at_end:
            terminateds = jnp.zeros_like(terminateds)
        return nstep_postprocess(traj, terminateds, hparams.gamma, self.config.n_step)

    def loss(
        self,
        params: Any,
        hparams: SACHParams,
        kl_coeff: jax.Array,
        batch: sb.SampleBatch,
        axis_name: str | None = None,
        *,
        key: jax.Array,
    ):
        """Actor + critic + alpha loss on a replayed batch (their sum: each term's gradient
        reaches only its own part) and RLlib's SAC learner statistics; with
        `prioritized_replay` also the per-row `td_error` (`train_one_step.PER_ROW`)."""
        obs, next_obs = batch[sb.OBS], batch[sb.NEXT_OBS]
        k_t, k_tp1 = jax.random.split(key)
        shape = (*batch[sb.REWARDS].shape, self.action_dim)
        log_alpha = params["log_alpha"]
        alpha = jnp.exp(log_alpha)
        a_t, logp_t = sac_loss.squashed_gaussian_sample(
            self.dist_inputs(params, obs), _rows_noise(k_t, shape, axis_name)
        )
        a_tp1, logp_tp1 = sac_loss.squashed_gaussian_sample(
            self.dist_inputs(params, next_obs), _rows_noise(k_tp1, shape, axis_name)
        )
        nets = {p: params[p] for p in params["target"]}
        frozen = jax.lax.stop_gradient(nets)
        q_tp1 = self.min_q(jax.lax.stop_gradient(params["target"]), next_obs, a_tp1)
        targets = sac_loss.soft_td_targets(
            batch[sb.REWARDS],
            batch[sb.TERMINATEDS],
            batch[N_STEPS],
            q_tp1,
            logp_tp1,
            alpha,
            hparams.gamma,
        )
        q_t = self.q_values(nets["q"], obs, batch[sb.ACTIONS])
        twin_q_t = (
            self.q_values(nets["twin_q"], obs, batch[sb.ACTIONS]) if "twin_q" in nets else None
        )
        weights = batch.get(PRIO_WEIGHTS, jnp.ones_like(q_t))
        critic, td_error = sac_loss.critic_loss(q_t, twin_q_t, targets, weights)
        actor = sac_loss.actor_loss(alpha, logp_t, self.min_q(frozen, obs, a_t))
        alpha_term = sac_loss.alpha_loss(log_alpha, logp_t, self.target_entropy)
        total = actor + critic + alpha_term
        stats = {
            "actor_loss": actor,
            "critic_loss": critic / len(nets),  # RLlib: the mean of the networks' losses
            "alpha_loss": alpha_term,
            "alpha_value": alpha,
            "log_alpha_value": log_alpha,
            "target_entropy": jnp.float32(self.target_entropy),
            "policy_t": jnp.mean(a_t),
            "mean_q": jnp.mean(q_t),
            # the whole minibatch's extremes on a mesh (the trainer averages the rest)
            "max_q": devices.largest(jnp.max(q_t), axis_name),
            "min_q": -devices.largest(-jnp.min(q_t), axis_name),
            "total_loss": total,
        }
        if self.config.prioritized_replay:  # per row, for UpdatePriorities (not averaged)
            stats[PER_ROW] = {replay.TD_ERROR: td_error}
        return total, jax.tree.map(jax.lax.stop_gradient, stats)

    def apply_gradients(self, state: PolicyState, grads: Any) -> PolicyState:
        """One Adam step per part (`PARTS`) with its own gradient; the targets stay."""
        params, opt_state = dict(state.params), dict(state.opt_state)
        for part in self.parts:
            updates, opt_state[part] = self.tx[part].update(
                grads[part], state.opt_state[part], params[part]
            )
            params[part] = optax.apply_updates(params[part], updates)
        return state.replace(params=params, opt_state=opt_state)


def _rows_noise(key: jax.Array, shape: tuple[int, ...], axis_name: str | None) -> jax.Array:
    """Standard normal noise `[rows, action_dim]` for this device's rows: on a mesh the whole
    minibatch's noise is drawn (the same key on every device) and sliced, so each row gets
    the noise it gets on one device."""
    n = devices.axis_size(axis_name)
    full = jax.random.normal(key, (shape[0] * n, *shape[1:]))
    return devices.local_slice(full, axis_name)
