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
  With `broadcast_interval` (IMPALA, APPO: RLlib's `BroadcastUpdateLearnerWeights`) the params
  a group takes are the last *broadcast* weights instead of the newest: see `Rollouts`.

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
from jaxplan.fast_rng import unrolled_here
from jaxplan.filters import MeanStd, moments
from jaxplan.flow import Flow, Stage
from jaxplan.policy import acting_params
from jaxplan.stages.acting import select_groups, step_envs, step_keys
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
class BroadcastState:
    """RLlib's `BroadcastUpdateLearnerWeights` state (replicated): per policy the weights last
    broadcast (`{}` with `broadcast_interval` 1: they are always the newest) and their version
    (int32); the fragments returned since that broadcast (RLlib's `steps_since_broadcast`)
    and the number of broadcasts (RLlib's `num_weight_broadcasts` counter), int32."""

    params: dict[str, Any]
    version: dict[str, jax.Array]
    since: jax.Array
    num_weight_broadcasts: jax.Array


@struct.dataclass
class RolloutState:
    """Async rollouts' own state: the staggered groups and, with `num_async = k > 1`, the
    `(params, version)` delivered in each of the last `k - 1` rounds (oldest first, leading
    dim `[k - 1]`, replicated; `{}` for `k = 1`); with `broadcast_interval`, the
    `BroadcastState` (`{}` without)."""

    groups: StaggeredGroups
    queue: dict[str, Any]
    broadcast: BroadcastState | dict


def ParallelRollouts(  # noqa: N802 - RLlib's name
    workers: WorkerSet,
    *,
    mode: str = "bulk_sync",
    num_async: int = 1,
    broadcast_interval: int | None = None,
) -> Flow:
    """A flow of rollout rounds, each a postprocessed `MultiAgentBatch` (rows time-major):
    `bulk_sync` yields `num_workers x num_envs_per_worker x rollout_fragment_length` env steps
    per round, `async` one fragment (`num_envs_per_worker x rollout_fragment_length`) per
    device (see the module docstring). `broadcast_interval` (async only): the groups take the
    weights RLlib's `BroadcastUpdateLearnerWeights` would send them (`Rollouts`)."""
    return Flow.source(
        Rollouts(workers, mode=mode, num_async=num_async, broadcast_interval=broadcast_interval)
    )


class Rollouts(Stage):
    """The rollout stage behind `ParallelRollouts` (a flow source: it ignores its item).

    `broadcast_interval = n` (async; IMPALA's and APPO's key) applies RLlib 1.x's
    `BroadcastUpdateLearnerWeights` to the params a group takes when it starts a fragment:
    RLlib keeps the weights it last broadcast and sends them to every worker that returns a
    batch; it counts the returned batches (one counter for all workers) and, once `n` were
    returned since the last broadcast *and* the learner has updated the weights since,
    broadcasts the learner's current weights (counter reset, `num_weight_broadcasts` + 1).
    Here a returned batch is a completed fragment, and the rule runs when the groups that
    returned one start the next: `since` (fragments returned since the last broadcast) `>= n`
    and some policy's version differs from the broadcast one. The `num_devices` fragments of
    one round are handled together (one decision per round; on one device exactly RLlib's
    sequence). `n = 1` delivers the newest params as without it, and counts the broadcasts;
    `n > 1` keeps each set of weights for about `n` deliveries (policy lag up to `n - 1`
    updates more). `None`: no broadcast bookkeeping (PPO's async rollouts)."""

    name = "parallel_rollouts"

    def __init__(
        self,
        workers: WorkerSet,
        *,
        mode: str = "bulk_sync",
        num_async: int = 1,
        broadcast_interval: int | None = None,
    ):
        if mode not in ROLLOUT_MODES:
            raise ValueError(
                f"ParallelRollouts mode {mode!r} is not supported; valid modes: {ROLLOUT_MODES}"
            )
        if isinstance(num_async, bool) or not isinstance(num_async, int) or num_async < 1:
            raise ValueError(f"num_async must be an integer >= 1, got {num_async!r}")
        if mode == "bulk_sync" and num_async != 1:
            raise ValueError(f"num_async={num_async} only applies to mode='async'")
        if broadcast_interval is not None and (
            isinstance(broadcast_interval, bool)
            or not isinstance(broadcast_interval, int)
            or broadcast_interval < 1
        ):
            raise ValueError(
                f"broadcast_interval must be an integer >= 1, got {broadcast_interval!r}"
            )
        if mode == "bulk_sync" and broadcast_interval is not None:
            raise ValueError("broadcast_interval only applies to mode='async'")
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
        self.broadcast_interval = broadcast_interval
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
        broadcast = {}
        if self.broadcast_interval is not None:  # RLlib's: the initial weights, not counted
            zero = jnp.zeros((), jnp.int32)
            broadcast = BroadcastState(
                params={}
                if self.broadcast_interval == 1
                else {pid: ps.params for pid, ps in state.policies.items()},
                version={pid: ps.version for pid, ps in state.policies.items()},
                since=zero,
                num_weight_broadcasts=zero,
            )
        return state, RolloutState(groups=staggered, queue=queue, broadcast=broadcast)

    def partition_spec(self) -> RolloutState:
        return RolloutState(groups=P(AXIS), queue=P(), broadcast=P())

    def metrics(self, state: PlanState, rs: RolloutState | None) -> dict:
        """`info.actor_group_versions`: per policy the params version each actor group acts
        with (`int32 [num_actor_groups]`, all devices' groups; bulk_sync: the newest); with
        `broadcast_interval`, `info.num_weight_broadcasts` (RLlib's counter)."""
        if rs is None:
            groups = self.workers.num_actor_groups
            versions = {pid: jnp.full((groups,), ps.version) for pid, ps in state.policies.items()}
        else:
            versions = devices.gather(rs.groups.version, self.workers.axis_name)
        info = {"actor_group_versions": versions}
        if rs is not None and isinstance(rs.broadcast, BroadcastState):
            info["num_weight_broadcasts"] = rs.broadcast.num_weight_broadcasts
        return {"info": info}

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
            if isinstance(rs.broadcast, BroadcastState):  # one fragment returned per device
                since = rs.broadcast.since + workers.num_shards
                rs = rs.replace(broadcast=rs.broadcast.replace(since=since))
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

    def _broadcast(self, state: PlanState, rs: RolloutState) -> tuple[RolloutState, dict]:
        """RLlib's `BroadcastUpdateLearnerWeights` for the groups starting a fragment (see
        `Rollouts`): the new `RolloutState` and per policy the `(acting params, version)` the
        groups are sent (without `broadcast_interval`: the newest)."""
        bs = rs.broadcast
        if not isinstance(bs, BroadcastState):
            return rs, {
                pid: (self._acting(state, pid), ps.version) for pid, ps in state.policies.items()
            }
        updated = jnp.any(
            jnp.stack([ps.version != bs.version[pid] for pid, ps in state.policies.items()])
        )
        now = updated & (bs.since >= self.broadcast_interval)
        bs = bs.replace(
            version={
                pid: jnp.where(now, ps.version, bs.version[pid])
                for pid, ps in state.policies.items()
            },
            since=jnp.where(now, 0, bs.since),
            num_weight_broadcasts=bs.num_weight_broadcasts + now.astype(jnp.int32),
        )
        if self.broadcast_interval == 1:  # the broadcast weights are the newest
            sent = {
                pid: (self._acting(state, pid), ps.version) for pid, ps in state.policies.items()
            }
            return rs.replace(broadcast=bs), sent
        bs = bs.replace(
            params={
                pid: jax.tree.map(lambda n, o: jnp.where(now, n, o), ps.params, bs.params[pid])
                for pid, ps in state.policies.items()
            }
        )
        timestep = state.counters.num_steps_sampled.to_float()
        sent = {  # RLlib sends the current global vars (timestep) with the kept weights
            pid: (
                acting_params(
                    self.workers.policies[pid], ps.replace(params=bs.params[pid]), timestep
                ),
                bs.version[pid],
            )
            for pid, ps in state.policies.items()
        }
        return rs.replace(broadcast=bs), sent

    def _deliver(self, state: PlanState, rs: RolloutState) -> RolloutState:
        """Groups starting a fragment take the params sent to them (`_broadcast`: the newest,
        or the last broadcast ones); with `num_async = k > 1` the ones sent `k - 1` rounds
        ago (the queue then takes this round's)."""
        rs, sent = self._broadcast(state, rs)
        queue, delivered = dict(rs.queue), {}
        for pid in state.policies:
            if self.num_async > 1:
                delivered[pid] = jax.tree.map(lambda q: q[0], queue[pid])
                queue[pid] = jax.tree.map(
                    lambda q, n: jnp.concatenate([q[1:], n[None]]), queue[pid], sent[pid]
                )
            else:
                delivered[pid] = sent[pid]
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
        return rs.replace(groups=groups, queue=queue)

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

        # every step's keys derived at once (the same keys as step by step; see step_keys),
        # the env steps' many small hashes lowered unrolled on the CPU (jaxplan.fast_rng)
        with unrolled_here():
            keys = jax.vmap(lambda k: step_keys(self.workers, k, axis))(
                jax.random.split(key, self.segment)
            )
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
