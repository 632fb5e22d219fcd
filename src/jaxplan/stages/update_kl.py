"""UpdateKL: RLlib's adaptive KL coefficient rule, as a pure update of `PlanState`."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxplan.flow import Stage
from jaxplan.workers import PlanState, WorkerSet


def update_kl_coeff(kl_coeff: jax.Array, kl: jax.Array, kl_target: jax.Array) -> jax.Array:
    """`x1.5` if `kl > 2 kl_target`, `x0.5` if `kl < 0.5 kl_target`, else unchanged (also NaN)."""
    return jnp.where(
        kl > 2.0 * kl_target,
        kl_coeff * 1.5,
        jnp.where(kl < 0.5 * kl_target, kl_coeff * 0.5, kl_coeff),
    )


class UpdateKL(Stage):
    """`learner_info -> learner_info`; updates `kl_coeff` of every policy with learner stats."""

    def __init__(self, workers: WorkerSet):
        self.workers = workers

    def __call__(self, state: PlanState, learner_info: dict) -> tuple[PlanState, dict]:
        policies = dict(state.policies)
        for pid, info in learner_info.items():
            ps = policies[pid]
            kl = info["learner_stats"]["kl"]
            policies[pid] = ps.replace(
                kl_coeff=update_kl_coeff(ps.kl_coeff, kl, ps.hparams.kl_target)
            )
        return state.replace(policies=policies), learner_info
