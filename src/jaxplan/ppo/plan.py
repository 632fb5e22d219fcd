"""PPO's execution plan, line for line as RLlib writes it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxplan.devices import make_mesh
from jaxplan.flow import Plan
from jaxplan.multi_agent import as_multi_agent, make_env
from jaxplan.ppo.config import PPOConfig, preset_config
from jaxplan.ppo.policy import PPOPolicy
from jaxplan.stages import (
    ApplySchedules,
    ConcatBatches,
    MultiGPUTrainOneStep,
    ParallelRollouts,
    SelectExperiences,
    StandardizeFields,
    StandardMetricsReporting,
    TrainOneStep,
    UpdateKL,
    warn_about_bad_reward_scales,
)
from jaxplan.stages.evaluation import Evaluation, report_evaluation
from jaxplan.workers import WorkerSet, resolve_policy_mapping


def execution_plan(workers: WorkerSet, config: PPOConfig) -> Plan:
    """PPO: sample, select trainable policies, build the train batch, standardize advantages,
    SGD, adapt the KL coefficient, report. RLlib's PPO samples `bulk_sync`; with
    `rollout_mode="async"` it is APPO-like (lagged fragments; the surrogate's ratio is taken
    against the acting policy's log-probs, optionally with V-trace advantages)."""
    rollouts = ParallelRollouts(workers, mode=config.rollout_mode, num_async=config.num_async)
    rollouts = rollouts.for_each(SelectExperiences(workers.trainable_policies()))
    rollouts = rollouts.combine(
        ConcatBatches(
            min_batch_size=config.train_batch_size, count_steps_by=config.multiagent.count_steps_by
        )
    )
    rollouts = rollouts.for_each(StandardizeFields(["advantages"]))
    schedules = _schedules(config)
    if schedules is not None:  # RLlib applies them inside its policies; here they are a stage
        rollouts = rollouts.for_each(schedules)
    if config.simple_optimizer:
        train_op = rollouts.for_each(
            TrainOneStep(
                workers,
                num_sgd_iter=config.num_sgd_iter,
                sgd_minibatch_size=config.sgd_minibatch_size,
                shuffle_sequences=config.shuffle_sequences,
            )
        )
    else:
        train_op = rollouts.for_each(
            MultiGPUTrainOneStep(
                workers,
                sgd_minibatch_size=config.sgd_minibatch_size,
                num_sgd_iter=config.num_sgd_iter,
                num_gpus=config.data_parallel_devices,
                shuffle_sequences=config.shuffle_sequences,
                _fake_gpus=config.fake_gpus,
            )
        )
    train_op = train_op.for_each(lambda t: t[1]).for_each(UpdateKL())
    evaluation = _evaluation(workers, config)
    if evaluation is not None:  # RLlib's Trainer evaluates after the step; here it is a stage
        train_op = train_op.for_each(evaluation)
    plan = StandardMetricsReporting(train_op, workers).on_result(
        lambda result: warn_about_bad_reward_scales(config, result)
    )
    return plan if evaluation is None else plan.on_result(report_evaluation)


def _evaluation(workers: WorkerSet, config: PPOConfig) -> Evaluation | None:
    """The evaluation stage of `evaluation_interval` / `evaluation_duration` /
    `evaluation_config`, or None without evaluation."""
    if not config.evaluation_interval:
        return None
    overrides = config.evaluation_config.env_config
    env = make_env(config.env, {**config.env_config, **overrides}) if overrides else None
    return Evaluation(
        workers,
        interval=config.evaluation_interval,
        num_episodes=config.evaluation_episodes,
        explore=config.evaluation_config.explore,
        env=env,
    )


def _schedules(config: PPOConfig) -> ApplySchedules | None:
    """The stage for the policies' `lr_schedule` / `entropy_coeff_schedule` (a
    `multiagent.policies` override, else the config's), or None without any."""
    schedules, configured = {}, {}
    for pid in config.policy_ids:
        overrides = config.multiagent.policies.get(pid) or {}

        def own(key, overrides=overrides):
            return overrides.get(key, getattr(config, key))

        named = {
            name: own(f"{name}_schedule")
            for name in ("lr", "entropy_coeff")
            if own(f"{name}_schedule") is not None
        }
        if named:
            schedules[pid] = named
            configured[pid] = {name: float(own(name)) for name in named}
    return ApplySchedules(schedules, configured) if schedules else None


def build_workers(config: PPOConfig) -> WorkerSet:
    """The env (gymnax, built-in multi-agent or `jaxmarl:...`), one PPO policy per policy id
    (with its `multiagent.policies` overrides) and the agent -> policy mapping, as a
    `WorkerSet` on the config's devices (`num_devices`/`num_gpus`, `_fake_gpus`; see
    `jaxplan.devices`)."""
    env = make_env(config.env, config.env_config)
    view = as_multi_agent(env)
    mapping = resolve_policy_mapping(
        view, config.policy_ids, dict(config.multiagent.policy_mapping) or None
    )
    policies = {}
    for pid in config.policy_ids:
        agent = next(a for a in view.agents if mapping[a] == pid)  # all alike (checked)
        policies[pid] = PPOPolicy(
            view.observation_shapes[agent], view.action_spaces[agent], config.policy_config(pid)
        )
    mesh = make_mesh(config.data_parallel_devices, fake_devices=config.fake_gpus)
    return WorkerSet(
        env,
        policies,
        policy_mapping=mapping,
        num_workers=config.num_workers,
        num_envs_per_worker=config.num_envs_per_worker,
        rollout_fragment_length=config.rollout_fragment_length,
        policies_to_train=config.multiagent.policies_to_train,
        normalize_actions=config.normalize_actions,
        observation_filter=config.observation_filter,
        clip_rewards=config.clip_rewards,
        metrics_smoothing_episodes=config.metrics_smoothing_episodes,
        mesh=mesh,
    )


def ppo_plan(
    config: PPOConfig | Mapping[str, Any] | None = None, *, env: str | None = None
) -> Plan:
    """The PPO plan for a config (a `PPOConfig`, or an RLlib-style dict applied on top of the
    tuned preset for its env). `ppo_plan(env="CartPole-v1")` uses that env's preset."""
    if not isinstance(config, PPOConfig):
        overrides = dict(config or {})
        name = env or overrides.get("env", PPOConfig.env)
        config = preset_config(name, overrides)
    elif env is not None and env != config.env:
        config = config.updated({"env": env})
    return execution_plan(build_workers(config), config)
