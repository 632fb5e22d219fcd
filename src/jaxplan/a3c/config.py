"""A3C configuration: RLlib's A3C keys and defaults (A2C's, `jaxplan.a2c.config`, with
A3C's own: asynchronous gradients of 10-step fragments) and `timesteps_per_iteration`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxplan.a2c.config import A2CConfig
from jaxplan.config import load_presets, preset_of

PRESETS: dict[str, dict[str, Any]] = load_presets(Path(__file__).with_name("presets.yaml"))
"""Env id -> config overrides (RLlib-style dict) that `preset_config` applies."""


@dataclasses.dataclass(frozen=True)
class A3CConfig(A2CConfig):
    """RLlib A3C's keys and defaults: A2C's loss and keys (`microbatch_size` unused), 10-step
    fragments, and `timesteps_per_iteration` (RLlib's common key; 0: one gradient per
    iteration): one `plan.step` applies as many asynchronous gradients as it takes to sample
    at least that many env steps (RLlib's A3C iteration lasts `min_iter_time_s` instead, a
    wall-clock time, which a compiled step cannot have)."""

    supports_recurrent = False  # AsyncGradients differentiates rows

    rollout_fragment_length: int = 10
    num_async: int = 1
    timesteps_per_iteration: int = 0

    def validate(self) -> A3CConfig:
        super().validate()
        self.check(self.microbatch_size is None, "microbatch_size", "A3C has no microbatches")
        self.check(self.num_async >= 1, "num_async", "must be >= 1")
        self.check(self.timesteps_per_iteration >= 0, "timesteps_per_iteration", "must be >= 0")
        return self


def preset_config(env: str, overrides: Mapping[str, Any] | None = None) -> A3CConfig:
    """RLlib's A3C defaults, then the tuned preset for `env` (if any), then `overrides`."""
    return preset_of(A3CConfig, PRESETS, env, overrides)
