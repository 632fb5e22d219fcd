"""RLlib's gradient operators: `ComputeGradients -> .batch(n) -> AverageGradients ->
ApplyGradients` (A2C's microbatch plan; A3C's learner)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxplan import devices
from jaxplan.batch import LearnerInfo, MultiAgentBatch
from jaxplan.flow import Stage
from jaxplan.stages.train_one_step import all_finite
from jaxplan.workers import PlanState, WorkerSet


@struct.dataclass
class Gradients:
    """`ComputeGradients`' item, RLlib's `(grads, count)`: per policy the gradients of its
    loss on the batch and its learner info; `env_steps` / `agent_steps` count the batch (or,
    after `AverageGradients`, all the batches) it came from."""

    grads: dict[str, Any]
    learner_info: LearnerInfo
    env_steps: int = struct.field(pytree_node=False)
    agent_steps: int = struct.field(pytree_node=False)


class ComputeGradients(Stage):
    """`MultiAgentBatch -> Gradients`: per policy in the batch, the gradient of its loss at
    the current params (no update). On a mesh each device differentiates its own shard of the
    batch and the gradients and statistics are averaged across devices (the policy's loss
    scales itself so that this is the whole batch's gradient: see `Policy.loss`)."""

    def __init__(self, workers: WorkerSet):
        self.workers = workers

    def apply(self, state: PlanState, stage_state: None, batch: MultiAgentBatch):
        grads, info = {}, {}
        for pid, pb in batch.policy_batches.items():
            policy, ps = self.workers.policies[pid], state.policies[pid]
            on_axis = {} if batch.shard_axis is None else {"axis_name": batch.shard_axis}
            (_, stats), g = jax.value_and_grad(policy.loss, has_aux=True)(
                devices.varying(ps.params, batch.shard_axis), ps.hparams, ps.kl_coeff, pb, **on_axis
            )
            grads[pid], stats = devices.mean((g, stats), batch.shard_axis)
            info[pid] = {"learner_stats": stats}
        out = Gradients(grads, LearnerInfo(info), batch.env_steps, batch.agent_steps())
        return state, stage_state, out


class AverageGradients(Stage):
    """`Gradients` stacked over a leading `[n]` axis (`Flow.batch(n)`) -> one `Gradients`:
    as RLlib's `AverageGradients`, the gradients are **summed** (despite the name), so with a
    summed loss (A2C's) n microbatches give the whole batch's gradient; the learner
    statistics are averaged and the step counts added."""

    def apply(self, state: PlanState, stage_state: None, stacked: Gradients):
        n = jax.tree.leaves(stacked.grads)[0].shape[0]
        out = Gradients(
            grads=jax.tree.map(lambda g: jnp.sum(g, axis=0), stacked.grads),
            learner_info=jax.tree.map(lambda x: jnp.mean(x, axis=0), stacked.learner_info),
            env_steps=stacked.env_steps * n,
            agent_steps=stacked.agent_steps * n,
        )
        return state, stage_state, out


class ApplyGradients(Stage):
    """`Gradients -> LearnerInfo`: one optimizer step per policy with its gradients (the
    policy's `apply_gradients`, e.g. global-norm clipping and Adam), the params version
    advanced and the trained-step counters counted. A non-finite gradient or update is not
    applied; `learner_stats.num_nonfinite_updates` counts it (as `TrainOneStep`)."""

    def __init__(self, workers: WorkerSet):
        self.workers = workers

    def apply(self, state: PlanState, stage_state: None, item: Gradients):
        policies = dict(state.policies)
        info = {}
        for pid, grads in item.grads.items():
            ps = policies[pid]
            new = self.workers.policies[pid].apply_gradients(ps, grads)
            ok = all_finite(grads) & all_finite(new.params) & all_finite(new.opt_state)
            new = jax.tree.map(lambda n, o, ok=ok: jnp.where(ok, n, o), new, ps)
            policies[pid] = new.replace(version=ps.version + 1)
            stats = dict(item.learner_info[pid]["learner_stats"])
            stats["num_nonfinite_updates"] = (~ok).astype(jnp.int32)
            info[pid] = {**item.learner_info[pid], "learner_stats": stats}
        counters = state.counters
        state = state.replace(
            policies=policies,
            counters=counters.replace(
                num_steps_trained=counters.num_steps_trained.add(item.env_steps),
                num_agent_steps_trained=counters.num_agent_steps_trained.add(item.agent_steps),
            ),
        )
        return state, stage_state, LearnerInfo(info)


class AsyncGradients(Stage):
    """A flow source, RLlib's `AsyncGradients(workers)` (A3C): the staggered actor groups of
    `ParallelRollouts(mode="async")`; each round the group that completes its fragment
    computes the gradient of its loss **with the params it acted with** (its lagged snapshot;
    advantages from that snapshot's critic too), as an A3C worker does; `-> Gradients` with
    `learner_info[pid]["policy_lag_mean/max"]` (train steps between those params and the
    newest). `ApplyGradients` then updates the newest params, which only that group takes when
    it starts its next fragment (RLlib's `update_all=False`). One device (no mesh)."""

    name = "async_gradients"

    def __init__(self, workers: WorkerSet, *, num_async: int = 1):
        from jaxplan.stages.rollouts import Rollouts

        if workers.mesh is not None:
            raise ValueError(
                "AsyncGradients (A3C) runs on one device: each gradient is one group's, "
                "applied on its own; build the workers with num_devices=0"
            )
        self.workers = workers
        self.rollouts = Rollouts(workers, mode="async", num_async=num_async)

    def init(self, state: PlanState):
        return self.rollouts.init(state)

    def partition_spec(self):
        return self.rollouts.partition_spec()

    def metrics(self, state: PlanState, stage_state: Any):
        return self.rollouts.metrics(state, stage_state)

    def apply(self, state: PlanState, stage_state: Any, item: Any = None):
        state, rs, batch = self.rollouts.apply(state, stage_state, None)
        done_group = jnp.argmax(rs.groups.fill == 0)  # the one group that just completed
        t = self.workers.rollout_fragment_length
        grads, info = {}, {}
        for pid, rows in batch.policy_batches.items():
            policy, ps = self.workers.policies[pid], state.policies[pid]
            acted = jax.tree.map(lambda p: p[done_group], rs.groups.params[pid])
            version = rs.groups.version[pid][done_group]
            # the worker postprocesses with its own params: back to [T, ...] for GAE
            traj = jax.tree.map(lambda x: x.reshape(t, -1, *x.shape[1:]), rows)
            traj = policy.postprocess_trajectory(acted, ps.hparams, traj)
            rows = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), traj)
            (_, stats), grads[pid] = jax.value_and_grad(policy.loss, has_aux=True)(
                acted, ps.hparams, ps.kl_coeff, rows
            )
            lag = ps.version - version
            info[pid] = {
                "learner_stats": stats,
                "policy_lag_mean": lag.astype(jnp.float32),
                "policy_lag_max": lag,
            }
        out = Gradients(grads, LearnerInfo(info), batch.env_steps, batch.agent_steps())
        return state, rs, out


def mean_learner_info(stacked: LearnerInfo) -> LearnerInfo:
    """Learner infos stacked over a leading axis (`Flow.batch(n)` of `ApplyGradients`) -> the
    mean of each statistic, the max of `policy_lag_max` and the sum of the counts."""

    def reduce(path, x):
        name = jax.tree_util.keystr(path)
        if "policy_lag_max" in name:
            return jnp.max(x, axis=0)
        if "num_nonfinite" in name:
            return jnp.sum(x, axis=0)
        return jnp.mean(x, axis=0)

    return jax.tree_util.tree_map_with_path(reduce, stacked)
