"""ActorCriticPolicy: what the actor-critic algorithms (PPO, A2C/A3C, IMPALA) share: the
model (actor and critic), the action distribution, truncation-correct GAE (or V-trace)
postprocessing and an Adam step at the traced learning rate. An algorithm subclasses it with
its `HParams` and its loss."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxplan import batch as sb
from jaxplan.config import HParams, TrainerConfig
from jaxplan.distributions import distribution_for
from jaxplan.envs import ActionSpace
from jaxplan.gae import compute_gae
from jaxplan.models import RecurrentNet, build_model
from jaxplan.policy import PolicyState
from jaxplan.recurrent import replay_fragment, replay_sequences
from jaxplan.vtrace import vtrace


def scale_by_optimizer(config: TrainerConfig) -> optax.GradientTransformation:
    """The optimizer without its learning rate: Adam (eps 1e-8), or with the config's
    `opt_type="rmsprop"` (IMPALA, APPO) RLlib's RMSProp as its torch policies build it
    (`torch.optim.RMSprop(lr, alpha=decay, eps=epsilon, momentum=momentum)`: the mean square
    starts at 0, `g / (sqrt(ms) + epsilon)`, then momentum if > 0)."""
    if getattr(config, "opt_type", "adam") != "rmsprop":
        return optax.scale_by_adam(eps=1e-8)
    rms = optax.scale_by_rms(decay=config.decay, eps=config.epsilon, eps_in_sqrt=False)
    if not config.momentum:
        return rms
    return optax.chain(rms, optax.trace(decay=config.momentum))


class ActorCriticPolicy:
    """Implements `jaxplan.policy.Policy` but `loss` (static: shapes and fixed options only).

    `hparams_class` is the algorithm's traced hyper-parameters (with at least `lr`, `gamma`
    and `lambda_`); `config.model` picks the network (`jaxplan.models.build_model`),
    `config.grad_clip` the global-norm clipping before Adam (eps 1e-8) or RMSProp
    (`scale_by_optimizer`)."""

    hparams_class: type[HParams]

    def __init__(
        self, obs_shape: tuple[int, ...], action_space: ActionSpace, config: TrainerConfig
    ):
        self.obs_shape = tuple(obs_shape)
        self.dist = distribution_for(action_space)
        self.config = config
        # the custom model or RLlib's default for the observation shape (jaxplan.models)
        self.net = build_model(self.obs_shape, self.dist.num_inputs, config.model, action_space)
        self.model = self.net.module
        # recurrent (`model.use_lstm`): the learner replays sequences of `max_seq_len` steps
        self.recurrent = isinstance(self.net, RecurrentNet)
        self.max_seq_len = config.model.max_seq_len if self.recurrent else None
        # Adam without its learning rate: the (traced) lr is applied in `apply_gradients`.
        # `optax.flatten` runs the optimizer on one vector of all params: the same update, but
        # one set of kernels instead of one per parameter array (less compile and run time).
        clip = optax.clip_by_global_norm(config.grad_clip) if config.grad_clip else optax.identity()
        self.tx = optax.flatten(optax.chain(clip, scale_by_optimizer(config)))

    @property
    def flat_params_sgd(self) -> bool:
        """Whether `sgd_epochs` may carry the params as one raveled vector
        (`jaxplan.stages.train_one_step.flat_params`): the optimizer state is that of the
        raveled vector either way (`optax.flatten`), and this class's `apply_gradients` does
        not look into the params; a subclass that overrides it (APPO: only the model trains,
        not the target) keeps the tree."""
        return type(self).apply_gradients is ActorCriticPolicy.apply_gradients

    def init(self, key: jax.Array, hparams: Any = None) -> PolicyState:
        """Fresh params and optimizer state. `hparams`: the config's traced hyper-parameters
        (None), an instance of `hparams_class`, or a mapping of some of its fields
        (`{"lr": 1e-3}`) to use instead; a bad field or value is a `ValueError` naming it."""
        hparams = self.hparams_class.from_config(self.config).merged(hparams)
        params = self.net.init(key)
        return PolicyState(
            params=params,
            opt_state=self.tx.init(params),
            hparams=hparams,
            kl_coeff=jnp.float32(getattr(self.config, "kl_coeff", 0.0)),
            version=jnp.zeros((), jnp.int32),
        )

    def value(self, params: Any, obs: jax.Array) -> jax.Array:
        """The critic's values: `obs [*B, *obs_shape] -> [*B]` (recurrent: from the initial
        state, as at an episode's first step)."""
        if self.recurrent:
            state = self.initial_state(obs.shape[: obs.ndim - len(self.obs_shape)])
            return self.net.step(params, obs, state)[1]
        return self.net.value(params, obs)

    def initial_state(self, batch_shape: tuple[int, ...]) -> dict[str, jax.Array]:
        """The recurrent state of `batch_shape` envs at an episode's start, as batch fields
        (`jaxplan.models.RecurrentNet.initial_state`); `{}` for a feed-forward policy."""
        return self.net.initial_state(tuple(batch_shape)) if self.recurrent else {}

    def compute_actions(
        self, params: Any, obs: jax.Array, key: jax.Array, *, explore=True, state=None
    ):
        """`obs [*B, *obs_shape] -> (actions, extras)`; a recurrent policy acts from `state`
        (`initial_state`'s fields, `[*B, ...]`: required, so that no caller acts statelessly
        by mistake) and adds the state after the step to the extras (`state_out_i`)."""
        carry = {}
        if self.recurrent:
            if state is None:
                raise ValueError(
                    "a recurrent policy (model.use_lstm) acts from its state: pass state= "
                    "(initial_state(batch_shape) at an episode's start)"
                )
            inputs, _, carry = self.net.step(params, obs, state)
        else:
            inputs = self.net.policy(params, obs)
        if explore:
            actions = self.dist.sample(key, inputs)
        else:
            actions = self.dist.deterministic_sample(inputs)
        extras = {
            sb.ACTION_LOGP: self.dist.log_prob(inputs, actions),
            sb.ACTION_DIST_INPUTS: inputs,
            **carry,
        }
        return actions, extras

    def forward(self, params: Any, batch: sb.SampleBatch) -> tuple:
        """The learner's pass over a minibatch: `(action_dist_inputs [N, D], values [N],
        rows)` where `rows` is the minibatch as `N` rows. Feed-forward: `batch` is rows. Recurrent:
        `batch` is sequences (`jaxplan.recurrent.to_sequences`: fields `[S, L, ...]`, the
        `state_in_i` `[S, ...]`), replayed from their stored start states with the state reset
        after every episode end inside a sequence; `N = S x L`, time-major within each sequence."""
        if not self.recurrent:
            inputs, values = self.net(params, batch[sb.OBS])
            return inputs, values, batch
        return replay_sequences(self.net, params, batch)

    def fragment_values(self, params: Any, hparams: Any, traj: sb.SampleBatch) -> tuple:
        """The inputs of `compute_gae` (and `vtrace`) for a time-major trajectory `[T, *B]`:
        `(rewards, vf_preds, next_values, terminateds, truncateds, gamma, lambda_)`, the
        values of every observation and every reached one from one batched critic call
        (recurrent: from the replay of the fragment, `jaxplan.recurrent.replay_fragment`)."""
        if self.recurrent:
            _, vf_preds, next_values = replay_fragment(self.net, params, traj, self.max_seq_len)
        else:
            obs_and_next = jnp.concatenate([traj[sb.OBS], traj[sb.NEXT_OBS]], axis=0)
            values = self.net.value(params, obs_and_next)
            vf_preds, next_values = jnp.split(values, 2, axis=0)
        return (
            traj[sb.REWARDS],
            vf_preds,
            next_values,
            traj[sb.TERMINATEDS],
            traj[sb.TRUNCATEDS],
            hparams.gamma,
            hparams.lambda_,
        )

    def vtrace_targets(self, target_params: Any, traj: sb.SampleBatch, fragment: tuple):
        """V-trace `(value_targets, advantages)` (`[T, *B]` each) of a fragment
        (`fragment_values`' tuple), with `target_params`' policy as the target policy and the
        acting policy's log-probs from `traj`; the config's clip thresholds."""
        if self.recurrent:
            inputs = replay_fragment(self.net, target_params, traj, self.max_seq_len)[0]
        else:
            inputs = self.net.policy(target_params, traj[sb.OBS])
        return vtrace(
            traj[sb.ACTION_LOGP],
            self.dist.log_prob(inputs, traj[sb.ACTIONS]),
            *fragment,
            clip_rho_threshold=self.config.vtrace_clip_rho_threshold,
            clip_c_threshold=self.config.vtrace_clip_c_threshold,
            clip_pg_rho_threshold=self.config.vtrace_clip_pg_rho_threshold,
        )

    def postprocess_trajectory(self, params: Any, hparams: Any, traj: sb.SampleBatch):
        """Adds `vf_preds`, and truncation-correct GAE `advantages` and `value_targets` over
        the time axis (`jaxplan.gae`); with the config's `vtrace` (PPO async, IMPALA), V-trace
        advantages and value targets instead (`jaxplan.vtrace`), correcting for the params
        that acted (their log-probs are in the trajectory) not being `params`."""
        fragment = self.fragment_values(params, hparams, traj)
        if getattr(self.config, "vtrace", False):
            value_targets, advantages = self.vtrace_targets(params, traj, fragment)
        else:
            advantages, value_targets = compute_gae(*fragment)
        return {
            **traj,
            sb.VF_PREDS: fragment[1],
            sb.ADVANTAGES: advantages,
            sb.VALUE_TARGETS: value_targets,
        }

    def apply_gradients(self, state: PolicyState, grads: Any) -> PolicyState:
        updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
        lr = state.hparams.lr
        params = jax.tree.map(lambda p, u: p - lr * u, state.params, updates)
        return state.replace(params=params, opt_state=opt_state)
