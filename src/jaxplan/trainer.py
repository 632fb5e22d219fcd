"""What every algorithm's plan builds from its config (a `jaxplan.config.TrainerConfig`): the
`WorkerSet` with one policy per policy id, the schedules stage, and the end of every plan
(evaluation, when configured, and `StandardMetricsReporting`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from jaxplan.config import TrainerConfig
from jaxplan.devices import make_mesh
from jaxplan.flow import Flow, Plan
from jaxplan.multi_agent import as_multi_agent, make_env
from jaxplan.stages import ApplySchedules, StandardMetricsReporting
from jaxplan.stages.evaluation import Evaluation, report_evaluation
from jaxplan.workers import WorkerSet, resolve_policy_mapping

PolicyFactory = Callable[[tuple[int, ...], Any, TrainerConfig], Any]
"""`(obs_shape, action_space, policy_config) -> Policy` (a policy class, e.g. `PPOPolicy`)."""


def build_workers(config: TrainerConfig, policy_class: PolicyFactory) -> WorkerSet:
    """The env (gymnax, built-in multi-agent, `jaxmarl:...` or registered), one
    `policy_class` policy per policy id (with its `multiagent.policies` overrides) and the
    agent -> policy mapping, as a `WorkerSet` on the config's devices (`num_devices`/`num_gpus`,
    `_fake_gpus`; see `jaxplan.devices`)."""
    env = make_env(config.env, config.env_config)
    view = as_multi_agent(env)
    mapping = resolve_policy_mapping(
        view, config.policy_ids, dict(config.multiagent.policy_mapping) or None
    )
    policies = {}
    for pid in config.policy_ids:
        agent = next(a for a in view.agents if mapping[a] == pid)  # all alike (checked)
        policies[pid] = policy_class(
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


def evaluation_stage(workers: WorkerSet, config: TrainerConfig) -> Evaluation | None:
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


def schedules_stage(config: TrainerConfig) -> ApplySchedules | None:
    """The stage for the policies' `<name>_schedule` keys (`lr_schedule`,
    `entropy_coeff_schedule`, ...: a `multiagent.policies` override, else the config's), or
    None without any."""
    names = [
        f.name.removesuffix("_schedule")
        for f in dataclasses.fields(config)
        if f.name.endswith("_schedule")
    ]
    schedules, configured = {}, {}
    for pid in config.policy_ids:
        overrides = config.multiagent.policies.get(pid) or {}

        def own(key, overrides=overrides):
            return overrides.get(key, getattr(config, key))

        named = {
            name: own(f"{name}_schedule") for name in names if own(f"{name}_schedule") is not None
        }
        if named:
            schedules[pid] = named
            configured[pid] = {name: float(own(name)) for name in named}
    return ApplySchedules(schedules, configured) if schedules else None


def reporting(train_op: Flow, workers: WorkerSet, config: TrainerConfig) -> Plan:
    """The end of a plan, RLlib's `StandardMetricsReporting(train_op, workers, config)` plus
    its Trainer's evaluation: with `evaluation_interval`, the evaluation stage after the
    training step (inside the compiled step) and its host hook; then the metrics."""
    evaluation = evaluation_stage(workers, config)
    if evaluation is not None:
        train_op = train_op.for_each(evaluation)
    plan = StandardMetricsReporting(train_op, workers)
    return plan if evaluation is None else plan.on_result(report_evaluation)
