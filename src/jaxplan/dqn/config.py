"""DQN configuration: RLlib 1.x DQN's keys and defaults (`rllib/agents/dqn/dqn.py`'s
`DEFAULT_CONFIG`) on top of the common ones (`jaxplan.config`); tuned presets:
`dqn/presets.yaml`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax.numpy as jnp
from flax import struct

from jaxplan.config import (
    EvaluationConfig,
    HParams,
    TrainerConfig,
    check_hparams,
    load_presets,
    per_policy,
    preset_of,
    traced,
)

PRESETS: dict[str, dict[str, Any]] = load_presets(Path(__file__).with_name("presets.yaml"))
"""Env id -> config overrides (RLlib-style dict) that `preset_config` applies."""

EXPLORATION_TYPES = ("EpsilonGreedy",)
TD_ERROR_LOSS_FNS = ("huber", "mse")


@dataclasses.dataclass(frozen=True)
class ExplorationConfig:
    """RLlib's `exploration_config` for DQN: `EpsilonGreedy`, epsilon linear in the env steps
    sampled from `initial_epsilon` to `final_epsilon` over `epsilon_timesteps`, then
    constant (RLlib's `PiecewiseSchedule` with `outside_value=final_epsilon`)."""

    type: str = "EpsilonGreedy"
    initial_epsilon: float = 1.0
    final_epsilon: float = 0.02
    epsilon_timesteps: int = 10000


@dataclasses.dataclass(frozen=True)
class DQNConfig(TrainerConfig):
    """RLlib DQN's configuration keys with RLlib's defaults.

    `hiddens` are the Q head's layers (relu) after the `model`'s fcnet torso; `dueling` splits
    the head into value and advantage streams (`Q = V + A - mean(A)`); `double_q` picks the
    target's next action with the online network; `n_step` sums rewards over up to `n_step`
    steps (never across an episode end or the fragment end; the bootstrap is discounted by
    `gamma ** steps summed`). One iteration samples at least `timesteps_per_iteration` env
    steps in round-robin cycles of rollouts and replayed train steps (`training_intensity`:
    RLlib's replayed / sampled steps ratio; None: one train batch per rollout round).
    `prioritized_replay` (RLlib's default is True; False here, see below) replays rows by
    priority `|td_error| + eps` to the power `prioritized_replay_alpha`, weighted by
    importance weights whose exponent goes from `prioritized_replay_beta` to
    `final_prioritized_replay_beta` over
    `prioritized_replay_beta_annealing_timesteps` env steps sampled (`LocalReplayBuffer`).
    It stays off by default: with the CartPole-v1 preset and RLlib's PER settings the
    100-iteration learning test peaks at ~225 (uniform: ~390, seed 0; with the older Huber
    preset ~130 against ~270, and PER with beta 0 ~250): the importance weights (<= 1) shrink
    the effective step size.
    `td_error_loss_fn` (RLlib 2.x's key): `"huber"` (RLlib's default, delta 1) or `"mse"`
    (`0.5 td_error^2`, rejax's, PureJaxRL's and CleanRL's). Huber bounds each row's gradient
    to 1; on CartPole its Q values diverge (rejax's DQN does the same with a Huber loss), so
    the CartPole preset uses `"mse"` (benchmarks/README.md, "DQN against rejax").
    Distributional (`num_atoms > 1`) and noisy nets are not supported.
    """

    num_workers: int = 0
    rollout_fragment_length: int = 4
    train_batch_size: int = 32
    lr: float = traced(5e-4)
    gamma: float = traced(0.99)
    grad_clip: float | None = per_policy(40.0)
    adam_epsilon: float = per_policy(1e-8)
    num_atoms: int = 1
    noisy: bool = False
    dueling: bool = per_policy(True)
    hiddens: tuple[int, ...] = per_policy((256,))
    double_q: bool = per_policy(True)
    n_step: int = 1
    exploration_config: ExplorationConfig = ExplorationConfig()
    evaluation_config: EvaluationConfig = EvaluationConfig(explore=False)
    timesteps_per_iteration: int = 1000
    target_network_update_freq: int = 500
    buffer_size: int = 50000
    prioritized_replay: bool = False  # RLlib: True; slower on the CartPole preset (see above)
    prioritized_replay_alpha: float = 0.6
    prioritized_replay_beta: float = 0.4
    final_prioritized_replay_beta: float = 0.4
    prioritized_replay_beta_annealing_timesteps: int = 20000
    prioritized_replay_eps: float = 1e-6
    training_intensity: float | None = None
    learning_starts: int = 1000
    td_error_loss_fn: str = per_policy("huber")

    def validate(self) -> DQNConfig:
        """The common checks (`TrainerConfig.validate`), then DQN's keys."""
        super().validate()
        check = self.check
        check(self.num_atoms == 1, "num_atoms", "distributional DQN is not supported; use 1")
        check(not self.noisy, "noisy", "noisy nets are not supported; use false")
        check(
            self.model.custom_model is None,
            "model.custom_model",
            "DQN builds its Q network from model.fcnet_hiddens / conv_filters and hiddens; "
            "custom models are not supported",
        )
        check(all(h >= 1 for h in self.hiddens), "hiddens", "layer widths must be >= 1")
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
        check(self.adam_epsilon > 0, "adam_epsilon", "must be > 0")
        check(
            self.td_error_loss_fn in TD_ERROR_LOSS_FNS,
            "td_error_loss_fn",
            f"must be one of {list(TD_ERROR_LOSS_FNS)}",
        )
        exploration = self.exploration_config
        check(
            exploration.type in EXPLORATION_TYPES,
            "exploration_config.type",
            f"must be one of {list(EXPLORATION_TYPES)}",
        )
        for key in ("initial_epsilon", "final_epsilon"):
            check(
                0.0 <= getattr(exploration, key) <= 1.0,
                f"exploration_config.{key}",
                "must be in [0, 1]",
            )
        check(
            exploration.epsilon_timesteps >= 0,
            "exploration_config.epsilon_timesteps",
            "must be >= 0",
        )
        check(
            0.0 <= self.prioritized_replay_alpha,
            "prioritized_replay_alpha",
            "must be >= 0",
        )
        check(
            0.0 <= self.prioritized_replay_beta <= 1.0,
            "prioritized_replay_beta",
            "must be in [0, 1]",
        )
        check(
            0.0 <= self.final_prioritized_replay_beta <= 1.0,
            "final_prioritized_replay_beta",
            "must be in [0, 1]",
        )
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
class DQNHParams(HParams):
    """DQN hyper-parameters that live in `PlanState` as traced f32 scalars (vmap-able): the
    `DQNConfig` fields declared `traced` (checked at import)."""

    lr: jnp.ndarray
    gamma: jnp.ndarray


check_hparams(DQNHParams, DQNConfig)


def calculate_rr_weights(config: DQNConfig) -> list[int]:
    """RLlib's round-robin weights `[rollout rounds, train steps]` per cycle for
    `training_intensity` (replayed / sampled env steps): `[1, 1]` without it; else the
    intensity over the native ratio `train_batch_size / round_env_steps`, rounded to an
    integer >= 1 on the side that repeats (RLlib 1.x's later `calculate_rr_weights`)."""
    if not config.training_intensity:
        return [1, 1]
    native_ratio = config.train_batch_size / config.round_env_steps
    weight = config.training_intensity / native_ratio
    if weight < 1:
        return [max(1, round(1 / weight)), 1]
    return [1, max(1, round(weight))]


def cycles_per_iteration(config: DQNConfig) -> int:
    """Round-robin cycles of one iteration: enough to sample `timesteps_per_iteration` env
    steps (at least one cycle)."""
    per_cycle = calculate_rr_weights(config)[0] * config.round_env_steps
    return max(1, -(-config.timesteps_per_iteration // per_cycle))


def preset_config(env: str, overrides: Mapping[str, Any] | None = None) -> DQNConfig:
    """RLlib's DQN defaults, then the tuned preset for `env` (if any), then `overrides`."""
    return preset_of(DQNConfig, PRESETS, env, overrides)
