"""Rollout bookkeeping shared by the bulk-synchronous and async rollouts: episode windows and
sampled-step counters."""

from __future__ import annotations

import jax.numpy as jnp

from jaxplan.workers import PlanState, WorkerSet


def record_episodes(workers: WorkerSet, state: PlanState, episodes) -> PlanState:
    """Adds the episodes that ended (`done`, per-agent returns, lengths; `[T, groups, envs]`
    from every device, chronological in row-major order) to the team window (returns summed
    over all agents, RLlib's `episode_reward`) and, multi-agent, to each policy's window (summed
    over that policy's agents, RLlib's `policy_reward_*`)."""
    done, ep_return, ep_length = episodes
    state = state.replace(episodes=state.episodes.record(done, ep_return.sum(-1), ep_length))
    if state.policy_episodes is None:
        return state
    windows = {}
    for pid, agents in workers.policy_agents.items():
        idx = jnp.asarray([workers.agents.index(a) for a in agents])
        windows[pid] = state.policy_episodes[pid].record(
            done, ep_return[..., idx].sum(-1), ep_length
        )
    return state.replace(policy_episodes=windows)


def count_sampled(workers: WorkerSet, state: PlanState, env_steps: int) -> PlanState:
    """Adds `env_steps` env steps (and `env_steps x num_agents` agent steps) to the counters."""
    counters = state.counters
    return state.replace(
        counters=counters.replace(
            num_steps_sampled=counters.num_steps_sampled.add(env_steps),
            num_agent_steps_sampled=counters.num_agent_steps_sampled.add(
                env_steps * workers.num_agents
            ),
        )
    )
