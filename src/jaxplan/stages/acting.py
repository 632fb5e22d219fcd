"""One env step of every local actor group: every agent's action from its policy, the env
transition, episode bookkeeping.

Used by both schedules of the rollout stage (`jaxplan.stages.rollouts`). Randomness is drawn per
actor group and per env from keys split for *all* groups, then sliced to this device's
groups, so a group's steps do not depend on how many devices the groups are spread over.
A step's keys are derived from its one key by `step_keys`; the rollout stage derives a whole
segment's at once (`vmap` over the steps, before its `scan`): the same keys, from a few wide
hashes per segment instead of three small ones per step.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxplan import batch as sb
from jaxplan import devices
from jaxplan.envs import Box
from jaxplan.filters import MeanStd, clip_rewards
from jaxplan.workers import ActorState, WorkerSet, vmap_envs


def to_env_action(space, actions: jax.Array, *, normalize_actions: bool) -> jax.Array:
    """Policy actions -> env actions for `space`. With `normalize_actions`, a Box action is
    clipped to [-1, 1] and mapped affinely onto the space's bounds (RLlib's
    `normalize_actions`); otherwise clipped to the bounds."""
    if not isinstance(space, Box):
        return actions
    low, high = jnp.asarray(space.low), jnp.asarray(space.high)
    if normalize_actions:
        return low + (jnp.clip(actions, -1.0, 1.0) + 1.0) * 0.5 * (high - low)
    return jnp.clip(actions, low, high)


def select_groups(mask: jax.Array, new, old):
    """Per actor group (leading axis): `new` where `mask` (`[groups]` bool), else `old`;
    `new` may lack the group axis (it is then broadcast)."""

    def pick(n, o):
        return jnp.where(mask.reshape(-1, *([1] * (o.ndim - 1))), n, o)

    return jax.tree.map(pick, new, old)


def stack_agents(tree: dict[str, Any], agents: tuple[str, ...], axis: int = 2):
    """`{agent: [g, e, ...]}` -> `[g, e, len(agents), ...]` (agents of one policy)."""
    return jnp.stack([tree[a] for a in agents], axis=axis)


def next_policy_state(
    state: dict[str, jax.Array],
    carry: dict[str, jax.Array],
    transition: dict[str, jax.Array],
    done: jax.Array,
) -> dict[str, jax.Array]:
    """A recurrent policy's state for the next step (fields `[g, e, agents, ...]`): the cell's
    state after this step (`carry`'s `state_out_i`), this step's action and (clipped) reward
    as the previous ones, all zero where the episode ended (`done [g, e]`)."""
    nxt = {
        k: carry[k.replace("state_in_", "state_out_")] for k in state if k.startswith("state_in_")
    }
    if sb.PREV_ACTIONS in state:
        nxt[sb.PREV_ACTIONS] = transition[sb.ACTIONS]
    if sb.PREV_REWARDS in state:
        nxt[sb.PREV_REWARDS] = transition[sb.REWARDS]

    def reset(x):
        return jnp.where(done.reshape(*done.shape, *([1] * (x.ndim - 2))), jnp.zeros_like(x), x)

    return {k: reset(nxt[k]).astype(state[k].dtype) for k in state}


@struct.dataclass
class StepKeys:
    """The keys one env step of the local groups draws from: per policy its action keys
    (`[local groups]`, one per group) and the envs' keys (`[local groups, envs]`)."""

    act: dict[str, jax.Array]
    env: jax.Array


def step_keys(workers: WorkerSet, key: jax.Array, axis_name: str | None) -> StepKeys:
    """The keys of the env step drawn from `key`: split for all groups (and envs), then
    sliced to this device's groups (`axis_name`). `vmap` it over a segment's step keys to
    derive them all before a `scan` (the same keys)."""
    groups, envs = workers.num_actor_groups, workers.num_envs_per_worker
    k_act, k_env = jax.random.split(key)
    act = {}
    for i, pid in enumerate(workers.policy_agents):
        k_pol = k_act if i == 0 else jax.random.fold_in(k_act, i)
        act[pid] = devices.local_slice(jax.random.split(k_pol, groups), axis_name)
    env_keys = jax.random.split(k_env, groups * envs).reshape(groups, envs, -1)
    return StepKeys(act=act, env=devices.local_slice(env_keys, axis_name))


def step_envs(
    workers: WorkerSet,
    params: dict[str, Any],
    actors: ActorState,
    key: jax.Array | StepKeys,
    axis_name: str | None,
    *,
    per_group: bool = False,
    active: jax.Array | None = None,
    explore: bool = True,
    filters: dict[str, MeanStd] | None = None,
) -> tuple[ActorState, dict[str, dict[str, jax.Array]], tuple[jax.Array, jax.Array, jax.Array]]:
    """Steps every env of the local groups once, every agent acting with its policy, drawing
    from `key` (a PRNG key, or the `StepKeys` that `step_keys` derives from one).

    `params` maps policy ids to their params, or with `per_group` to stacks
    `[local groups, ...]` (each group acts with its own snapshot). `active` (`[local groups]`
    bool) freezes the other groups: their env state, observations and episode counters stay.
    `explore=False` asks the policies for deterministic actions (evaluation). `filters`
    (`{policy_id: MeanStd}`, e.g. `PlanState.obs_filters`; None or `{}`: none) filters the
    observations the policies act on, frozen.

    Returns the new actor state, per policy the transition `{field: [groups, envs, agents of
    the policy, ...]}` (obs, new_obs (the final observation of a finished episode), both raw
    (unfiltered: the rollout stage filters what it stores), actions, rewards (clipped as
    `workers.clip_rewards` says), terminateds, truncateds and the policy's extras), and
    `(done [groups, envs], per-agent episode_return [groups, envs, num_agents] (raw rewards),
    episode_length)` for the episode windows (`done` is False for frozen groups).
    """
    env = workers.ma_env
    keys = key if isinstance(key, StepKeys) else step_keys(workers, key, axis_name)
    actions, transitions, carries = {}, {}, {}
    for pid, agents in workers.policy_agents.items():
        policy = workers.policies[pid]
        act_keys = keys.act[pid]
        obs = stack_agents(actors.obs, agents)  # [g, e, agents, ...]
        seen = filters[pid](obs) if filters else obs
        compute = policy.compute_actions
        if not explore:
            compute = functools.partial(compute, explore=False)
        if pid in actors.policy_states:  # recurrent: acts from its state, which the row keeps
            state = actors.policy_states[pid]
            act = jax.vmap(
                lambda p, o, k, s, c=compute: c(p, o, k, state=s),
                in_axes=(0 if per_group else None, 0, 0, 0),
            )
            pol_actions, extras = act(params[pid], seen, act_keys, state)
            carries[pid] = {k: extras.pop(k) for k in list(extras) if k.startswith("state_out_")}
            extras = {**extras, **state}
        else:
            act = jax.vmap(compute, in_axes=(0 if per_group else None, 0, 0))
            pol_actions, extras = act(params[pid], seen, act_keys)
        for j, agent in enumerate(agents):
            space = env.action_spaces[agent]
            actions[agent] = to_env_action(
                space, pol_actions[:, :, j], normalize_actions=workers.normalize_actions
            )
        transitions[pid] = {sb.OBS: obs, sb.ACTIONS: pol_actions, **extras}
    obs, env_state, reward, terminated, truncated, final_obs = vmap_envs(env.step)(
        keys.env, actors.env_state, actions
    )
    for pid, agents in workers.policy_agents.items():
        transitions[pid].update(
            {
                sb.NEXT_OBS: stack_agents(final_obs, agents),
                sb.REWARDS: clip_rewards(stack_agents(reward, agents), workers.clip_rewards),
                sb.TERMINATEDS: stack_agents(terminated, agents),
                sb.TRUNCATEDS: stack_agents(truncated, agents),
            }
        )
    # the episode ends for every agent at once (see jaxplan.multi_agent)
    first = workers.agents[0]
    done = terminated[first] | truncated[first]
    ep_return = actors.episode_return + stack_agents(reward, workers.agents)
    ep_length = actors.episode_length + 1
    new = {
        "env_state": env_state,
        "obs": obs,
        "episode_return": jnp.where(done[..., None], 0.0, ep_return),
        "episode_length": jnp.where(done, 0, ep_length),
        "policy_states": {
            pid: next_policy_state(state, carries[pid], transitions[pid], done)
            for pid, state in actors.policy_states.items()
        },
    }
    if active is not None:
        new = select_groups(active, new, {k: getattr(actors, k) for k in new})
        done = done & active[:, None]
    return actors.replace(**new), transitions, (done, ep_return, ep_length)
