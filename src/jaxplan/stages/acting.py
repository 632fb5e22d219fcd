"""One env step of every local actor group: actions, env transitions, episode bookkeeping.

Shared by the bulk-synchronous and the async (staggered) rollouts. Randomness is drawn per
actor group and per env from keys split for *all* groups, then sliced to this device's
groups, so a group's steps do not depend on how many devices the groups are spread over.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxplan import batch as sb
from jaxplan import devices
from jaxplan.envs import Box
from jaxplan.policy import Policy
from jaxplan.workers import ActorState, WorkerSet


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


def step_envs(
    workers: WorkerSet,
    policy: Policy,
    params: Any,
    actors: ActorState,
    key: jax.Array,
    axis_name: str | None,
    params_per_group: bool = False,
    active: jax.Array | None = None,
) -> tuple[ActorState, dict[str, jax.Array], tuple[jax.Array, jax.Array, jax.Array]]:
    """Steps every env of the local groups once.

    `params` are the policy's params, or with `params_per_group` a stack `[local groups, ...]`
    (each group acts with its own snapshot). `active` (`[local groups]` bool) freezes the other
    groups: their env state, observation and episode counters stay as they were.

    Returns the new actor state, the transition `{field: [groups, envs, ...]}` (obs, new_obs
    (the final observation of a finished episode), actions, rewards, terminateds, truncateds
    and the policy's extras) and `(done, episode_return, episode_length)` for the episode
    window (`done` is False for frozen groups).
    """
    groups, envs = workers.num_actor_groups, workers.num_envs_per_worker
    k_act, k_env = jax.random.split(key)
    act_keys = devices.local_slice(jax.random.split(k_act, groups), axis_name)
    env_keys = jax.random.split(k_env, groups * envs).reshape(groups, envs, -1)
    act = jax.vmap(policy.compute_actions, in_axes=(0 if params_per_group else None, 0, 0))
    actions, extras = act(params, actors.obs, act_keys)
    obs, env_state, reward, terminated, truncated, final_obs = jax.vmap(
        jax.vmap(workers.env.step)
    )(devices.local_slice(env_keys, axis_name), actors.env_state, to_env_action(workers, actions))
    done = terminated | truncated
    ep_return = actors.episode_return + reward
    ep_length = actors.episode_length + 1
    new = {
        "env_state": env_state,
        "obs": obs,
        "episode_return": jnp.where(done, 0.0, ep_return),
        "episode_length": jnp.where(done, 0, ep_length),
    }
    if active is not None:
        old = {k: getattr(actors, k) for k in new}

        def keep(n, o):
            return jnp.where(active.reshape(-1, *([1] * (n.ndim - 1))), n, o)

        new = jax.tree.map(keep, new, old)
        done = done & active[:, None]
    transition = {
        sb.OBS: actors.obs,
        sb.NEXT_OBS: final_obs,
        sb.ACTIONS: actions,
        sb.REWARDS: reward,
        sb.TERMINATEDS: terminated,
        sb.TRUNCATEDS: truncated,
        **extras,
    }
    return actors.replace(**new), transition, (done, ep_return, ep_length)
