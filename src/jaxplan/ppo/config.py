"""PPO configuration: RLlib's PPO keys and defaults on top of the common ones, validated
(the common keys and the config machinery: `jaxplan.config`; tuned presets:
`ppo/presets.yaml`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
from flax import struct

from jaxplan.config import (  # noqa: F401 - re-exported: PPO's config module names them too
    EvaluationConfig,
    HParams,
    ModelConfig,
    MultiAgentConfig,
    Schedule,
    TrainerConfig,
    check_hparams,
    per_policy,
    preset_of,
    traced,
)
from jaxplan.ppo.presets import PRESETS


@dataclasses.dataclass(frozen=True)
class PPOConfig(TrainerConfig):
    """RLlib PPO's configuration keys with RLlib's defaults, on top of `TrainerConfig`'s
    common keys (the field `lambda_` is RLlib's key `lambda`)."""

    supports_recurrent = True

    train_batch_size: int = 4000
    sgd_minibatch_size: int = 128
    num_sgd_iter: int = 30
    shuffle_sequences: bool = True
    lr: float = traced(5e-5)
    lambda_: float = traced(1.0)
    kl_coeff: float = per_policy(0.2)
    kl_target: float = traced(0.01)
    clip_param: float = traced(0.3)
    vf_clip_param: float = traced(10.0)
    vf_loss_coeff: float = traced(1.0)
    entropy_coeff: float = traced(0.0)
    # RLlib's schedule (see `lr_schedule`): it overrides entropy_coeff
    entropy_coeff_schedule: Schedule | None = per_policy(None)
    # rollouts: "bulk_sync" (RLlib PPO) or "async" (staggered actor groups: PPO with lagged
    # actors; RLlib's APPO is `appo`; see ParallelRollouts), and V-trace correction of the
    # advantages for the lag (IMPALA's clipping)
    rollout_mode: str = "bulk_sync"
    num_async: int = 1
    vtrace: bool = per_policy(False)
    vtrace_clip_rho_threshold: float = per_policy(1.0)
    vtrace_clip_pg_rho_threshold: float = per_policy(1.0)
    vtrace_clip_c_threshold: float = per_policy(1.0)

    def validate(self) -> PPOConfig:
        """The common checks (`TrainerConfig.validate`), then PPO's keys."""
        super().validate()
        check = self.check
        check(self.num_sgd_iter >= 1, "num_sgd_iter", "must be >= 1")
        check(self.sgd_minibatch_size >= 0, "sgd_minibatch_size", "must be >= 0 (0 = whole batch)")
        check(
            self.sgd_minibatch_size <= self.train_batch_size,
            "sgd_minibatch_size",
            f"must be <= train_batch_size ({self.train_batch_size})",
        )
        check(0.0 <= self.lambda_ <= 1.0, "lambda", "must be in [0, 1]")
        check(self.kl_coeff >= 0, "kl_coeff", "must be >= 0 (0 disables the KL loss term)")
        check(self.kl_target > 0, "kl_target", "must be > 0")
        check(self.clip_param > 0, "clip_param", "must be > 0")
        check(self.vf_clip_param > 0, "vf_clip_param", "must be > 0")
        check(self.vf_loss_coeff >= 0, "vf_loss_coeff", "must be >= 0")
        check(self.entropy_coeff >= 0, "entropy_coeff", "must be >= 0")
        for key in (
            "vtrace_clip_rho_threshold",
            "vtrace_clip_pg_rho_threshold",
            "vtrace_clip_c_threshold",
        ):
            check(getattr(self, key) > 0, key, "must be > 0")
        return self


TRACED_FIELDS = PPOConfig.traced_fields()
"""`PPOConfig` fields that are traced hyper-parameters (`PPOHParams`'s fields)."""

PER_POLICY_KEYS = PPOConfig.per_policy_keys()
"""Config keys a policy in `multiagent.policies` may override (the traced ones included)."""


@struct.dataclass
class PPOHParams(HParams):
    """PPO hyper-parameters that live in `PlanState` as traced f32 scalars (vmap-able): the
    `PPOConfig` fields declared `traced` (checked at import; the order here is the checkpoint's
    leaf order)."""

    lr: jnp.ndarray
    gamma: jnp.ndarray
    lambda_: jnp.ndarray
    clip_param: jnp.ndarray
    vf_clip_param: jnp.ndarray
    vf_loss_coeff: jnp.ndarray
    entropy_coeff: jnp.ndarray
    kl_target: jnp.ndarray


check_hparams(PPOHParams, PPOConfig)


def preset_config(env: str, overrides: Mapping[str, Any] | None = None) -> PPOConfig:
    """RLlib defaults, then the tuned preset for `env` (if any, `PRESETS`), then `overrides`."""
    return preset_of(PPOConfig, PRESETS, env, overrides)
