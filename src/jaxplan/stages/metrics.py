"""StandardMetricsReporting and warn_about_bad_reward_scales."""

from __future__ import annotations

import math
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxplan import devices
from jaxplan.batch import MultiAgentBatch
from jaxplan.counters import Counter, counter_value
from jaxplan.flow import Flow, Plan, Result
from jaxplan.workers import EpisodeWindow, PlanState, WorkerSet


def episode_stats(window: EpisodeWindow) -> dict[str, jax.Array]:
    """Mean/min/max return and mean length over the window (NaN before the first episode)."""
    size = window.returns.shape[0]
    valid = jnp.arange(size) < jnp.minimum(window.num_episodes, size)
    count = jnp.sum(valid)
    nan = jnp.float32(jnp.nan)

    def masked_mean(x):
        return jnp.where(count > 0, jnp.sum(jnp.where(valid, x, 0.0)) / jnp.maximum(count, 1), nan)

    return {
        "episode_reward_mean": masked_mean(window.returns),
        "episode_reward_min": jnp.where(
            count > 0, jnp.min(jnp.where(valid, window.returns, jnp.inf)), nan
        ),
        "episode_reward_max": jnp.where(
            count > 0, jnp.max(jnp.where(valid, window.returns, -jnp.inf)), nan
        ),
        "episode_len_mean": masked_mean(window.lengths),
    }


def _learner_info(item: Any) -> dict:
    """The learner info in a flow item: TrainOneStep's `(batch, info)`, UpdateKL's `info`, or
    nothing for a sample-only flow (a batch)."""
    if isinstance(item, MultiAgentBatch):
        return {}
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], dict):
        return item[1]
    if isinstance(item, dict):
        return item
    raise TypeError(f"StandardMetricsReporting cannot read learner info from {type(item).__name__}")


def StandardMetricsReporting(flow: Flow, workers: WorkerSet, config: Any = None) -> Plan:  # noqa: N802
    """Ends a flow: each step returns RLlib's per-iteration result.

    Device side it builds `episode_reward_mean/min/max`, `episode_len_mean` over the last
    `metrics_smoothing_episodes` completed episodes, `episodes_this_iter`, `timesteps_total`,
    `agent_timesteps_total`, `training_iteration` and `info` (learner stats and the step
    counters); `Plan.report` converts it to Python numbers on the host.
    """

    def pull(state: PlanState) -> tuple[PlanState, Result]:
        sampled_before = state.counters.num_steps_sampled.lo
        state, item = flow.pull(state)
        counters = state.counters.replace(training_iteration=state.counters.training_iteration + 1)
        episodes = state.episodes
        result = {
            **episode_stats(episodes),
            "episodes_this_iter": episodes.episodes_this_iter,
            "episodes_total": episodes.num_episodes,
            "timesteps_total": counters.num_steps_sampled,
            # uint32 wrap-around makes the difference exact for < 2**32 steps per iteration
            "timesteps_this_iter": counters.num_steps_sampled.lo - sampled_before,
            "agent_timesteps_total": counters.num_agent_steps_sampled,
            "training_iteration": counters.training_iteration,
            # per-policy episode returns (RLlib's keys); filled for multi-agent envs
            **_policy_rewards(state),
            "info": {
                "learner": _learner_info(item),
                "num_steps_sampled": counters.num_steps_sampled,
                "num_agent_steps_sampled": counters.num_agent_steps_sampled,
                "num_steps_trained": counters.num_steps_trained,
                "num_agent_steps_trained": counters.num_agent_steps_trained,
                # params versions (train steps applied): each policy's, and per actor group the
                # version it acts with (async: its snapshot; bulk_sync: the newest)
                "policy_versions": {pid: ps.version for pid, ps in state.policies.items()},
                "actor_group_versions": _group_versions(workers, state),
            },
        }
        state = state.replace(
            counters=counters,
            episodes=episodes.replace(
                episodes_this_iter=jnp.zeros_like(episodes.episodes_this_iter)
            ),
        )
        return state, result

    return Plan(workers, pull, result_to_host, inits=flow.inits)


def _policy_rewards(state: PlanState) -> dict[str, dict[str, jax.Array]]:
    """RLlib's `policy_reward_mean/min/max`: per policy, over its window of episodes, the
    returns summed over the policy's agents (empty for single-agent envs)."""
    out = {"policy_reward_mean": {}, "policy_reward_min": {}, "policy_reward_max": {}}
    for pid, window in (state.policy_episodes or {}).items():
        stats = episode_stats(window)
        for key in out:
            out[key][pid] = stats[key.replace("policy", "episode")]
    return out


def _group_versions(workers: WorkerSet, state: PlanState) -> dict[str, jax.Array]:
    """`{policy_id: int32 [num_actor_groups]}` (all devices' groups, in group order)."""
    if state.actors.version is None:
        groups = workers.num_actor_groups
        return {pid: jnp.full((groups,), ps.version) for pid, ps in state.policies.items()}
    return devices.gather(state.actors.version, workers.axis_name)


def result_to_host(result: Result) -> dict:
    """Device result (already fetched) -> nested dict of Python ints and floats."""

    def convert(x):
        if isinstance(x, Counter):
            return counter_value(x)
        if isinstance(x, dict):
            return {k: convert(v) for k, v in x.items()}
        a = np.asarray(x)
        if a.ndim:
            return a.tolist()
        return int(a) if np.issubdtype(a.dtype, np.integer) else float(a)

    return convert(result)


def warn_about_bad_reward_scales(config: Any, result: dict) -> dict:
    """Host side: RLlib's warnings when rewards are too large for `vf_clip_param` (or, with
    shared value layers, when the value loss dominates). Returns `result` unchanged."""
    learner = result.get("info", {}).get("learner", {})
    if getattr(config.model, "vf_share_layers", False):
        for pid, info in learner.items():
            stats = info.get("learner_stats", {})
            scaled = stats.get("vf_loss", 0.0) * config.vf_loss_coeff
            if scaled > 100:
                warnings.warn(
                    f"The magnitude of your value function loss for policy {pid} is extremely "
                    f"large ({scaled:.1f}) compared to the policy loss "
                    f"({stats.get('policy_loss', float('nan')):.3f}). This can prevent the policy "
                    "from learning. Consider scaling down the VF loss by reducing vf_loss_coeff, "
                    "or disabling vf_share_layers.",
                    stacklevel=2,
                )
    mean_reward = result.get("episode_reward_mean", float("nan"))
    if math.isfinite(mean_reward):
        scale = round(abs(mean_reward) / config.vf_clip_param)
        if scale > 200:
            warnings.warn(
                f"The magnitude of your environment rewards are more than {scale}x the scale of "
                f"`vf_clip_param` ({config.vf_clip_param}). This means that it will take more "
                f"than {scale} iterations for your value function to converge. If this is not "
                "intended, consider increasing `vf_clip_param`.",
                stacklevel=2,
            )
    return result
