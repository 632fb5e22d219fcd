"""DQNPolicy: RLlib's DQN Q network (fcnet or vision torso, `hiddens` head, dueling streams),
epsilon-greedy acting, n-step postprocessing and the double-Q TD loss (Huber or MSE)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from jaxplan import batch as sb
from jaxplan import devices
from jaxplan.dqn import loss as dqn_loss
from jaxplan.dqn.config import DQNConfig, DQNHParams
from jaxplan.envs import ActionSpace, Discrete
from jaxplan.models import ACTIVATIONS, MLP, ConvFilter, conv_output_shape, get_filter_config
from jaxplan.policy import PolicyState
from jaxplan.stages import replay
from jaxplan.stages.apply_schedules import piecewise_linear
from jaxplan.stages.train_one_step import PER_ROW

N_STEPS = "n_steps"
"""int32 field: the steps an n-step transition sums (its bootstrap is `gamma ** n_steps`)."""

PRIO_WEIGHTS = replay.PRIO_WEIGHTS
"""Prioritized replay's importance weights of the replayed rows (RLlib's field)."""


class QNetwork(nn.Module):
    """`obs [..., *obs_shape] -> Q [..., num_actions]`: the `model` torso (RLlib's fcnet or
    vision net without its final linear layer: `fcnet_hiddens[-1]` activated features), then
    the `hiddens` head (relu) to the advantages; with `dueling` a value stream of the same
    layers and `Q = V + A - mean_a A` (RLlib's `DQNTorchModel`)."""

    torso_hiddens: Sequence[int]
    activation: str
    num_actions: int
    obs_ndim: int
    hiddens: Sequence[int]
    dueling: bool
    conv_filters: Sequence[ConvFilter] = ()
    conv_activation: str = "relu"

    @nn.compact
    def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:
        torso = MLP(
            self.torso_hiddens[:-1],
            self.activation,
            self.torso_hiddens[-1],
            self.obs_ndim,
            self.conv_filters,
            self.conv_activation,
            name="torso",
        )
        x = torso(obs)
        act = ACTIVATIONS[self.activation]
        x = x if act is None else act(x)
        advantages = MLP(self.hiddens, "relu", self.num_actions, 1, name="advantage")(x)
        if not self.dueling:
            return advantages
        value = MLP(self.hiddens, "relu", 1, 1, name="value")(x)
        return value + advantages - jnp.mean(advantages, axis=-1, keepdims=True)


def nstep_postprocess(
    traj: sb.SampleBatch, terminateds: jax.Array, gamma: jax.Array, n_step: int
) -> sb.SampleBatch:
    """A time-major fragment `[T, *B]` as n-step transitions (`dqn.loss.nstep_transitions`,
    with `terminateds` as the rows' terminal flags): `rewards`, `new_obs` and `terminateds`
    become the n-step ones, `n_steps` their step counts (DQN's and SAC's postprocessing)."""
    rewards, next_obs, terminateds, steps = dqn_loss.nstep_transitions(
        traj[sb.REWARDS], traj[sb.NEXT_OBS], terminateds, traj[sb.TRUNCATEDS], gamma, n_step
    )
    return {
        **traj,
        sb.REWARDS: rewards,
        sb.NEXT_OBS: next_obs,
        sb.TERMINATEDS: terminateds,
        N_STEPS: steps,
    }


class DQNPolicy:
    """Implements `jaxplan.policy.Policy` for DQN (static: shapes and fixed options).

    Params are `{"q": online network, "target": target network}`; the optimizer (Adam with
    `adam_epsilon`, global-norm `grad_clip`) updates `"q"` only, `update_target` copies it
    into `"target"`. `acting_params` adds the exploration's epsilon at the sampled timestep
    (`{"q", "epsilon"}`); `compute_actions` acts epsilon-greedily with it (with the final
    epsilon when the params have none, e.g. a trained policy asked to explore) or, with
    `explore=False`, greedily."""

    hparams_class = DQNHParams

    def __init__(self, obs_shape: tuple[int, ...], action_space: ActionSpace, config: DQNConfig):
        if not isinstance(action_space, Discrete):
            raise ValueError(f"DQN needs a discrete action space, got {action_space!r}")
        self.obs_shape = tuple(obs_shape)
        self.num_actions = action_space.n
        self.config = config
        model = config.model
        filters: tuple = ()
        if len(self.obs_shape) == 3:
            filters = (
                get_filter_config(self.obs_shape)
                if model.conv_filters is None
                else model.conv_filters
            )
            if filters:
                conv_output_shape(self.obs_shape, filters)
        self.model = QNetwork(
            torso_hiddens=tuple(model.fcnet_hiddens),
            activation=model.fcnet_activation,
            num_actions=self.num_actions,
            obs_ndim=len(self.obs_shape),
            hiddens=tuple(config.hiddens),
            dueling=config.dueling,
            conv_filters=tuple(filters),
            conv_activation=model.conv_activation,
        )
        exploration = config.exploration_config
        self.epsilon_points = (
            (0.0, exploration.initial_epsilon),
            (float(exploration.epsilon_timesteps), exploration.final_epsilon),
        )
        self.final_epsilon = exploration.final_epsilon
        clip = optax.clip_by_global_norm(config.grad_clip) if config.grad_clip else optax.identity()
        self.tx = optax.flatten(optax.chain(clip, optax.scale_by_adam(eps=config.adam_epsilon)))

    # ---- params -------------------------------------------------------------------------
    def init(self, key: jax.Array, hparams: Any = None) -> PolicyState:
        hparams = DQNHParams.from_config(self.config).merged(hparams)
        q = self.model.init(key, jnp.zeros((1, *self.obs_shape), jnp.float32))
        return PolicyState(
            params={"q": q, "target": q},
            opt_state=self.tx.init(q),
            hparams=hparams,
            kl_coeff=jnp.float32(0.0),
            version=jnp.zeros((), jnp.int32),
        )

    def q_values(self, params: Any, obs: jax.Array) -> jax.Array:
        """`obs [*B, *obs_shape] -> [*B, num_actions]` with network params `params`."""
        return self.model.apply(params, obs)

    def value(self, params: Any, obs: jax.Array) -> jax.Array:
        """`max_a Q(obs, a)` of the online network: `[*B]`."""
        return jnp.max(self.q_values(params["q"], obs), axis=-1)

    def update_target(self, state: PolicyState) -> PolicyState:
        """The target network set to the online one (RLlib's `update_target`, tau 1)."""
        return state.replace(params={**state.params, "target": state.params["q"]})

    # ---- acting -------------------------------------------------------------------------
    def epsilon(self, timestep: jax.Array) -> jax.Array:
        """RLlib's EpsilonGreedy epsilon after `timestep` sampled env steps."""
        return piecewise_linear(jnp.asarray(self.epsilon_points, jnp.float32), timestep)

    def acting_params(self, state: PolicyState, timestep: jax.Array) -> dict[str, Any]:
        return {"q": state.params["q"], "epsilon": self.epsilon(timestep)}

    def compute_actions(self, params: Any, obs: jax.Array, key: jax.Array, *, explore=True):
        q = self.q_values(params["q"], obs)
        actions = jnp.argmax(q, axis=-1).astype(jnp.int32)
        if explore:
            epsilon = params.get("epsilon", jnp.float32(self.final_epsilon))
            k_random, k_pick = jax.random.split(key)
            random = jax.random.randint(k_random, actions.shape, 0, self.num_actions, jnp.int32)
            explore_now = jax.random.uniform(k_pick, actions.shape) < epsilon
            actions = jnp.where(explore_now, random, actions)
        return actions, {}

    # ---- learning -----------------------------------------------------------------------
    def postprocess_trajectory(self, params: Any, hparams: DQNHParams, traj: sb.SampleBatch):
        """n-step transitions over the fragment's time axis (`nstep_postprocess`)."""
        return nstep_postprocess(traj, traj[sb.TERMINATEDS], hparams.gamma, self.config.n_step)

    def loss(
        self,
        params: Any,
        hparams: DQNHParams,
        kl_coeff: jax.Array,
        batch: sb.SampleBatch,
        axis_name: str | None = None,
    ):
        """Mean (importance-weighted) Huber or squared (`td_error_loss_fn`) TD error and
        RLlib's DQN learner statistics; with `prioritized_replay` also the per-row `td_error`
        (`train_one_step.PER_ROW`). `axis_name`: `batch` is this device's shard of the
        minibatch (data-parallel)."""
        q_t = self.q_values(params["q"], batch[sb.OBS])
        actions = batch[sb.ACTIONS].astype(jnp.int32)
        q_selected = jnp.take_along_axis(q_t, actions[..., None], axis=-1)[..., 0]
        q_tp1 = self.q_values(jax.lax.stop_gradient(params["target"]), batch[sb.NEXT_OBS])
        online = None
        if self.config.double_q:
            online = self.q_values(jax.lax.stop_gradient(params["q"]), batch[sb.NEXT_OBS])
        best = dqn_loss.double_q_best(q_tp1, online)
        targets = dqn_loss.td_targets(
            batch[sb.REWARDS], batch[sb.TERMINATEDS], batch[N_STEPS], best, hparams.gamma
        )
        weights = batch.get(PRIO_WEIGHTS, jnp.ones_like(q_selected))
        loss, td_error = dqn_loss.q_loss(q_selected, targets, weights, self.config.td_error_loss_fn)
        stats = {
            "cur_lr": hparams.lr,
            "total_loss": loss,
            "mean_q": jnp.mean(q_selected),
            # the whole minibatch's extremes on a mesh (the trainer averages the rest)
            "min_q": -devices.largest(-jnp.min(q_selected), axis_name),
            "max_q": devices.largest(jnp.max(q_selected), axis_name),
            "mean_td_error": jnp.mean(td_error),
        }
        if self.config.prioritized_replay:  # per row, for UpdatePriorities (not averaged)
            stats[PER_ROW] = {replay.TD_ERROR: td_error}
        return loss, jax.tree.map(jax.lax.stop_gradient, stats)

    def apply_gradients(self, state: PolicyState, grads: Any) -> PolicyState:
        """One Adam step on the online network at the traced `lr` (the target stays)."""
        q = state.params["q"]
        updates, opt_state = self.tx.update(grads["q"], state.opt_state, q)
        lr = state.hparams.lr
        q = jax.tree.map(lambda p, u: p - lr * u, q, updates)
        return state.replace(params={**state.params, "q": q}, opt_state=opt_state)
