"""The functional WorkerSet: a static description of actors and policies, and `PlanState`,
the one pytree that holds everything a plan changes.

RLlib keeps this state inside Ray actors; jaxplan keeps it in `PlanState`, so a checkpoint is
`PlanState` and `vmap` over `init(key)` gives independent runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxplan.counters import Counter
from jaxplan.devices import AXIS
from jaxplan.envs import Env
from jaxplan.filters import MeanStd, check_clip_rewards, check_observation_filter, moments
from jaxplan.multi_agent import as_multi_agent
from jaxplan.policy import Policy, PolicyState


@struct.dataclass
class ActorState:
    """Every actor group's envs; leaves have leading dims `[num_workers, num_envs_per_worker]`:
    `obs` is `{agent_id: [groups, envs, *obs_shape]}`, `episode_return` is per agent
    `[groups, envs, num_agents]` (in `WorkerSet.agents` order), `episode_length` `[groups, envs]`.
    `policy_states` holds per recurrent policy the state its agents act from next, `{field:
    [groups, envs, agents of the policy, ...]}` (`Policy.initial_state`; zero at an episode's
    start); `{}` without recurrent policies.
    """

    env_state: Any
    obs: dict[str, jax.Array]
    episode_return: jax.Array
    episode_length: jax.Array
    policy_states: dict[str, dict[str, jax.Array]] = struct.field(default_factory=dict)


@struct.dataclass
class EpisodeWindow:
    """The last `window` completed episodes (a ring buffer, NaN where empty), on device."""

    returns: jax.Array  # [window] float32
    lengths: jax.Array  # [window] float32
    num_episodes: jax.Array  # int32, total completed so far
    episodes_this_iter: jax.Array  # int32, reset by StandardMetricsReporting

    @classmethod
    def empty(cls, window: int) -> EpisodeWindow:
        nan = jnp.full((window,), jnp.nan, jnp.float32)
        zero = jnp.zeros((), jnp.int32)
        return cls(returns=nan, lengths=nan, num_episodes=zero, episodes_this_iter=zero)

    def record(self, done: jax.Array, returns: jax.Array, lengths: jax.Array) -> EpisodeWindow:
        """Appends the episodes that ended where `done` (any shape, chronological in row-major
        order) with their `returns` and `lengths`; only the newest `window` are kept."""
        window = self.returns.shape[0]
        done = done.reshape(-1)
        rank = jnp.cumsum(done.astype(jnp.int32)) - 1  # order among this call's episodes
        n = jnp.sum(done.astype(jnp.int32))
        keep = done & (rank >= n - window)
        pos = jnp.where(keep, (self.num_episodes + rank) % window, window)  # window = dropped
        return EpisodeWindow(
            returns=self.returns.at[pos].set(returns.reshape(-1), mode="drop"),
            lengths=self.lengths.at[pos].set(lengths.reshape(-1).astype(jnp.float32), mode="drop"),
            num_episodes=self.num_episodes + n,
            episodes_this_iter=self.episodes_this_iter + n,
        )


@struct.dataclass
class Counters:
    """RLlib's step counters (64-bit safe) and the iteration number."""

    num_steps_sampled: Counter
    num_agent_steps_sampled: Counter
    num_steps_trained: Counter
    num_agent_steps_trained: Counter
    training_iteration: jax.Array  # int32

    @classmethod
    def zero(cls) -> Counters:
        z = Counter.zero()
        return cls(z, z, z, z, jnp.zeros((), jnp.int32))


@struct.dataclass
class PlanState:
    """Everything a plan reads and writes; one explicit pytree.

    The core (policies, actor groups, observation filters, episode windows, counters, key) is
    what every plan has; `stages` holds each stateful stage's own state, keyed by the stage's
    name in the plan (`jaxplan.flow.Stage`), so no core type grows a field for one stage.

    `obs_filters` is RLlib's `RolloutWorker.filters`: per policy the running observation
    statistics of `observation_filter="MeanStdFilter"` (`{}` with "NoFilter"), replicated.
    They are core state, not a stage's, because more than the rollout stage (which alone
    updates them) reads them: the evaluation stage and a trained policy apply them frozen, and
    a stage's own state is handed to that stage alone.
    """

    policies: dict[str, PolicyState]
    actors: ActorState
    obs_filters: dict[str, MeanStd]
    episodes: EpisodeWindow
    # per policy, the window of episode returns of its agents (summed); {} single-agent
    policy_episodes: dict[str, EpisodeWindow]
    counters: Counters
    key: jax.Array
    stages: dict[str, Any]


def vmap_envs(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` (one env) over arguments with leading `[groups, envs]` axes, as one `vmap` over the
    flattened `groups * envs` axis: the same numbers as `vmap(vmap(fn))`, but rank-1 batches
    (XLA's CPU compile of the env's random-number loops is ~2x slower over two axes)."""

    def batched(*args):
        lead = jax.tree.leaves(args)[0].shape[:2]
        flat = jax.tree.map(lambda x: x.reshape(lead[0] * lead[1], *x.shape[2:]), args)
        out = jax.vmap(fn)(*flat)
        return jax.tree.map(lambda x: x.reshape(*lead, *x.shape[1:]), out)

    return batched


class WorkerSet:
    """Actor groups x envs stepping `env` with `policies` (static configuration).

    `env` is a single-agent `Env` (its one agent, `SINGLE_AGENT_ID`, acts with the one policy)
    or a multi-agent env (`jaxplan.multi_agent`); `policy_mapping` maps every agent id to a
    policy id (RLlib's `policy_mapping_fn`, static), several agents may share a policy; without
    it every agent maps to the only policy. `num_workers=0` means one group (RLlib's local worker
    samples), so the number of actor groups is `max(1, num_workers)`.

    `observation_filter` (RLlib's: "NoFilter" or "MeanStdFilter") filters every observation
    the policies see and the batches hold with the running statistics `PlanState.obs_filters`
    (`jaxplan.filters`); `clip_rewards` (RLlib's: None/False, True for the sign, or a number
    c for [-c, c]) clips the rewards of the batches, not the episode returns of the metrics.

    With a `mesh` (see `jaxplan.devices`), plans run on its devices: each device steps its own
    `num_actor_groups / num_shards` groups (the group axis of `ActorState` is sharded), and
    everything else in `PlanState` is replicated.
    """

    def __init__(
        self,
        env: Env,
        policies: Mapping[str, Policy],
        *,
        num_workers: int = 2,
        num_envs_per_worker: int = 1,
        rollout_fragment_length: int = 200,
        policies_to_train: Sequence[str] | None = None,
        normalize_actions: bool = True,
        metrics_smoothing_episodes: int = 100,
        mesh: Mesh | None = None,
        policy_mapping: Mapping[str, str] | None = None,
        observation_filter: str = "NoFilter",
        clip_rewards: bool | float | None = None,
    ):
        self.observation_filter = check_observation_filter(observation_filter)
        self.clip_rewards = check_clip_rewards(clip_rewards)
        self.ma_env = as_multi_agent(env)
        self.agents = tuple(self.ma_env.agents)
        self.policy_mapping = resolve_policy_mapping(self.ma_env, list(policies), policy_mapping)
        self.policy_agents = {
            pid: tuple(a for a in self.agents if self.policy_mapping[a] == pid) for pid in policies
        }
        for name, value in [
            ("num_envs_per_worker", num_envs_per_worker),
            ("rollout_fragment_length", rollout_fragment_length),
            ("metrics_smoothing_episodes", metrics_smoothing_episodes),
        ]:
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        self.env = env
        self.policies = dict(policies)
        self.num_workers = num_workers
        self.num_envs_per_worker = num_envs_per_worker
        self.rollout_fragment_length = rollout_fragment_length
        self.normalize_actions = normalize_actions
        self.metrics_smoothing_episodes = metrics_smoothing_episodes
        train = list(policies) if policies_to_train is None else list(policies_to_train)
        unknown = [p for p in train if p not in self.policies]
        if unknown:
            raise ValueError(f"policies_to_train {unknown} not in policies {list(self.policies)}")
        self._trainable = tuple(train)
        self.mesh = mesh
        if mesh is not None and self.num_actor_groups % mesh.size:
            raise ValueError(
                f"num_workers={num_workers}: {self.num_actor_groups} actor group(s) cannot be "
                f"split evenly across {mesh.size} devices; use a multiple of {mesh.size}"
            )

    @property
    def axis_name(self) -> str | None:
        """The data-parallel mesh axis stages reduce over, or None on one device."""
        return None if self.mesh is None else AXIS

    @property
    def num_shards(self) -> int:
        """Devices the actor groups are split across (1 without a mesh)."""
        return 1 if self.mesh is None else self.mesh.size

    @property
    def local_groups(self) -> int:
        """Actor groups stepped by each device."""
        return self.num_actor_groups // self.num_shards

    def state_specs(self, stage_specs: Mapping[str, Any] | None = None) -> PlanState:
        """`PartitionSpec`s of `PlanState` on the mesh, as a pytree prefix: the actor groups are
        split across the devices, the rest of the core is replicated; `stage_specs` gives each
        stage state's spec (see `Stage.partition_spec`)."""
        rep = P()
        return PlanState(
            policies=rep,
            actors=P(AXIS),
            obs_filters=rep,
            episodes=rep,
            policy_episodes=rep,
            counters=rep,
            key=rep,
            stages=dict(stage_specs or {}),
        )

    def place(self, state: PlanState, specs: PlanState) -> PlanState:
        """`state` laid out on the mesh as `specs` says (unchanged without a mesh); works
        eagerly and under `jit`/`vmap`."""
        if self.mesh is None:
            return state
        shardings = jax.tree.map(
            lambda spec: NamedSharding(self.mesh, spec), specs, is_leaf=lambda x: isinstance(x, P)
        )
        return jax.lax.with_sharding_constraint(state, _expand(shardings, state))

    @property
    def num_actor_groups(self) -> int:
        return max(1, self.num_workers)

    @property
    def round_env_steps(self) -> int:
        """Env steps one rollout round yields: groups x envs x fragment length."""
        return self.num_actor_groups * self.num_envs_per_worker * self.rollout_fragment_length

    def rows_per_env_step(self, pid: str) -> int:
        """Rows policy `pid` gets per env step: the number of agents mapped to it."""
        return len(self.policy_agents[pid])

    def trainable_policies(self) -> tuple[str, ...]:
        return self._trainable

    def init(self, key: jax.Array, hparams: Mapping[str, Any] | None = None) -> PlanState:
        """Fresh core `PlanState` (no stage state yet). `hparams` maps policy ids to traced
        hyper-parameters to use instead of each policy's defaults (for `vmap` over them)."""
        hparams = self._check_hparams(hparams)
        key, k_env, *k_pol = jax.random.split(key, 2 + len(self.policies))
        policies = {
            pid: _init_policy(pid, policy, k, hparams.get(pid))
            for (pid, policy), k in zip(self.policies.items(), k_pol, strict=True)
        }
        actors = self.reset_actors(k_env)
        window = self.metrics_smoothing_episodes
        return PlanState(
            policies=policies,
            actors=actors,
            obs_filters=self.initial_filters(actors),
            episodes=EpisodeWindow.empty(window),
            counters=Counters.zero(),
            key=key,
            policy_episodes=(
                {pid: EpisodeWindow.empty(window) for pid in self.policies}
                if self.is_multi_agent
                else {}
            ),
            stages={},
        )

    @property
    def filters_observations(self) -> bool:
        """Whether observations go through `PlanState.obs_filters` (MeanStdFilter)."""
        return self.observation_filter == "MeanStdFilter"

    def initial_filters(self, actors: ActorState) -> dict[str, MeanStd]:
        """Per policy the statistics of the reset observations of all groups' envs (RLlib
        pushes an observation into the filter before the policy sees it, so the first round
        never divides by a std of nothing); `{}` without a filter."""
        if not self.filters_observations:
            return {}
        out = {}
        for pid, agents in self.policy_agents.items():
            obs = jnp.stack([actors.obs[a] for a in agents], axis=2)  # [g, e, agents, ...]
            out[pid] = moments(obs, jnp.ones(obs.shape[:3]), batch_ndim=3)
        return out

    def _check_hparams(self, hparams: Any) -> dict[str, Any]:
        """`hparams` as a dict keyed by policy id, or `ValueError` naming what is wrong."""
        if hparams is None:
            return {}
        ids = list(self.policies)
        if not isinstance(hparams, Mapping):
            raise ValueError(
                f"hparams = {hparams!r}: expected a mapping of policy ids ({ids}) to "
                f"hyper-parameters, e.g. {{{ids[0]!r}: {{'lr': 1e-3}}}}"
            )
        unknown = [k for k in hparams if k not in self.policies]
        if unknown:
            raise ValueError(
                f"hparams has unknown policy id(s) {unknown}; it maps policy ids ({ids}) to "
                f"hyper-parameters, e.g. {{{ids[0]!r}: {{{str(unknown[0])!r}: ...}}}}"
            )
        return dict(hparams)

    def reset_actors(self, key: jax.Array) -> ActorState:
        """Every group's envs freshly reset (one key per env, split from `key` for all
        `[groups, envs]`), with zero episode returns and lengths."""
        groups, envs = self.num_actor_groups, self.num_envs_per_worker
        env_keys = jax.random.split(key, groups * envs).reshape(groups, envs, -1)
        obs, env_state = vmap_envs(self.ma_env.reset)(env_keys)
        return ActorState(
            env_state=strong_types(env_state),
            obs=obs,
            episode_return=jnp.zeros((groups, envs, len(self.agents)), jnp.float32),
            episode_length=jnp.zeros((groups, envs), jnp.int32),
            policy_states=self.initial_policy_states(),
        )

    def initial_policy_states(self) -> dict[str, dict[str, jax.Array]]:
        """Per recurrent policy its agents' initial state `{field: [groups, envs, agents of
        the policy, ...]}` (`Policy.initial_state`, an optional method); feed-forward
        policies have none."""
        groups, envs = self.num_actor_groups, self.num_envs_per_worker
        out = {}
        for pid, policy in self.policies.items():
            init = getattr(policy, "initial_state", None)
            state = init((groups, envs, len(self.policy_agents[pid]))) if init else {}
            if state:
                out[pid] = state
        return out

    @property
    def is_multi_agent(self) -> bool:
        return bool(getattr(self.env, "is_multi_agent", False))

    @property
    def num_agents(self) -> int:
        return len(self.agents)


def _expand(prefix, tree):
    """Broadcasts each leaf of the prefix tree `prefix` over the matching subtree of `tree`."""
    return jax.tree.map(
        lambda p, sub: jax.tree.map(lambda _: p, sub),
        prefix,
        tree,
        is_leaf=lambda x: isinstance(x, NamedSharding),
    )


def resolve_policy_mapping(
    env, policies: Sequence[str], mapping: Mapping[str, str] | None
) -> dict[str, str]:
    """The validated static agent -> policy mapping of a (multi-agent view of an) env: every
    agent mapped to one of `policies`, every policy given an agent, agents of one policy with
    one observation shape and action space. Default: every agent -> the only policy."""
    agents = tuple(env.agents)
    if not policies:
        raise ValueError("a WorkerSet needs at least one policy")
    if mapping is None:
        if len(policies) != 1:
            raise ValueError(
                f"{len(policies)} policies {list(policies)} need a policy_mapping from the env's "
                f"agents {list(agents)} to policy ids"
            )
        (only,) = policies
        return {a: only for a in agents}
    mapping = dict(mapping)
    missing = [a for a in agents if a not in mapping]
    extra = [a for a in mapping if a not in agents]
    if missing or extra:
        raise ValueError(
            f"policy_mapping must map exactly the env's agents {list(agents)}; "
            + (f"missing {missing}" if missing else "")
            + ("; " if missing and extra else "")
            + (f"unknown agent(s) {extra}" if extra else "")
        )
    bad = {a: p for a, p in mapping.items() if p not in policies}
    if bad:
        raise ValueError(f"policy_mapping {bad}: not a policy id; policies: {list(policies)}")
    unused = [p for p in policies if p not in mapping.values()]
    if unused:
        raise ValueError(f"policies {unused} have no agent mapped to them in policy_mapping")
    for pid in policies:
        mine = [a for a in agents if mapping[a] == pid]
        shapes = {tuple(env.observation_shapes[a]) for a in mine}
        spaces = {env.action_spaces[a] for a in mine}
        if len(shapes) > 1 or len(spaces) > 1:
            raise ValueError(
                f"agents {mine} share policy {pid!r} but differ in observation shape {shapes} "
                f"or action space {spaces}"
            )
    return mapping


def strong_types(tree: Any) -> Any:
    """`tree` with every weakly typed leaf given its dtype for good (same values).

    Some env resets build state from Python scalars (gymnax Pendulum's `last_u`, MountainCar's
    `velocity`): weakly typed f32 leaves, while the state `step` returns is strongly typed, so
    a jitted `plan.step` would see two input types and compile twice (~4-12 s lost).
    """

    def strong(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return x  # typed keys are never weak
        return jax.lax.convert_element_type(x, x.dtype)

    return jax.tree.map(strong, tree)


def _init_policy(pid: str, policy: Policy, key: jax.Array, hparams: Any) -> PolicyState:
    """`policy.init(key, hparams)`; a `ValueError` about the hparams names the policy id."""
    try:
        return policy.init(key, hparams)
    except ValueError as e:
        raise ValueError(f"hparams[{pid!r}]: {e}") from None
