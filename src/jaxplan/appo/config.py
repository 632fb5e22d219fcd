"""APPO configuration: RLlib's APPO keys and defaults (its `DEFAULT_CONFIG`: IMPALA's with
APPO's additions and overrides) on top of IMPALA's (`jaxplan.impala.config`); tuned presets:
`appo/presets.yaml`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import jax.numpy as jnp
from flax import struct

from jaxplan.config import HParams, check_hparams, load_presets, per_policy, preset_of, traced
from jaxplan.impala.config import IMPALAConfig

PRESETS: dict[str, dict[str, Any]] = load_presets(Path(__file__).with_name("presets.yaml"))
"""Env id -> config overrides (RLlib-style dict) that `preset_config` applies."""


@dataclasses.dataclass(frozen=True)
class APPOConfig(IMPALAConfig):
    """RLlib APPO's configuration keys with RLlib's defaults, on top of IMPALA's (field
    `lambda_` is RLlib's key `lambda`).

    `vtrace=True` (default): V-trace advantages and value targets against the target
    network's policy, and the PPO surrogate of the current policy against the target's
    (`appo.loss`). `vtrace=False`: GAE advantages (`use_gae`; `use_critic=False` needs
    `use_gae=False` and uses discounted returns without a baseline) and the PPO surrogate
    against the acting policy. `use_kl_loss` adds `kl_coeff * KL`; the coefficient adapts
    to `kl_target` whenever the target network is updated (RLlib's `UpdateTargetAndKL`:
    after a learner step once more than `num_sgd_iter * minibatch_buffer_size` env steps
    were sampled since the last update)."""

    vtrace: bool = per_policy(True)
    use_critic: bool = True
    use_gae: bool = True
    lambda_: float = traced(1.0)
    clip_param: float = traced(0.4)
    use_kl_loss: bool = False
    kl_coeff: float = per_policy(1.0)
    kl_target: float = traced(0.01)
    replay_buffer_num_slots: int = 100

    requires_vtrace: ClassVar[bool] = False

    def validate(self) -> APPOConfig:
        """IMPALA's checks (`IMPALAConfig.validate`; V-trace optional), then APPO's keys."""
        super().validate()
        check = self.check
        check(self.clip_param > 0, "clip_param", "must be > 0")
        check(self.kl_coeff >= 0, "kl_coeff", "must be >= 0")
        check(self.kl_target > 0, "kl_target", "must be > 0")
        check(
            self.use_critic or not self.use_gae,
            "use_gae",
            "GAE needs a value function: set use_gae=False with use_critic=False",
        )
        return self

    @property
    def target_update_frequency(self) -> int:
        """RLlib 1.x's `num_sgd_iter * minibatch_buffer_size`, compared (strictly) with the
        env steps sampled since the last target update."""
        return self.num_sgd_iter * self.minibatch_buffer_size


@struct.dataclass
class APPOHParams(HParams):
    """APPO hyper-parameters that live in `PlanState` as traced f32 scalars (vmap-able): the
    `APPOConfig` fields declared `traced` (checked at import)."""

    lr: jnp.ndarray
    gamma: jnp.ndarray
    lambda_: jnp.ndarray
    clip_param: jnp.ndarray
    vf_loss_coeff: jnp.ndarray
    entropy_coeff: jnp.ndarray
    kl_target: jnp.ndarray


check_hparams(APPOHParams, APPOConfig)


def preset_config(env: str, overrides: Mapping[str, Any] | None = None) -> APPOConfig:
    """RLlib's APPO defaults, then the tuned preset for `env` (if any), then `overrides`."""
    return preset_of(APPOConfig, PRESETS, env, overrides)
