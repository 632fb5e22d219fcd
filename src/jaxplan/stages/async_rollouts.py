"""ParallelRollouts(mode="async"): staggered actor groups with their own parameter snapshots.

RLlib's async rollouts hand the learner whichever worker's batch is ready first and let that
worker go on with the weights it has; the order depends on timing, so no run can be replayed.
Here the same staleness is built into the state, deterministically:

- `g` actor groups per device; every round each group advances `S = T / g` steps
  (`T = rollout_fragment_length`), acting with its own params snapshot, so every env steps
  every round.
- The groups' fragments are offset by `S` steps (`init` pre-rolls group `j` by `j S` steps
  with the initial params), so exactly one group per device completes its `T`-step fragment
  each round. That fragment is emitted and postprocessed with the newest params (the ones it
  is about to be trained with).
- A group starting a new fragment takes the newest params; with `num_async = k > 1` it takes
  the params that were newest `k - 1` rounds earlier (RLlib's `k` requests in flight per
  worker). Fragments are `g - 1 + k - 1` train steps stale when one round feeds each step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxplan import batch as sb
from jaxplan import devices
from jaxplan.batch import MultiAgentBatch
from jaxplan.stages.acting import select_groups, step_envs
from jaxplan.stages.episodes import count_sampled, record_episodes
from jaxplan.workers import PlanState, WorkerSet


def _stack(tree, n: int):
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (n, *jnp.shape(x))), tree)


class AsyncRollouts:
    """The state initializer and the round function of async rollouts (see module doc)."""

    def __init__(self, workers: WorkerSet, num_async: int = 1):
        if isinstance(num_async, bool) or not isinstance(num_async, int) or num_async < 1:
            raise ValueError(f"num_async must be an integer >= 1, got {num_async!r}")
        g, t = workers.local_groups, workers.rollout_fragment_length
        if t % g:
            where = f" per device ({workers.num_shards} devices)" if workers.num_shards > 1 else ""
            raise ValueError(
                f"mode='async': rollout_fragment_length ({t}) must be a multiple of the number "
                f"of actor groups{where} ({g}): every round each group advances T / groups "
                f"steps; use e.g. rollout_fragment_length={-(-t // g) * g}"
            )
        self.workers = workers
        self.num_async = num_async
        self.segment = t // g

    # ---- state ------------------------------------------------------------------------------
    def init(self, state: PlanState) -> PlanState:
        """Adds per-group snapshots, versions, fragment buffers and fill, and pre-rolls the
        groups so their fragments are staggered by one segment (all groups, one device view)."""
        workers = self.workers
        groups, g, seg = workers.num_actor_groups, workers.local_groups, self.segment
        t = workers.rollout_fragment_length
        snapshots = {pid: _stack(ps.params, groups) for pid, ps in state.policies.items()}

        def one_step(actors, key):
            return step_envs(workers, actors.params, actors, key, None, True)

        _, transitions, _ = jax.eval_shape(
            one_step, state.actors.replace(params=snapshots), state.key
        )
        fragment = {
            pid: {k: jnp.zeros((groups, t, *v.shape[1:]), v.dtype) for k, v in tr.items()}
            for pid, tr in transitions.items()
        }
        actors = state.actors.replace(
            params=snapshots,
            version={pid: jnp.full((groups,), ps.version) for pid, ps in state.policies.items()},
            fragment=fragment,
            fill=jnp.zeros((groups,), jnp.int32),
        )
        queue = None
        if self.num_async > 1:
            queue = {
                pid: _stack((ps.params, ps.version), self.num_async - 1)
                for pid, ps in state.policies.items()
            }
        state = state.replace(actors=actors, param_queue=queue)
        if g == 1:
            return state
        phase = jnp.arange(groups) % g  # the group's index on its device

        def pre_roll(state, index):
            key, k_seg = jax.random.split(state.key)
            active = phase > index  # group j pre-rolls j segments
            actors, episodes = self._advance(state.actors, k_seg, None, active)
            actors = actors.replace(fill=actors.fill + seg * active.astype(jnp.int32))
            state = record_episodes(workers, state.replace(actors=actors, key=key), episodes)
            return state, None

        state, _ = jax.lax.scan(pre_roll, state, jnp.arange(g - 1))
        return state

    def _advance(self, actors, key, axis, active=None):
        """All (local) groups step `segment` times with their snapshots; the steps are written
        into each group's fragment at its fill (fill itself is left to the caller)."""
        workers = self.workers

        def body(actors, key_t):
            actors, transitions, episodes = step_envs(
                workers, actors.params, actors, key_t, axis, True, active
            )
            return actors, (transitions, episodes)

        actors, (segment, episodes) = jax.lax.scan(
            body, actors, jax.random.split(key, self.segment)
        )  # segment leaves [S, groups, envs, ...]

        def write(buffer, steps):  # buffer [groups, T, envs, ...], steps [S, groups, envs, ...]
            steps = jnp.swapaxes(steps, 0, 1)
            return jax.vmap(lambda b, s, f: jax.lax.dynamic_update_slice_in_dim(b, s, f, 0))(
                buffer, steps, actors.fill
            )

        fragment = jax.tree.map(write, actors.fragment, segment)
        return actors.replace(fragment=fragment), episodes

    # ---- one round ------------------------------------------------------------------------
    def round(self, state: PlanState) -> tuple[PlanState, MultiAgentBatch]:
        """Delivers params to the groups starting a fragment, advances all groups one segment,
        emits the fragment each device completes (every policy's part of it)."""
        workers = self.workers
        axis, t = workers.axis_name, workers.rollout_fragment_length
        key, k_round = jax.random.split(state.key)
        actors = state.actors

        # 1. the params a group starting a fragment now receives
        queue = state.param_queue
        delivered = {}
        for pid, ps in state.policies.items():
            newest = (ps.params, ps.version)
            if self.num_async > 1:
                delivered[pid] = jax.tree.map(lambda q: q[0], queue[pid])
                pushed = jax.tree.map(
                    lambda q, n: jnp.concatenate([q[1:], n[None]]), queue[pid], newest
                )
                queue = {**queue, pid: pushed}
            else:
                delivered[pid] = newest
        starting = actors.fill == 0
        actors = actors.replace(
            params={
                pid: select_groups(starting, delivered[pid][0], actors.params[pid])
                for pid in state.policies
            },
            version={
                pid: jnp.where(starting, delivered[pid][1], actors.version[pid])
                for pid in state.policies
            },
        )

        # 2. every group advances one segment
        actors, episodes = self._advance(actors, k_round, axis)
        fill = actors.fill + self.segment

        # 3. the (one per device) completed fragment, postprocessed with the newest params
        done_group = jnp.argmax(fill == t)
        actors = actors.replace(fill=jnp.where(fill == t, 0, fill))
        local_steps = t * workers.num_envs_per_worker
        batches = {}
        for pid, frag in actors.fragment.items():
            policy, pstate = workers.policies[pid], state.policies[pid]
            traj = jax.tree.map(lambda b: b[done_group], frag)  # [T, envs, agents, ...]
            traj = policy.postprocess_trajectory(pstate.params, pstate.hparams, traj)
            acted = actors.version[pid][done_group]
            traj[sb.POLICY_VERSION] = jnp.broadcast_to(acted, traj[sb.REWARDS].shape)
            n = local_steps * workers.rows_per_env_step(pid)
            batches[pid] = jax.tree.map(lambda x, n=n: x.reshape(n, *x.shape[3:]), traj)

        rows = local_steps * workers.num_shards
        state = state.replace(actors=actors, param_queue=queue, key=key)
        state = record_episodes(workers, state, devices.gather(episodes, axis, axis=1))
        state = count_sampled(workers, state, rows)
        batch = MultiAgentBatch(
            batches, env_steps=rows, shard_axis=axis, num_shards=workers.num_shards
        )
        return state, batch
