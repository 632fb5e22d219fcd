"""UpdateKL: RLlib's adaptive KL coefficient rule, as a pure update of `PlanState`."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxplan.batch import LearnerInfo
from jaxplan.flow import Stage
from jaxplan.workers import PlanState


def update_kl_coeff(kl_coeff: jax.Array, kl: jax.Array, kl_target: jax.Array) -> jax.Array:
    """`x1.5` if `kl > 2 kl_target`, `x0.5` if `kl < 0.5 kl_target`, else unchanged (also NaN)."""
    return jnp.where(
        kl > 2.0 * kl_target,
        kl_coeff * 1.5,
        jnp.where(kl < 0.5 * kl_target, kl_coeff * 0.5, kl_coeff),
    )


class UpdateKL(Stage):
    """`LearnerInfo -> LearnerInfo`; updates `kl_coeff` of every policy with learner stats
    (RLlib's `UpdateKL(workers)`: the coefficient is plan state here, so no workers)."""

    def apply(self, state: PlanState, stage_state: None, learner_info: LearnerInfo):
        policies = dict(state.policies)
        for pid, info in learner_info.items():
            ps = policies[pid]
            kl = info["learner_stats"]["kl"]
            policies[pid] = ps.replace(
                kl_coeff=update_kl_coeff(ps.kl_coeff, kl, ps.hparams.kl_target)
            )
        return state.replace(policies=policies), stage_state, learner_info
