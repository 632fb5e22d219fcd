"""Execution-plan stages, one module each, named as in RLlib."""

from jaxplan.stages.concat_batches import ConcatBatches
from jaxplan.stages.metrics import StandardMetricsReporting, warn_about_bad_reward_scales
from jaxplan.stages.rollouts import ParallelRollouts
from jaxplan.stages.select_experiences import SelectExperiences
from jaxplan.stages.standardize_fields import StandardizeFields, standardize
from jaxplan.stages.train_one_step import (
    DataParallelTrainOneStep,
    MultiGPUTrainOneStep,
    TrainOneStep,
)
from jaxplan.stages.update_kl import UpdateKL, update_kl_coeff

__all__ = [
    "ConcatBatches",
    "DataParallelTrainOneStep",
    "MultiGPUTrainOneStep",
    "ParallelRollouts",
    "SelectExperiences",
    "StandardMetricsReporting",
    "StandardizeFields",
    "TrainOneStep",
    "UpdateKL",
    "standardize",
    "update_kl_coeff",
    "warn_about_bad_reward_scales",
]
