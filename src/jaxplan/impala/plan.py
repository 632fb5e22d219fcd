"""IMPALA's execution plan (RLlib's `impala/impala.py`, `gather_experiences_directly`), with
its asynchronous actors as staggered actor groups (deterministic, lag measured)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxplan import trainer
from jaxplan.a2c.policy import A2CPolicy
from jaxplan.algorithms import Algorithm, train_batch
from jaxplan.flow import Flow, Plan, Stage
from jaxplan.impala.config import PRESETS, IMPALAConfig, IMPALAHParams
from jaxplan.stages import (
    ConcatBatches,
    MultiGPUTrainOneStep,
    ParallelRollouts,
    TrainOneStep,
)
from jaxplan.stages.concurrently import Concurrently
from jaxplan.stages.learner_postprocessing import LearnerPostprocessing
from jaxplan.stages.learner_queue import Dequeue, Enqueue, LearnerQueue, MinibatchBuffer
from jaxplan.stages.mix_in_replay import MixInReplay
from jaxplan.workers import WorkerSet


class IMPALAPolicy(A2CPolicy):
    """The actor-critic policy with V-trace postprocessing (the learner's params against the
    acting ones, whose log-probs the rows carry) and RLlib's IMPALA loss, which is A2C's
    summed loss on V-trace's policy-gradient advantages and value targets."""

    hparams_class = IMPALAHParams


def gather_experiences_directly(workers: WorkerSet, config: IMPALAConfig) -> Flow:
    """Train batches (RLlib's function of that name): async actor groups (each acting with
    its own params snapshot, refreshed when it starts a fragment with the weights RLlib's
    `BroadcastUpdateLearnerWeights` sends: `jaxplan.stages.rollouts.Rollouts`) -> batches of
    `train_batch_size` -> with `replay_proportion > 0`, `MixInReplay`."""
    rollouts = ParallelRollouts(
        workers,
        mode="async",
        num_async=config.max_sample_requests_in_flight_per_worker,
        broadcast_interval=config.broadcast_interval,
    )
    train_batches = rollouts.combine(
        ConcatBatches(
            min_batch_size=config.train_batch_size,
            count_steps_by=config.multiagent.count_steps_by,
        )
    )
    if config.replay_proportion > 0:  # RLlib mixes before ConcatBatches (see MixInReplay)
        train_batches = train_batches.for_each(
            MixInReplay(
                workers,
                train_batches,
                num_slots=config.replay_buffer_num_slots,
                replay_proportion=config.replay_proportion,
            )
        )
    return train_batches


def execution_plan(
    workers: WorkerSet, config: IMPALAConfig, *, after_train_step: Stage | None = None
) -> Plan:
    """IMPALA: train batches (`gather_experiences_directly`) -> the learner queue -> the
    learner's `num_sgd_iter` steps on each with the V-trace loss (with
    `minibatch_buffer_size > 1` through RLlib's `MinibatchBuffer`: one step per get, `k =
    num_sgd_iter` gets per cycle); the producer and the learner run "concurrently" (one
    pull each per cycle; see `jaxplan.stages.learner_queue` for the queue's backpressure).
    `after_train_step`: a stage on each learner info (RLlib's config key of that name:
    APPO's `UpdateTargetAndKL`)."""
    train_batches = gather_experiences_directly(workers, config)
    # RLlib's minibatch buffer only matters with several passes (one pass: Dequeue's order)
    buffered = config.minibatch_buffer_size > 1 and config.num_sgd_iter > 1
    # without replay or the minibatch buffer the learner takes each batch in the cycle that
    # makes it and the queue never holds more than one: one slot behaves the same with
    # 1/learner_queue_size the memory. The buffer refills its slots in bursts (one batch per
    # step for `minibatch_buffer_size` steps, then none): the queue absorbs them
    queue_size = 1
    if config.replay_proportion > 0 or buffered:
        queue_size = config.learner_queue_size
    learner_queue = LearnerQueue(
        workers,
        train_batches,
        learner_queue_size=queue_size,
        minibatch_buffer_size=config.minibatch_buffer_size if buffered else 1,
    )
    enqueue_op = train_batches.for_each(Enqueue(learner_queue))

    if buffered:  # one learner step per pull, on the ring's batch of that step
        dequeue_op = MinibatchBuffer(learner_queue, num_passes=config.num_sgd_iter)
    else:  # the num_sgd_iter passes over each batch in one pull
        dequeue_op = Dequeue(learner_queue)
    if config.replay_proportion > 0 or buffered:  # V-trace at learning time (RLlib's loss)
        dequeue_op = dequeue_op.for_each(LearnerPostprocessing(workers))
    schedules = trainer.schedules_stage(config)
    if schedules is not None:  # RLlib applies them inside its policies; here a stage
        dequeue_op = dequeue_op.for_each(schedules)
    passes = 1 if buffered else config.num_sgd_iter
    learner = dict(num_sgd_iter=passes, shuffle_sequences=False)
    if config.simple_optimizer or workers.mesh is None:
        dequeue_op = dequeue_op.for_each(TrainOneStep(workers, **learner))
    else:  # each device differentiates its shard of the batch
        dequeue_op = dequeue_op.for_each(
            MultiGPUTrainOneStep(
                workers,
                num_gpus=config.data_parallel_devices,
                _fake_gpus=config.fake_gpus,
                **learner,
            )
        )
    # RLlib applies after_train_step to the merged op's items: the learner's
    if after_train_step is not None:
        dequeue_op = dequeue_op.for_each(lambda t: t[1]).for_each(after_train_step)
    if buffered:  # a cycle makes num_sgd_iter learner steps, as with one pull of k passes
        dequeue_op = dequeue_op.repeat(config.num_sgd_iter)

    merged_op = Concurrently([enqueue_op, dequeue_op], mode="async", output_indexes=[1])
    return trainer.reporting(merged_op, workers, config)


def build_workers(config: IMPALAConfig) -> WorkerSet:
    """The env, one IMPALA policy per policy id and the agent -> policy mapping, as a
    `WorkerSet` on the config's devices (`jaxplan.trainer.build_workers`)."""
    return trainer.build_workers(config, IMPALAPolicy)


def impala_plan(
    config: IMPALAConfig | Mapping[str, Any] | None = None, *, env: str | None = None
) -> Plan:
    """The IMPALA plan for a config (an `IMPALAConfig`, or an RLlib-style dict applied on top
    of the tuned preset for its env)."""
    return ALGORITHM.plan(config, env=env)


ALGORITHM = Algorithm(
    name="IMPALA",
    config_class=IMPALAConfig,
    presets=PRESETS,
    build_workers=build_workers,
    execution_plan=execution_plan,
    describe=lambda c: (
        f"{train_batch(c)} | {c.num_sgd_iter} V-trace step(s) on it"
        + (
            f" (minibatch buffer of {c.minibatch_buffer_size})"
            if c.minibatch_buffer_size > 1 and c.num_sgd_iter > 1
            else ""
        )
    ),
)
"""IMPALA for `jaxplan train impala` (`jaxplan.algorithms`)."""
