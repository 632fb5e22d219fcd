"""ParallelRollouts: one rollout engine, two schedules of its actor groups.

Actor groups x envs are stepped with `vmap` and collected over time with `scan`. Each group
fills a fragment of `T = rollout_fragment_length` steps; a fragment is emitted, postprocessed
with the newest params (the ones it is about to be trained with), when it is full.

- `bulk_sync` (RLlib's PPO): one segment of `T` steps per round; every group acts with the
  newest params and every group's fragment is emitted each round (zero policy lag). The stage
  keeps no state of its own.
- `async` (RLlib's "whichever worker finishes first", made deterministic as staggered actor
  groups): `g` groups per device, every round each advances `S = T / g` steps with its own
  params snapshot, so every env steps every round. Group `j` starts `j` segments into its
  fragment (`init` pre-rolls it), so exactly one group per device completes each round; that
  fragment is emitted and only that group then takes the newest params — the params newest
  `num_async - 1` rounds earlier with `num_async > 1` (RLlib's requests in flight per worker).
  Fragments are `g - 1 + num_async - 1` train steps stale when one round feeds each step. The
  snapshots, fragment buffers and the params queue are the stage's state (`RolloutState`).

Randomness is drawn per global actor group (`jaxplan.stages.acting`), so the data do not
depend on how the groups are spread over devices. On a mesh each device's rows are its own
groups' steps, time-major; the batch's `time_steps = T` lets `TrainOneStep` gather them in the
one-device order (bulk_sync: exactly the rows of one device; async: the devices' fragments side
by side like the groups of one round — async emits one fragment per device per round, so its
data and lag depend on the number of devices).

Observation filter (`WorkerSet.observation_filter="MeanStdFilter"`, `jaxplan.filters`): every
group acts during a round (or async segment) with the statistics `PlanState.obs_filters` as
they were at its start, and the batch holds the observations filtered with them (`obs` and
`new_obs`); then the statistics are merged with the moments of every raw observation the envs
returned in the round (each step's `new_obs`, and the reset observation where an episode
ended), summed over all devices, so every device and host holds the same statistics. RLlib
updates each worker's own filter observation by observation and synchronises the workers
once per training iteration (`FilterManager.synchronize`); here all groups share one filter,
synchronised every round: deterministic and independent of the device layout.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import PartitionSpec as P

from jaxplan import batch as sb
from jaxplan import devices
from jaxplan.batch import MultiAgentBatch
from jaxplan.devices import AXIS
from jaxplan.filters import MeanStd, moments
from jaxplan.flow import Flow, Stage
from jaxplan.policy import acting_params
from jaxplan.stages.acting import select_groups, step_envs
from jaxplan.workers import PlanState, WorkerSet

ROLLOUT_MODES = ("bulk_sync", "async")


@struct.dataclass
class StaggeredGroups:
    """Per actor group (leading dim `[groups]`, split across devices): the params it acts
    with and their version, the fragment it is filling and how many of its steps are filled."""

    params: dict[str, Any]  # {policy_id: params}, leaves [groups, ...]
    version: dict[str, jax.Array]  # {policy_id: int32 [groups]}
    fragment: dict[str, dict[str, jax.Array]]  # {policy_id: {field: [groups, T, envs, ...]}}
    fill: jax.Array  # int32 [groups]


@struct.dataclass
class RolloutState:
    """Async rollouts' own state: the staggered groups and, with `num_async = k > 1`, the
    `(params, version)` newest in each of the last `k - 1` rounds (oldest first, leading dim
    `[k - 1]`, replicated); `{}` for `k = 1`."""

    groups: StaggeredGroups
    queue: dict[str, Any]


def ParallelRollouts(  # noqa: N802 - RLlib's name
    workers: WorkerSet, *, mode: str = "bulk_sync", num_async: int = 1
) -> Flow:
    """A flow of rollout rounds, each a postprocessed `MultiAgentBatch` (rows time-major):
    `bulk_sync` yields `num_workers x num_envs_per_worker x rollout_fragment_length` env steps
    per round, `async` one fragment (`num_envs_per_worker x rollout_fragment_length`) per
    device (see the module docstring)."""
    return Flow.source(Rollouts(workers, mode=mode, num_async=num_async))


class Rollouts(Stage):
    """The rollout stage behind `ParallelRollouts` (a flow source: it ignores its item)."""

    name = "parallel_rollouts"

    def __init__(self, workers: WorkerSet, *, mode: str = "bulk_sync", num_async: int = 1):
        if mode not in ROLLOUT_MODES:
            raise ValueError(
                f"ParallelRollouts mode {mode!r} is not supported; valid modes: {ROLLOUT_MODES}"
            )
        if isinstance(num_async, bool) or not isinstance(num_async, int) or num_async < 1:
            raise ValueError(f"num_async must be an integer >= 1, got {num_async!r}")
        if mode == "bulk_sync" and num_async != 1:
            raise ValueError(f"num_async={num_async} only applies to mode='async'")
        g, t = workers.local_groups, workers.rollout_fragment_length
        if mode == "async" and t % g:
            where = f" per device ({workers.num_shards} devices)" if workers.num_shards > 1 else ""
            raise ValueError(
                f"mode='async': rollout_fragment_length ({t}) must be a multiple of the number "
                f"of actor groups{where} ({g}): every round each group advances T / groups "
                f"steps; use e.g. rollout_fragment_length={-(-t // g) * g}"
            )
        self.workers = workers
        self.staggered = mode == "async"
        self.num_async = num_async
        self.phases = g if self.staggered else 1  # groups completing at different rounds
        self.segment = t // self.phases

    # ---- state ----------------------------------------------------------------------------
    def init(self, state: PlanState) -> tuple[PlanState, RolloutState | None]:
        """Async: every group's snapshot of the initial params, empty fragments, and the
        pre-roll that staggers the groups by one segment (all groups, one device view)."""
        if not self.staggered:
            return state, None
        workers = self.workers
        groups, g, t = (
            workers.num_actor_groups,
            workers.local_groups,
            workers.rollout_fragment_length,
        )
        snapshots = {pid: _stack(self._acting(state, pid), groups) for pid in state.policies}
        _, (transitions, _, _) = jax.eval_shape(
            lambda actors, key: self._step(
                state.obs_filters, snapshots, actors, key, None, per_group=True
            ),
            state.actors,
            state.key,
        )
        staggered = StaggeredGroups(
            params=snapshots,
            version={pid: jnp.full((groups,), ps.version) for pid, ps in state.policies.items()},
            fragment={
                pid: {k: jnp.zeros((groups, t, *v.shape[1:]), v.dtype) for k, v in tr.items()}
                for pid, tr in transitions.items()
            },
            fill=jnp.zeros((groups,), jnp.int32),
        )
        queue = {}
        if self.num_async > 1:
            queue = {
                pid: _stack((self._acting(state, pid), ps.version), self.num_async - 1)
                for pid, ps in state.policies.items()
            }
        phase = jnp.arange(groups) % g  # the group's index on its device

        def pre_roll(carry, index):
            state, staggered = carry
            key, k_seg = jax.random.split(state.key)
            active = phase > index  # group j pre-rolls j segments
            actors, segment, episodes, observed = self._advance(
                state, staggered.params, k_seg, None, per_group=True, active=active
            )
            staggered = staggered.replace(
                fragment=_write(staggered.fragment, segment, staggered.fill),
                fill=staggered.fill + self.segment * active.astype(jnp.int32),
            )
            state = _record_episodes(workers, state.replace(actors=actors, key=key), episodes)
            return (_update_filters(state, observed), staggered), None

        (state, staggered), _ = jax.lax.scan(pre_roll, (state, staggered), jnp.arange(g - 1))
        return state, RolloutState(groups=staggered, queue=queue)

    def partition_spec(self) -> RolloutState:
        return RolloutState(groups=P(AXIS), queue=P())

    def metrics(self, state: PlanState, rs: RolloutState | None) -> dict:
        """`info.actor_group_versions`: per policy the params version each actor group acts
        with (`int32 [num_actor_groups]`, all devices' groups; bulk_sync: the newest)."""
        if rs is None:
            groups = self.workers.num_actor_groups
            versions = {pid: jnp.full((groups,), ps.version) for pid, ps in state.policies.items()}
        else:
            versions = devices.gather(rs.groups.version, self.workers.axis_name)
        return {"info": {"actor_group_versions": versions}}

    # ---- one round ------------------------------------------------------------------------
    def apply(self, state: PlanState, rs: RolloutState | None, item: Any = None):
        """One round: the groups starting a fragment take their params, every group advances
        one segment, the completed fragments (every policy's part) are emitted."""
        workers = self.workers
        axis, t = workers.axis_name, workers.rollout_fragment_length
        key, k_round = jax.random.split(state.key)
        if rs is None:  # bulk_sync: everyone acts with the newest params, fragments complete
            params = {pid: self._acting(state, pid) for pid in state.policies}
            actors, traj, episodes, observed = self._advance(state, params, k_round, axis)
            acted = {pid: ps.version for pid, ps in state.policies.items()}
        else:
            rs = self._deliver(state, rs)
            staggered = rs.groups
            actors, segment, episodes, observed = self._advance(
                state, staggered.params, k_round, axis, per_group=True
            )
            fill = staggered.fill + self.segment
            done_group = jnp.argmax(fill == t)  # one per device
            fragment = _write(staggered.fragment, segment, staggered.fill)
            traj = jax.tree.map(lambda b: b[done_group], fragment)  # [T, envs, agents, ...]
            acted = {pid: v[done_group] for pid, v in staggered.version.items()}
            rs = rs.replace(
                groups=staggered.replace(fragment=fragment, fill=jnp.where(fill == t, 0, fill))
            )
        emitted_groups = workers.local_groups // self.phases
        local_steps = emitted_groups * workers.num_envs_per_worker * t
        batches = {}
        for pid, fragment in traj.items():
            policy, pstate = workers.policies[pid], state.policies[pid]
            fragment = policy.postprocess_trajectory(pstate.params, pstate.hparams, fragment)
            lead = fragment[sb.REWARDS].ndim  # [T, (groups,) envs, agents]
            fragment[sb.POLICY_VERSION] = jnp.broadcast_to(acted[pid], fragment[sb.REWARDS].shape)
            n = local_steps * workers.rows_per_env_step(pid)
            batches[pid] = jax.tree.map(lambda x, n=n, d=lead: x.reshape(n, *x.shape[d:]), fragment)
        rows = local_steps * workers.num_shards
        state = state.replace(actors=actors, key=key)
        state = _record_episodes(workers, state, devices.gather(episodes, axis, axis=1))
        state = _update_filters(_count_sampled(workers, state, rows), observed)
        batch = MultiAgentBatch(
            batches, env_steps=rows, shard_axis=axis, num_shards=workers.num_shards, time_steps=t
        )
        return state, rs, batch

    def _acting(self, state: PlanState, pid: str) -> Any:
        """Policy `pid`'s params to act with now (`jaxplan.policy.acting_params`)."""
        timestep = state.counters.num_steps_sampled.to_float()
        return acting_params(self.workers.policies[pid], state.policies[pid], timestep)

    def _deliver(self, state: PlanState, rs: RolloutState) -> RolloutState:
        """Groups starting a fragment take the newest params (or, with `num_async = k > 1`,
        the ones newest `k - 1` rounds ago; the queue then takes the newest)."""
        queue, delivered = dict(rs.queue), {}
        for pid, ps in state.policies.items():
            newest = (self._acting(state, pid), ps.version)
            if self.num_async > 1:
                delivered[pid] = jax.tree.map(lambda q: q[0], queue[pid])
                queue[pid] = jax.tree.map(
                    lambda q, n: jnp.concatenate([q[1:], n[None]]), queue[pid], newest
                )
            else:
                delivered[pid] = newest
        groups = rs.groups
        starting = groups.fill == 0
        groups = groups.replace(
            params={
                pid: select_groups(starting, delivered[pid][0], groups.params[pid])
                for pid in state.policies
            },
            version={
                pid: jnp.where(starting, delivered[pid][1], groups.version[pid])
                for pid in state.policies
            },
        )
        return RolloutState(groups=groups, queue=queue)

    def _advance(self, state, params, key, axis, *, per_group=False, active=None):
        """Every (local) group steps `segment` times from `state.actors` with `params` (per
        policy; stacked per group with `per_group`) and the frozen `state.obs_filters`.
        Returns the actors, the steps per policy `{field: [S, groups, envs, agents, ...]}`
        (observations filtered), the episode ends `[S, groups, envs]` and the moments of the
        raw new observations per policy (summed over `axis`; `{}` without a filter)."""
        filters = state.obs_filters

        def body(actors, key_t):
            actors, out = self._step(
                filters, params, actors, key_t, axis, per_group=per_group, active=active
            )
            return actors, out

        keys = jax.random.split(key, self.segment)
        actors, (steps, episodes, observed) = jax.lax.scan(body, state.actors, keys)
        observed = {  # [S, 2, groups, envs, agents, *obs_shape]
            pid: moments(obs, weight, axis, batch_ndim=weight.ndim)
            for pid, (obs, weight) in observed.items()
        }
        return actors, steps, episodes, observed

    def _step(self, filters, params, actors, key, axis, *, per_group=False, active=None):
        """One env step of the local groups (`step_envs`); with `filters`, the stored `obs` and
        `new_obs` filtered with them, and per policy the raw new observations with their
        weights `([2, groups, envs, agents, *obs_shape], [2, groups, envs, agents])`: every
        `new_obs` of an active group, then the reset observation where its episode ended."""
        new, transitions, episodes = step_envs(
            self.workers,
            params,
            actors,
            key,
            axis,
            per_group=per_group,
            active=active,
            filters=filters,
        )
        observed = {}
        if filters:
            done = episodes[0]  # [g, e], False for frozen groups
            stepped = (
                jnp.ones_like(done)
                if active is None
                else jnp.broadcast_to(active[:, None], done.shape)
            )
            for pid, agents in self.workers.policy_agents.items():
                tr = transitions[pid]
                reset = jnp.stack([new.obs[a] for a in agents], axis=2)
                weight = jnp.stack([stepped, done]).astype(jnp.float32)  # [2, g, e]
                weight = jnp.broadcast_to(weight[..., None], (*weight.shape, len(agents)))
                observed[pid] = (jnp.stack([tr[sb.NEXT_OBS], reset]), weight)
                tr[sb.OBS] = filters[pid](tr[sb.OBS])
                tr[sb.NEXT_OBS] = filters[pid](tr[sb.NEXT_OBS])
        return new, (transitions, episodes, observed)


def _stack(tree, n: int):
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (n, *jnp.shape(x))), tree)


def _write(fragment, steps, fill):
    """Writes each group's steps `[S, groups, ...]` into its buffer `[groups, T, ...]` at its
    `fill` (`[groups]`)."""

    def write(buffer, new):
        new = jnp.swapaxes(new, 0, 1)
        return jax.vmap(lambda b, s, f: jax.lax.dynamic_update_slice_in_dim(b, s, f, 0))(
            buffer, new, fill
        )

    return jax.tree.map(write, fragment, steps)


def _record_episodes(workers: WorkerSet, state: PlanState, episodes) -> PlanState:
    """Adds the episodes that ended (`done`, per-agent returns, lengths; `[T, groups, envs]`
    from every device, chronological in row-major order) to the team window (returns summed
    over all agents, RLlib's `episode_reward`) and, multi-agent, to each policy's window (summed
    over that policy's agents, RLlib's `policy_reward_*`)."""
    done, ep_return, ep_length = episodes
    state = state.replace(episodes=state.episodes.record(done, ep_return.sum(-1), ep_length))
    windows = {}
    for pid, window in state.policy_episodes.items():
        idx = jnp.asarray([workers.agents.index(a) for a in workers.policy_agents[pid]])
        windows[pid] = window.record(done, ep_return[..., idx].sum(-1), ep_length)
    return state.replace(policy_episodes=windows)


def _update_filters(state: PlanState, observed: dict[str, MeanStd]) -> PlanState:
    """`state.obs_filters` merged with the moments of the round's raw observations."""
    if not observed:
        return state
    merged = {pid: f.merge(observed[pid]) for pid, f in state.obs_filters.items()}
    return state.replace(obs_filters=merged)


def _count_sampled(workers: WorkerSet, state: PlanState, env_steps: int) -> PlanState:
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
