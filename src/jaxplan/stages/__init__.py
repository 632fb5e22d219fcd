"""Execution-plan stages, one module each, named as in RLlib."""

from jaxplan.stages.apply_schedules import ApplySchedules
from jaxplan.stages.concat_batches import ConcatBatches
from jaxplan.stages.evaluation import Evaluation, evaluate
from jaxplan.stages.gradients import (
    ApplyGradients,
    AsyncGradients,
    AverageGradients,
    ComputeGradients,
)
from jaxplan.stages.learner_postprocessing import LearnerPostprocessing
from jaxplan.stages.learner_queue import Dequeue, Enqueue, LearnerQueue, MixedBatches
from jaxplan.stages.metrics import StandardMetricsReporting, warn_about_bad_reward_scales
from jaxplan.stages.mix_in_replay import MixInReplay
from jaxplan.stages.rollouts import ParallelRollouts, Rollouts
from jaxplan.stages.select_experiences import SelectExperiences
from jaxplan.stages.standardize_fields import StandardizeFields
from jaxplan.stages.train_one_step import MultiGPUTrainOneStep, TrainOneStep
from jaxplan.stages.update_kl import UpdateKL

__all__ = [
    "ApplyGradients",
    "ApplySchedules",
    "AsyncGradients",
    "AverageGradients",
    "ComputeGradients",
    "ConcatBatches",
    "Dequeue",
    "Enqueue",
    "Evaluation",
    "LearnerPostprocessing",
    "LearnerQueue",
    "MixInReplay",
    "MixedBatches",
    "MultiGPUTrainOneStep",
    "ParallelRollouts",
    "Rollouts",
    "SelectExperiences",
    "StandardMetricsReporting",
    "StandardizeFields",
    "TrainOneStep",
    "UpdateKL",
    "evaluate",
    "warn_about_bad_reward_scales",
]
