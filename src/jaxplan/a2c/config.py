"""A2C configuration: RLlib's A2C keys and defaults (A3C's `DEFAULT_CONFIG` with A2C's
overrides) on top of the common ones (`jaxplan.config`); tuned presets: `a2c/presets.yaml`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax.numpy as jnp
from flax import struct

from jaxplan.config import (
    HParams,
    Schedule,
    TrainerConfig,
    check_hparams,
    load_presets,
    per_policy,
    preset_of,
    traced,
)

PRESETS: dict[str, dict[str, Any]] = load_presets(Path(__file__).with_name("presets.yaml"))
"""Env id -> config overrides (RLlib-style dict) that `preset_config` applies."""


@dataclasses.dataclass(frozen=True)
class A2CConfig(TrainerConfig):
    """RLlib A2C's configuration keys with RLlib's defaults (field `lambda_` is RLlib's key
    `lambda`). `microbatch_size` (None: one step on the whole train batch) switches to RLlib's
    microbatch plan: gradients of `microbatch_size`-step batches summed over
    `ceil(train_batch_size / microbatch_size)` of them, then one step. `use_gae=False` is
    RLlib's discounted-return advantages (`lambda` 1)."""

    supports_recurrent = True  # TrainOneStep replays sequences (not the microbatch plan)

    rollout_fragment_length: int = 20
    train_batch_size: int = 500
    microbatch_size: int | None = None
    lr: float = traced(1e-4)
    lambda_: float = traced(1.0)
    use_gae: bool = True
    grad_clip: float | None = per_policy(40.0)
    vf_loss_coeff: float = traced(0.5)
    entropy_coeff: float = traced(0.01)
    # RLlib's schedule (see `lr_schedule`): it overrides entropy_coeff
    entropy_coeff_schedule: Schedule | None = per_policy(None)

    def validate(self) -> A2CConfig:
        """The common checks (`TrainerConfig.validate`), then A2C's keys."""
        super().validate()
        check = self.check
        check(
            self.microbatch_size is None or 1 <= self.microbatch_size <= self.train_batch_size,
            "microbatch_size",
            f"must be None (no microbatches) or in [1, train_batch_size ({self.train_batch_size})]",
        )
        check(
            self.microbatch_size is None or not self.model.use_lstm,
            "microbatch_size",
            "the microbatch plan computes gradients on rows, not the sequences a recurrent "
            "policy (model.use_lstm) needs; leave microbatch_size unset",
        )
        check(0.0 <= self.lambda_ <= 1.0, "lambda", "must be in [0, 1]")
        check(self.vf_loss_coeff >= 0, "vf_loss_coeff", "must be >= 0")
        check(self.entropy_coeff >= 0, "entropy_coeff", "must be >= 0")
        return self

    @property
    def num_microbatches(self) -> int:
        """RLlib's `ceil(train_batch_size / microbatch_size)` (1 without microbatches)."""
        if not self.microbatch_size:
            return 1
        return -(-self.train_batch_size // self.microbatch_size)


@struct.dataclass
class A2CHParams(HParams):
    """A2C hyper-parameters that live in `PlanState` as traced f32 scalars (vmap-able): the
    `A2CConfig` fields declared `traced` (checked at import)."""

    lr: jnp.ndarray
    gamma: jnp.ndarray
    lambda_: jnp.ndarray
    vf_loss_coeff: jnp.ndarray
    entropy_coeff: jnp.ndarray


check_hparams(A2CHParams, A2CConfig)


def preset_config(env: str, overrides: Mapping[str, Any] | None = None) -> A2CConfig:
    """RLlib's A2C defaults, then the tuned preset for `env` (if any), then `overrides`."""
    return preset_of(A2CConfig, PRESETS, env, overrides)
