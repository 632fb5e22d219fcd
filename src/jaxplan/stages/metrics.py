"""StandardMetricsReporting and warn_about_bad_reward_scales."""

from __future__ import annotations

import math
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxplan.batch import LearnerInfo, MultiAgentBatch, TrainOutput
from jaxplan.counters import Counter, counter_value
from jaxplan.flow import Flow, Plan, Result
from jaxplan.stages.train_one_step import NONFINITE_CODE, NONFINITE_STATS
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


def nonfinite_episodes(window: EpisodeWindow) -> jax.Array:
    """int32: episodes of the window whose return is NaN or infinite (the env's rewards were;
    `episode_reward_mean` is then not finite either, and this says why)."""
    valid = jnp.arange(window.returns.shape[0]) < window.num_episodes
    return jnp.sum(valid & ~jnp.isfinite(window.returns))


def learner_info_of(item: Any) -> LearnerInfo:
    """The learner info a flow's last item carries: a `TrainOutput`'s, a `LearnerInfo`
    itself (after `lambda t: t[1]` / UpdateKL), or none for a sample-only flow (a batch)."""
    if isinstance(item, TrainOutput):
        return item.learner_info
    if isinstance(item, LearnerInfo):
        return item
    if isinstance(item, MultiAgentBatch):
        return LearnerInfo({})
    raise TypeError(
        f"StandardMetricsReporting reads a TrainOutput, LearnerInfo or MultiAgentBatch as the "
        f"flow's last item, got {type(item).__name__}"
    )


def StandardMetricsReporting(flow: Flow, workers: WorkerSet) -> Plan:  # noqa: N802
    """Ends a flow: each step returns RLlib's per-iteration result.

    Device side it builds `episode_reward_mean/min/max`, `episode_len_mean` over the last
    `metrics_smoothing_episodes` completed episodes, `episodes_this_iter`, `timesteps_total`,
    `timesteps_this_iter`, `agent_timesteps_total`, `training_iteration`, per-policy rewards
    (multi-agent) and `info` (learner stats, step counters, params versions), plus every
    stage's `metrics`; `Plan.report` converts it to Python numbers on the host.
    """

    def finish(start: PlanState, state: PlanState, item: Any) -> tuple[PlanState, Result]:
        counters = state.counters.replace(training_iteration=state.counters.training_iteration + 1)
        episodes = state.episodes
        result = {
            **episode_stats(episodes),
            "episodes_nonfinite": nonfinite_episodes(episodes),
            "episodes_this_iter": episodes.episodes_this_iter,
            "episodes_total": episodes.num_episodes,
            "timesteps_total": counters.num_steps_sampled,
            # uint32 wrap-around makes the difference exact for < 2**32 steps per iteration
            "timesteps_this_iter": counters.num_steps_sampled.lo
            - start.counters.num_steps_sampled.lo,
            "agent_timesteps_total": counters.num_agent_steps_sampled,
            "training_iteration": counters.training_iteration,
            # per-policy episode returns (RLlib's keys); filled for multi-agent envs
            **_policy_rewards(state),
            "info": {
                "learner": dict(learner_info_of(item)),
                "num_steps_sampled": counters.num_steps_sampled,
                "num_agent_steps_sampled": counters.num_agent_steps_sampled,
                "num_steps_trained": counters.num_steps_trained,
                "num_agent_steps_trained": counters.num_agent_steps_trained,
                # params versions (train steps applied) of each policy
                "policy_versions": {pid: ps.version for pid, ps in state.policies.items()},
            },
        }
        state = state.replace(
            counters=counters,
            episodes=episodes.replace(
                episodes_this_iter=jnp.zeros_like(episodes.episodes_this_iter)
            ),
        )
        return state, result

    return Plan(workers, flow, finish, result_to_host)


def _policy_rewards(state: PlanState) -> dict[str, dict[str, jax.Array]]:
    """RLlib's `policy_reward_mean/min/max`: per policy, over its window of episodes, the
    returns summed over the policy's agents (empty for single-agent envs)."""
    out = {"policy_reward_mean": {}, "policy_reward_min": {}, "policy_reward_max": {}}
    for pid, window in state.policy_episodes.items():
        stats = episode_stats(window)
        for key in out:
            out[key][pid] = stats[key.replace("policy", "episode")]
    return out


_NAMED_CODES = {NONFINITE_CODE: NONFINITE_STATS}
"""Result keys whose int code names an entry (code 0: None; `k`: entry `k - 1`)."""


def result_to_host(result: Result) -> dict:
    """Device result (already fetched) -> nested dict of Python ints and floats (and the
    names of coded entries such as `first_nonfinite_stat`)."""

    def convert(x, key=None):
        if isinstance(x, Counter):
            return counter_value(x)
        if isinstance(x, dict):
            return {k: convert(v, k) for k, v in x.items()}
        a = np.asarray(x)
        if a.ndim:
            return a.tolist()
        if key in _NAMED_CODES:
            return _NAMED_CODES[key][int(a) - 1] if int(a) > 0 else None
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
