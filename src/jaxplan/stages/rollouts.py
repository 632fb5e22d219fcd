"""ParallelRollouts: actor groups x envs stepped with `vmap`, fragments collected with `scan`."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxplan import batch as sb
from jaxplan import devices
from jaxplan.batch import DEFAULT_POLICY_ID, MultiAgentBatch
from jaxplan.envs import Box
from jaxplan.flow import Flow
from jaxplan.workers import PlanState, WorkerSet

MODES = ("bulk_sync",)


def ParallelRollouts(workers: WorkerSet, mode: str = "bulk_sync") -> Flow:  # noqa: N802
    """A flow of rollout rounds.

    `bulk_sync`: every actor group acts with the current params of its policy; each round
    yields `num_workers x num_envs_per_worker x rollout_fragment_length` env steps as one
    postprocessed `MultiAgentBatch` (rows ordered time-major), with zero policy lag.
    """
    if mode not in MODES:
        raise ValueError(f"ParallelRollouts mode {mode!r} is not supported; valid modes: {MODES}")
    return Flow(workers, lambda state: sample_round(workers, state))


def to_env_action(workers: WorkerSet, actions: jax.Array) -> jax.Array:
    """Policy actions -> env actions. With `normalize_actions`, a Box action is clipped to
    [-1, 1] and mapped affinely onto the space's bounds (RLlib's `normalize_actions`)."""
    space = workers.env.action_space
    if not isinstance(space, Box):
        return actions
    low, high = jnp.asarray(space.low), jnp.asarray(space.high)
    if workers.normalize_actions:
        return low + (jnp.clip(actions, -1.0, 1.0) + 1.0) * 0.5 * (high - low)
    return jnp.clip(actions, low, high)


def sample_round(workers: WorkerSet, state: PlanState) -> tuple[PlanState, MultiAgentBatch]:
    """One bulk-synchronous round: `[T, groups, envs]` steps, postprocessed and flattened.

    Randomness is drawn per actor group and per env from keys split for all groups, so the
    steps of a group do not depend on how many devices the groups are spread over. On a mesh
    each device steps its `local_groups`; the emitted batch holds this device's rows
    (`shard_axis` set), and the episode window records every device's episodes in the order
    one device would.
    """
    pid = DEFAULT_POLICY_ID
    policy, pstate = workers.policies[pid], state.policies[pid]
    env = workers.env
    axis = workers.axis_name
    groups, envs = workers.num_actor_groups, workers.num_envs_per_worker
    key, k_round = jax.random.split(state.key)
    act = jax.vmap(policy.compute_actions, in_axes=(None, 0, 0))  # over the local groups
    env_step_fn = jax.vmap(jax.vmap(env.step))

    def env_step(actors, key_t):
        k_act, k_env = jax.random.split(key_t)
        act_keys = devices.local_slice(jax.random.split(k_act, groups), axis)
        env_keys = jax.random.split(k_env, groups * envs).reshape(groups, envs, -1)
        actions, extras = act(pstate.params, actors.obs, act_keys)
        obs, env_state, reward, terminated, truncated, final_obs = env_step_fn(
            devices.local_slice(env_keys, axis), actors.env_state, to_env_action(workers, actions)
        )
        done = terminated | truncated
        ep_return = actors.episode_return + reward
        ep_length = actors.episode_length + 1
        new_actors = actors.replace(
            env_state=env_state,
            obs=obs,
            episode_return=jnp.where(done, 0.0, ep_return),
            episode_length=jnp.where(done, 0, ep_length),
        )
        transition = {
            sb.OBS: actors.obs,
            sb.NEXT_OBS: final_obs,
            sb.ACTIONS: actions,
            sb.REWARDS: reward,
            sb.TERMINATEDS: terminated,
            sb.TRUNCATEDS: truncated,
            **extras,
        }
        return new_actors, (transition, (done, ep_return, ep_length))

    actors, (traj, episodes) = jax.lax.scan(
        env_step, state.actors, jax.random.split(k_round, workers.rollout_fragment_length)
    )
    traj = policy.postprocess_trajectory(pstate.params, pstate.hparams, traj)
    rows = workers.round_env_steps
    local_rows = rows // workers.num_shards
    policy_batch = jax.tree.map(lambda x: x.reshape(local_rows, *x.shape[3:]), traj)
    done, ep_return, ep_length = devices.gather(episodes, axis, axis=1)  # [T, groups, envs]
    counters = state.counters
    state = state.replace(
        actors=actors,
        episodes=state.episodes.record(done, ep_return, ep_length),
        counters=counters.replace(
            num_steps_sampled=counters.num_steps_sampled.add(rows),
            num_agent_steps_sampled=counters.num_agent_steps_sampled.add(rows),
        ),
        key=key,
    )
    batch = MultiAgentBatch(
        {pid: policy_batch}, env_steps=rows, shard_axis=axis, num_shards=workers.num_shards
    )
    return state, batch
