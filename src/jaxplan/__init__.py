"""jaxplan: RLlib-style execution plans as pure, compiled JAX functions.

What a plan author needs is here: the stage contract (`Stage`), `Flow` and `Plan`, RLlib's
stages, `WorkerSet`/`PlanState`, the policy contract, the algorithms' plans and configs
(PPO, A2C, A3C, IMPALA, APPO; `get_algorithm` by name), and the runners.
Formulas (`jaxplan.gae`, `jaxplan.vtrace`, `jaxplan.ppo.loss`), devices (`jaxplan.devices`),
envs (`jaxplan.envs`: the env contract; `jaxplan.multi_agent`) and checkpoints live in their
submodules.
"""

from jaxplan.a2c.config import A2CConfig
from jaxplan.a2c.plan import a2c_plan
from jaxplan.a3c.config import A3CConfig
from jaxplan.a3c.plan import a3c_plan
from jaxplan.algorithms import Algorithm, get_algorithm
from jaxplan.appo.config import APPOConfig
from jaxplan.appo.plan import appo_plan
from jaxplan.batch import (
    DEFAULT_POLICY_ID,
    LearnerInfo,
    MultiAgentBatch,
    SampleBatch,
    TrainOutput,
)
from jaxplan.compiler import compiler_options
from jaxplan.config import TrainerConfig
from jaxplan.envs import Env, register_env
from jaxplan.flow import Flow, Plan, Stage
from jaxplan.impala.config import IMPALAConfig
from jaxplan.impala.plan import impala_plan
from jaxplan.models import register_model
from jaxplan.plans import sample_only_plan
from jaxplan.policy import Policy, PolicyState
from jaxplan.ppo.config import PPOConfig, PPOHParams, preset_config
from jaxplan.ppo.plan import build_workers, execution_plan, ppo_plan
from jaxplan.ppo.policy import PPOPolicy
from jaxplan.random_policy import RandomPolicy
from jaxplan.run import Stop, make_train, run_iterations, train_seeds
from jaxplan.runner import Runner
from jaxplan.seed_devices import use_cpu_devices
from jaxplan.stages import (
    ApplyGradients,
    AsyncGradients,
    AverageGradients,
    ComputeGradients,
    ConcatBatches,
    Evaluation,
    MultiGPUTrainOneStep,
    ParallelRollouts,
    SelectExperiences,
    StandardizeFields,
    StandardMetricsReporting,
    TrainOneStep,
    UpdateKL,
    evaluate,
    warn_about_bad_reward_scales,
)
from jaxplan.trained import TrainedRun, load_run
from jaxplan.trained_policy import TrainedPolicy, load_policy
from jaxplan.workers import PlanState, WorkerSet

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_POLICY_ID",
    "A2CConfig",
    "A3CConfig",
    "APPOConfig",
    "IMPALAConfig",
    "Algorithm",
    "ApplyGradients",
    "AsyncGradients",
    "AverageGradients",
    "ComputeGradients",
    "TrainerConfig",
    "a2c_plan",
    "a3c_plan",
    "appo_plan",
    "impala_plan",
    "get_algorithm",
    "compiler_options",
    "ConcatBatches",
    "Env",
    "Evaluation",
    "Flow",
    "LearnerInfo",
    "MultiAgentBatch",
    "MultiGPUTrainOneStep",
    "PPOConfig",
    "PPOHParams",
    "PPOPolicy",
    "ParallelRollouts",
    "Plan",
    "PlanState",
    "Policy",
    "PolicyState",
    "RandomPolicy",
    "Runner",
    "SampleBatch",
    "SelectExperiences",
    "Stage",
    "StandardMetricsReporting",
    "StandardizeFields",
    "Stop",
    "TrainOneStep",
    "TrainOutput",
    "TrainedPolicy",
    "TrainedRun",
    "UpdateKL",
    "WorkerSet",
    "build_workers",
    "evaluate",
    "execution_plan",
    "load_policy",
    "load_run",
    "make_train",
    "ppo_plan",
    "preset_config",
    "register_env",
    "register_model",
    "run_iterations",
    "sample_only_plan",
    "train_seeds",
    "use_cpu_devices",
    "warn_about_bad_reward_scales",
]
