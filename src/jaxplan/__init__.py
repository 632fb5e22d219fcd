"""jaxplan: RLlib-style execution plans as pure, compiled JAX functions."""

from jaxplan.batch import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch
from jaxplan.envs import Env
from jaxplan.flow import Flow, Plan, Stage
from jaxplan.gae import compute_gae
from jaxplan.plans import sample_only_plan
from jaxplan.ppo.config import PPOConfig, PPOHParams, preset_config
from jaxplan.ppo.plan import build_workers, execution_plan, ppo_plan
from jaxplan.ppo.policy import PPOPolicy
from jaxplan.random_policy import RandomPolicy
from jaxplan.run import Stop, make_train, run_iterations, train_seeds
from jaxplan.stages import (
    ConcatBatches,
    DataParallelTrainOneStep,
    MultiGPUTrainOneStep,
    ParallelRollouts,
    SelectExperiences,
    StandardizeFields,
    StandardMetricsReporting,
    TrainOneStep,
    UpdateKL,
    warn_about_bad_reward_scales,
)
from jaxplan.vtrace import vtrace
from jaxplan.workers import PlanState, WorkerSet

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_POLICY_ID",
    "ConcatBatches",
    "DataParallelTrainOneStep",
    "Env",
    "Flow",
    "MultiAgentBatch",
    "MultiGPUTrainOneStep",
    "PPOConfig",
    "PPOHParams",
    "PPOPolicy",
    "ParallelRollouts",
    "Plan",
    "PlanState",
    "RandomPolicy",
    "SampleBatch",
    "SelectExperiences",
    "Stage",
    "StandardMetricsReporting",
    "StandardizeFields",
    "Stop",
    "TrainOneStep",
    "UpdateKL",
    "WorkerSet",
    "build_workers",
    "compute_gae",
    "execution_plan",
    "make_train",
    "ppo_plan",
    "preset_config",
    "run_iterations",
    "sample_only_plan",
    "train_seeds",
    "vtrace",
    "warn_about_bad_reward_scales",
]
