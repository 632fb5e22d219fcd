"""LearnerPostprocessing: each policy's rows of a train batch postprocessed again with the
learner's current params (IMPALA's and APPO's V-trace, or GAE), as RLlib's IMPALA and APPO
compute V-trace inside the loss. Rollouts postprocess a fragment when it is emitted; a batch
that waits in the learner queue or is replayed (`MixInReplay`) would otherwise be trained on
values and a target policy of an older learner."""

from __future__ import annotations

import jax

from jaxplan.batch import MultiAgentBatch
from jaxplan.flow import Stage
from jaxplan.workers import PlanState, WorkerSet


class LearnerPostprocessing(Stage):
    """`MultiAgentBatch -> MultiAgentBatch`: per policy, the rows (each shard: `time_steps`
    blocks of consecutive rows, rollout rounds of `rollout_fragment_length` steps one after
    the other) regrouped time-major as `[T, rounds x block]`, passed to the policy's
    `postprocess_trajectory` with its current params, and put back in their order."""

    def __init__(self, workers: WorkerSet):
        self.workers = workers

    def apply(self, state: PlanState, stage_state: None, batch: MultiAgentBatch):
        t = self.workers.rollout_fragment_length
        if batch.time_steps % t:
            raise ValueError(
                f"LearnerPostprocessing needs rows of whole rollout fragments of {t} steps; "
                f"the batch has {batch.time_steps} time steps"
            )
        rounds = batch.time_steps // t
        out = {}
        for pid, rows in batch.policy_batches.items():
            policy, ps = self.workers.policies[pid], state.policies[pid]

            def to_traj(x):
                x = x.reshape(rounds, t, -1, *x.shape[1:])
                return jax.numpy.swapaxes(x, 0, 1).reshape(t, -1, *x.shape[3:])

            def from_traj(x, like):
                x = x.reshape(t, rounds, -1, *x.shape[2:])
                return jax.numpy.swapaxes(x, 0, 1).reshape(like.shape)

            traj = policy.postprocess_trajectory(ps.params, ps.hparams, jax.tree.map(to_traj, rows))
            out[pid] = {k: from_traj(traj[k], rows[k]) for k in rows}
        return state, stage_state, batch.replace(policy_batches=out)
