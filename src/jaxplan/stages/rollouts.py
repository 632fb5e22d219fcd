"""ParallelRollouts: actor groups x envs stepped with `vmap`, fragments collected with `scan`."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxplan import batch as sb
from jaxplan import devices
from jaxplan.batch import MultiAgentBatch
from jaxplan.flow import Flow
from jaxplan.stages.acting import step_envs
from jaxplan.stages.async_rollouts import AsyncRollouts
from jaxplan.stages.episodes import count_sampled, record_episodes
from jaxplan.workers import PlanState, WorkerSet

MODES = ("bulk_sync", "async")

def ParallelRollouts(  # noqa: N802
    workers: WorkerSet, mode: str = "bulk_sync", num_async: int = 1
) -> Flow:
    """A flow of rollout rounds, each a postprocessed `MultiAgentBatch` (rows time-major).

    `bulk_sync`: every actor group acts with the current params of its policy; each round
    yields `num_workers x num_envs_per_worker x rollout_fragment_length` env steps, with zero
    policy lag.

    `async` (RLlib's "whichever worker finishes first", made deterministic): staggered actor
    groups, each acting with its own parameter snapshot. Every round all groups advance
    `rollout_fragment_length / groups` steps, exactly one group completes its fragment, which
    is emitted (`num_envs_per_worker x rollout_fragment_length` rows), and only that group then
    takes the newest params — `num_async - 1` rounds late when `num_async > 1` — so fragments
    are `groups - 1 + num_async - 1` updates stale when one round feeds each train step. On a
    device mesh each device staggers its own groups (one fragment per device per round).
    """
    if mode not in MODES:
        raise ValueError(f"ParallelRollouts mode {mode!r} is not supported; valid modes: {MODES}")
    if mode == "async":
        rollouts = AsyncRollouts(workers, num_async)
        return Flow(workers, rollouts.round, inits=(rollouts.init,))
    if num_async != 1:
        raise ValueError(f"num_async={num_async} only applies to mode='async'")
    return Flow(workers, lambda state: sample_round(workers, state))


def sample_round(workers: WorkerSet, state: PlanState) -> tuple[PlanState, MultiAgentBatch]:
    """One bulk-synchronous round: `[T, groups, envs]` env steps; each policy's batch holds its
    agents' rows (`[T, groups, envs, agents]` flattened), postprocessed with its params.

    On a mesh each device steps its `local_groups`; the emitted batch holds this device's rows
    (`shard_axis` set), and the episode window records every device's episodes in the order
    one device would.
    """
    axis = workers.axis_name
    key, k_round = jax.random.split(state.key)
    params = {pid: ps.params for pid, ps in state.policies.items()}

    def env_step(actors, key_t):
        actors, transitions, episodes = step_envs(workers, params, actors, key_t, axis)
        return actors, (transitions, episodes)

    actors, (trajs, episodes) = jax.lax.scan(
        env_step, state.actors, jax.random.split(k_round, workers.rollout_fragment_length)
    )
    rows = workers.round_env_steps
    local_steps = rows // workers.num_shards
    batches = {}
    for pid, traj in trajs.items():
        policy, pstate = workers.policies[pid], state.policies[pid]
        traj = policy.postprocess_trajectory(pstate.params, pstate.hparams, traj)
        traj[sb.POLICY_VERSION] = jnp.broadcast_to(pstate.version, traj[sb.REWARDS].shape)
        n = local_steps * workers.rows_per_env_step(pid)
        batches[pid] = jax.tree.map(lambda x, n=n: x.reshape(n, *x.shape[4:]), traj)
    state = state.replace(actors=actors, key=key)
    state = record_episodes(workers, state, devices.gather(episodes, axis, axis=1))
    state = count_sampled(workers, state, rows)
    batch = MultiAgentBatch(batches, env_steps=rows, shard_axis=axis, num_shards=workers.num_shards)
    return state, batch
