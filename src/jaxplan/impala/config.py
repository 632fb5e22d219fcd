"""IMPALA configuration: RLlib's IMPALA keys and defaults on top of the common ones
(`jaxplan.config`); tuned presets: `impala/presets.yaml`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

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

OPTIMIZERS = ("adam", "rmsprop")


@dataclasses.dataclass(frozen=True)
class IMPALAConfig(TrainerConfig):
    """RLlib IMPALA's configuration keys with RLlib's defaults. Samples come from async actor
    groups (`max_sample_requests_in_flight_per_worker` is the async queue depth), V-trace
    corrects for their lag (`vtrace_clip_rho_threshold`, `vtrace_clip_pg_rho_threshold`;
    jaxplan adds `vtrace_clip_c_threshold` and the trace `lambda`, RLlib's are 1), and the
    learner takes `num_sgd_iter` steps on each whole train batch (V-trace is computed once,
    when each fragment is emitted, with the learner's params of that iteration: the params
    of the first step; RLlib recomputes it in the loss at every step).

    Train batches go through RLlib's learner queue (`learner_queue_size` train batches,
    `jaxplan.stages.learner_queue`) and, with `replay_proportion > 0`, MixInReplay
    (`replay_buffer_num_slots` train batches, `jaxplan.stages.mix_in_replay`); V-trace is
    then recomputed on the learner side. With `minibatch_buffer_size = B > 1` (and
    `num_sgd_iter = k > 1`) the learner takes its batches through RLlib's `MinibatchBuffer`:
    `B` batches in turn, each `k` times, one gradient step each (V-trace recomputed at every
    step, as RLlib's loss does); a training iteration still makes `k` learner steps.
    `broadcast_interval = n`: the actor groups get new weights as RLlib's
    `BroadcastUpdateLearnerWeights` sends them (a set of weights to about `n` returning
    groups; `info.num_weight_broadcasts`). `opt_type` is RLlib's: `"adam"` (default) or
    `"rmsprop"` with `decay`, `momentum` and `epsilon` (`jaxplan.actor_critic`)."""

    rollout_fragment_length: int = 50
    train_batch_size: int = 500
    lr: float = traced(5e-4)
    lambda_: float = traced(1.0)
    vtrace: bool = per_policy(True)
    vtrace_clip_rho_threshold: float = per_policy(1.0)
    vtrace_clip_pg_rho_threshold: float = per_policy(1.0)
    vtrace_clip_c_threshold: float = per_policy(1.0)
    grad_clip: float | None = per_policy(40.0)
    opt_type: str = "adam"
    decay: float = 0.99
    momentum: float = 0.0
    epsilon: float = 0.1
    vf_loss_coeff: float = traced(0.5)
    entropy_coeff: float = traced(0.01)
    entropy_coeff_schedule: Schedule | None = per_policy(None)
    num_sgd_iter: int = 1
    minibatch_buffer_size: int = 1
    replay_proportion: float = 0.0
    replay_buffer_num_slots: int = 0
    learner_queue_size: int = 16
    max_sample_requests_in_flight_per_worker: int = 2
    broadcast_interval: int = 1

    requires_vtrace: ClassVar[bool] = True
    """IMPALA refuses `vtrace=False`; APPO (a subclass) allows GAE advantages instead."""

    def validate(self) -> IMPALAConfig:
        """The common checks (`TrainerConfig.validate`), then IMPALA's keys."""
        super().validate()
        check = self.check
        if self.requires_vtrace:
            check(self.vtrace, "vtrace", "IMPALA needs V-trace (without it, use a2c or ppo)")
        for key in (
            "vtrace_clip_rho_threshold",
            "vtrace_clip_pg_rho_threshold",
            "vtrace_clip_c_threshold",
        ):
            check(getattr(self, key) > 0, key, "must be > 0")
        check(0.0 <= self.lambda_ <= 1.0, "lambda", "must be in [0, 1]")
        check(self.vf_loss_coeff >= 0, "vf_loss_coeff", "must be >= 0")
        check(self.entropy_coeff >= 0, "entropy_coeff", "must be >= 0")
        check(self.num_sgd_iter >= 1, "num_sgd_iter", "must be >= 1")
        check(self.minibatch_buffer_size >= 1, "minibatch_buffer_size", "must be >= 1")
        check(self.opt_type in OPTIMIZERS, "opt_type", f"must be one of {list(OPTIMIZERS)}")
        check(0.0 <= self.decay < 1.0, "decay", "must be in [0, 1) (RMSProp's)")
        check(self.momentum >= 0.0, "momentum", "must be >= 0 (RMSProp's)")
        check(self.epsilon > 0.0, "epsilon", "must be > 0 (RMSProp's)")
        check(self.replay_proportion >= 0.0, "replay_proportion", "must be >= 0")
        check(self.replay_buffer_num_slots >= 0, "replay_buffer_num_slots", "must be >= 0")
        check(
            self.replay_proportion == 0.0 or self.replay_buffer_num_slots > 0,
            "replay_buffer_num_slots",
            "must be > 0 when replay_proportion > 0 (RLlib's MixInReplay)",
        )
        per_pull = 1 + math.ceil(self.replay_proportion)
        check(
            self.learner_queue_size >= per_pull,
            "learner_queue_size",
            f"must hold the 1 + ceil(replay_proportion) = {per_pull} train batches one "
            "MixInReplay output can hold",
        )
        check(
            self.max_sample_requests_in_flight_per_worker >= 1,
            "max_sample_requests_in_flight_per_worker",
            "must be >= 1",
        )
        check(self.broadcast_interval >= 1, "broadcast_interval", "must be >= 1")
        return self


@struct.dataclass
class IMPALAHParams(HParams):
    """IMPALA hyper-parameters that live in `PlanState` as traced f32 scalars (vmap-able): the
    `IMPALAConfig` fields declared `traced` (checked at import)."""

    lr: jnp.ndarray
    gamma: jnp.ndarray
    lambda_: jnp.ndarray
    vf_loss_coeff: jnp.ndarray
    entropy_coeff: jnp.ndarray


check_hparams(IMPALAHParams, IMPALAConfig)


def preset_config(env: str, overrides: Mapping[str, Any] | None = None) -> IMPALAConfig:
    """RLlib's IMPALA defaults, then the tuned preset for `env` (if any), then `overrides`."""
    return preset_of(IMPALAConfig, PRESETS, env, overrides)
