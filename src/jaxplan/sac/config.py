"""SAC configuration: RLlib 1.x SAC's keys and defaults (`rllib/agents/sac/sac.py`'s
`DEFAULT_CONFIG`) on top of the common ones (`jaxplan.config`); tuned presets:
`sac/presets.yaml`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax.numpy as jnp
from flax import struct

from jaxplan.config import (
    HParams,
    ModelConfig,
    TrainerConfig,
    check_hparams,
    load_presets,
    per_policy,
    preset_of,
    traced,
)
from jaxplan.dqn.config import calculate_rr_weights, cycles_per_iteration
from jaxplan.models import ACTIVATIONS

PRESETS: dict[str, dict[str, Any]] = load_presets(Path(__file__).with_name("presets.yaml"))
"""Env id -> config overrides (RLlib-style dict) that `preset_config` applies."""

__all__ = [
    "PRESETS",
    "SACConfig",
    "SACHParams",
    "SACModelConfig",
    "SACOptimizationConfig",
    "calculate_rr_weights",
    "cycles_per_iteration",
    "preset_config",
]


@dataclasses.dataclass(frozen=True)
class SACModelConfig:
    """RLlib SAC's `Q_model` / `policy_model` block: an MLP of `fcnet_hiddens` layers
    (`fcnet_activation`), then `post_fcnet_hiddens` layers (`post_fcnet_activation`; None:
    linear), then the output layer. The Q networks take `concat(flat obs, action)`; the policy
    network outputs `concat(mean, log_std)`. Custom models are not supported (a clear error)."""

    fcnet_hiddens: tuple[int, ...] = (256, 256)
    fcnet_activation: str = "relu"
    post_fcnet_hiddens: tuple[int, ...] = ()
    post_fcnet_activation: str | None = None
    custom_model: Any = None
    custom_model_config: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class SACOptimizationConfig:
    """RLlib SAC's `optimization` block: one Adam (eps 1e-7, RLlib's) per part, each with its
    learning rate: the policy (`actor`), each Q network (`critic`) and `log_alpha`
    (`entropy`)."""

    actor_learning_rate: float = 3e-4
    critic_learning_rate: float = 3e-4
    entropy_learning_rate: float = 3e-4


@dataclasses.dataclass(frozen=True)
class SACConfig(TrainerConfig):
    """RLlib SAC's configuration keys with RLlib's defaults (continuous `Box` actions).

    The policy is a tanh-squashed Gaussian over the normalised action box `[-1, 1]^d`
    (`normalize_actions`, RLlib's default and the only setting here: rollouts map actions
    affinely onto the env's bounds); `twin_q` learns two Q networks and bootstraps from the
    smaller target value; `tau` is the Polyak rate of the soft target update, run when
    `target_network_update_freq` env steps were sampled since the last one (0, RLlib's
    default: after every train step); `initial_alpha` starts the entropy temperature, tuned
    towards `target_entropy` ("auto": `-action_dim`). `n_step` sums rewards as DQN does
    (never across an episode end or the fragment end; a truncated episode bootstraps from its
    final observation); `no_done_at_end` (RLlib's) also bootstraps terminal states.
    Iterations, replay and `training_intensity` are DQN's (`jaxplan.dqn.config`).
    SAC's learning rates are `optimization.*`: the common `lr` / `lr_schedule` are refused.
    """

    env: str = "Pendulum-v1"
    num_workers: int = 0
    rollout_fragment_length: int = 1
    train_batch_size: int = 256
    lr: float = 1e-4  # not used by SAC (static; refused when changed): see optimization
    gamma: float = traced(0.99)
    twin_q: bool = per_policy(True)
    Q_model: SACModelConfig = per_policy(SACModelConfig())  # noqa: N815 - RLlib's key
    policy_model: SACModelConfig = per_policy(SACModelConfig())
    clip_actions: bool = False  # RLlib's key; no effect: squashed actions are in bounds
    tau: float = traced(5e-3)
    initial_alpha: float = per_policy(1.0)
    target_entropy: Any = per_policy("auto")  # "auto" or a number
    n_step: int = 1
    no_done_at_end: bool = False
    timesteps_per_iteration: int = 100
    buffer_size: int = 1_000_000
    prioritized_replay: bool = False
    prioritized_replay_alpha: float = 0.6
    prioritized_replay_beta: float = 0.4
    final_prioritized_replay_beta: float = 0.4
    prioritized_replay_beta_annealing_timesteps: int = 20000
    prioritized_replay_eps: float = 1e-6
    training_intensity: float | None = None
    optimization: SACOptimizationConfig = per_policy(SACOptimizationConfig())
    grad_clip: float | None = per_policy(None)
    learning_starts: int = 1500
    target_network_update_freq: int = 0

    def validate(self) -> SACConfig:
        """The common checks (`TrainerConfig.validate`), then SAC's keys."""
        super().validate()
        check = self.check
        check(
            self.lr == TrainerConfig.lr,
            "lr",
            "SAC does not use lr; set optimization.actor_learning_rate, "
            "optimization.critic_learning_rate and optimization.entropy_learning_rate",
        )
        check(
            self.lr_schedule is None,
            "lr_schedule",
            "SAC has no lr schedule; its learning rates are optimization.*",
        )
        check(
            self.model == ModelConfig(),
            "model",
            "SAC builds its networks from Q_model and policy_model; leave model at its default",
        )
        check(
            self.normalize_actions,
            "normalize_actions",
            "SAC's squashed Gaussian acts in [-1, 1] mapped onto the env's bounds; use true",
        )
        for name in ("Q_model", "policy_model"):
            net = getattr(self, name)
            check(net.custom_model is None, f"{name}.custom_model", "custom models not supported")
            for key in ("fcnet_hiddens", "post_fcnet_hiddens"):
                check(
                    all(h >= 1 for h in getattr(net, key)),
                    f"{name}.{key}",
                    "layer widths must be >= 1",
                )
            check(
                net.fcnet_activation in ACTIVATIONS,
                f"{name}.fcnet_activation",
                f"must be one of {sorted(ACTIVATIONS)}",
            )
            check(
                net.post_fcnet_activation is None or net.post_fcnet_activation in ACTIVATIONS,
                f"{name}.post_fcnet_activation",
                f"must be None (linear) or one of {sorted(ACTIVATIONS)}",
            )
        for key in ("actor_learning_rate", "critic_learning_rate", "entropy_learning_rate"):
            check(getattr(self.optimization, key) > 0, f"optimization.{key}", "must be > 0")
        check(0.0 < self.tau <= 1.0, "tau", "must be in (0, 1]")
        check(self.initial_alpha > 0, "initial_alpha", "must be > 0 (log_alpha is learnt)")
        te = self.target_entropy
        check(
            te == "auto" or (isinstance(te, int | float) and not isinstance(te, bool)),
            "target_entropy",
            'must be "auto" (-action_dim) or a number',
        )
        check(self.n_step >= 1, "n_step", "must be >= 1")
        check(self.buffer_size >= 1, "buffer_size", "must be >= 1")
        check(
            self.buffer_size >= self.train_batch_size,
            "buffer_size",
            f"must be >= train_batch_size ({self.train_batch_size})",
        )
        check(self.learning_starts >= 0, "learning_starts", "must be >= 0")
        check(self.target_network_update_freq >= 0, "target_network_update_freq", "must be >= 0")
        check(self.timesteps_per_iteration >= 0, "timesteps_per_iteration", "must be >= 0")
        check(
            self.training_intensity is None or self.training_intensity > 0,
            "training_intensity",
            "must be None (one train batch per rollout round) or > 0",
        )
        check(self.prioritized_replay_alpha >= 0, "prioritized_replay_alpha", "must be >= 0")
        for key in ("prioritized_replay_beta", "final_prioritized_replay_beta"):
            check(0.0 <= getattr(self, key) <= 1.0, key, "must be in [0, 1]")
        check(
            self.prioritized_replay_beta_annealing_timesteps >= 0,
            "prioritized_replay_beta_annealing_timesteps",
            "must be >= 0",
        )
        check(self.prioritized_replay_eps > 0, "prioritized_replay_eps", "must be > 0")
        return self

    @property
    def round_env_steps(self) -> int:
        """Env steps of one rollout round: groups x envs x fragment length."""
        return max(self.num_workers, 1) * self.num_envs_per_worker * self.rollout_fragment_length


@struct.dataclass
class SACHParams(HParams):
    """SAC hyper-parameters that live in `PlanState` as traced f32 scalars (vmap-able): the
    `SACConfig` fields declared `traced` (checked at import)."""

    gamma: jnp.ndarray
    tau: jnp.ndarray


check_hparams(SACHParams, SACConfig)


def preset_config(env: str, overrides: Mapping[str, Any] | None = None) -> SACConfig:
    """RLlib's SAC defaults, then the tuned preset for `env` (if any), then `overrides`."""
    return preset_of(SACConfig, PRESETS, env, overrides)
