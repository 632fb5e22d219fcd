"""Evaluation: RLlib's `evaluation_interval` / `evaluation_duration` / `evaluation_config` as a
plan stage inside the compiled step, and `evaluate` for a trained policy.

An evaluation plays `num_episodes` fresh episodes, one per env, to their end with the newest
params (`PlanState.policies`: what was just trained, never the lagged snapshots of async actor
groups), on envs of its own (the training env, or `evaluation_config.env_config` on top of its
config) and with a key of its own (folded from the plan's, so training draws the same numbers
with or without evaluation). `explore=False` acts with each distribution's deterministic
action (argmax / mean). With `observation_filter="MeanStdFilter"` the policies see
observations filtered with the training statistics `PlanState.obs_filters`, frozen (RLlib's
evaluation workers get the synchronised filters and do not update them). Episode `i` is a
function of the evaluation key and `i` alone: each
episode is its own actor group, and keys are split per group for all (padded) groups, so the
results do not depend on how many devices the episodes are spread over.

The episodes run in a `lax.while_loop` until every one has ended (or `max_episode_steps`), so
an iteration that does not evaluate runs zero loop steps, also under `vmap`. Results follow
RLlib's `result["evaluation"]`: `episode_reward_mean/min/max`, `episode_len_mean`,
`episodes_this_iter`, `timesteps_this_iter`, `policy_reward_mean/min/max` (multi-agent) and
`hist_stats` (`episode_reward`, `episode_lengths`, NaN for an episode cut by the step limit);
the key is only in the results of iterations that evaluated (`report_evaluation`, host side).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxplan import devices
from jaxplan.flow import Result, Stage
from jaxplan.stages.acting import step_envs
from jaxplan.stages.metrics import episode_stats
from jaxplan.workers import EpisodeWindow, PlanState, WorkerSet

DEFAULT_EPISODE_STEP_LIMIT = 100_000
"""Step limit of an evaluation episode in an env that declares none (`max_episode_steps`)."""

_EVAL_STREAM = 0x5EED_E7A1
"""Folded into the plan's key for the evaluation's own key (a fixed, arbitrary constant)."""


@struct.dataclass
class EvaluationState:
    """The evaluation's key, the metrics of its latest evaluation (NaN before the first) and
    whether the current iteration evaluated."""

    key: jax.Array
    last: Result
    evaluated: jax.Array  # bool


def evaluation_workers(workers: WorkerSet, num_episodes: int, env: Any = None) -> WorkerSet:
    """The static set-up of an evaluation: one actor group of one env per episode, the group
    count padded to a multiple of the devices (the padding's episodes are played, not
    reported), on `env` (default: the training env) with the training policies."""
    if isinstance(num_episodes, bool) or not isinstance(num_episodes, int) or num_episodes < 1:
        raise ValueError(f"evaluation needs num_episodes >= 1, got {num_episodes!r}")
    shards = workers.num_shards
    padded = -(-num_episodes // shards) * shards
    return WorkerSet(
        workers.env if env is None else env,
        workers.policies,
        num_workers=padded,
        num_envs_per_worker=1,
        rollout_fragment_length=1,
        normalize_actions=workers.normalize_actions,
        observation_filter=workers.observation_filter,
        metrics_smoothing_episodes=num_episodes,
        mesh=workers.mesh,
        policy_mapping=workers.policy_mapping,
    )


def episode_step_limit(env: Any) -> int:
    """The env's `max_episode_steps`, or `DEFAULT_EPISODE_STEP_LIMIT` if it declares none."""
    limit = getattr(env, "max_episode_steps", None)
    return DEFAULT_EPISODE_STEP_LIMIT if limit is None else int(limit)


def play_episodes(
    ew: WorkerSet,
    params: dict[str, Any],
    key: jax.Array,
    num_episodes: int,
    *,
    explore: bool,
    max_steps: int,
    run: jax.Array | bool = True,
    filters: dict[str, Any] | None = None,
) -> Result:
    """Plays one episode per actor group of `ew` (see `evaluation_workers`) with `params`
    (`{policy_id: params}`), for at most `max_steps` steps, and summarizes the first
    `num_episodes` (RLlib's evaluation keys), the observations filtered with `filters`
    (`{policy_id: MeanStd}`, frozen; None: unfiltered). With `run` False (traced) the loop takes no
    step and the summary is that of no episode. Inside `shard_map` each device plays its
    share of the episodes; the summary is the same on every device."""
    axis = ew.axis_name
    k_reset, k_steps = jax.random.split(key)
    actors = jax.tree.map(lambda x: devices.local_slice(x, axis), ew.reset_actors(k_reset))
    # [local groups] carries derived from the (device-varying) actors, so the loop's carry
    # keeps its type inside shard_map
    lengths = actors.episode_length[:, 0]
    carry = (actors, jnp.int32(0), lengths < 0, actors.episode_return[:, 0], lengths)

    def cond(carry):
        _, t, finished, _, _ = carry
        return jnp.logical_and(run, t < max_steps) & ~jnp.all(finished)

    def body(carry):
        actors, t, finished, returns, lengths = carry
        actors, _, (done, ep_return, ep_length) = step_envs(
            ew,
            params,
            actors,
            jax.random.fold_in(k_steps, t),
            axis,
            explore=explore,
            filters=filters,
        )
        first = done[:, 0] & ~finished  # the group's episode ends now (later ones are ignored)
        returns = jnp.where(first[:, None], ep_return[:, 0], returns)
        lengths = jnp.where(first, ep_length[:, 0], lengths)
        return actors, t + 1, finished | done[:, 0], returns, lengths

    _, _, finished, returns, lengths = jax.lax.while_loop(cond, body, carry)
    finished, returns, lengths = devices.gather((finished, returns, lengths), axis)
    return summarize_episodes(
        ew, finished[:num_episodes], returns[:num_episodes], lengths[:num_episodes]
    )


def summarize_episodes(
    ew: WorkerSet, finished: jax.Array, returns: jax.Array, lengths: jax.Array
) -> Result:
    """RLlib's evaluation metrics of episodes `[E]` (`finished` bool, per-agent `returns`
    `[E, agents]`, `lengths` int32): statistics over the finished ones (the team return is
    the sum over agents; a policy's, over its agents)."""
    team = returns.sum(-1)
    window = EpisodeWindow.empty(finished.shape[0]).record(finished, team, lengths)
    per_policy: dict[str, dict[str, jax.Array]] = {
        "policy_reward_mean": {},
        "policy_reward_min": {},
        "policy_reward_max": {},
    }
    if ew.is_multi_agent:
        for pid, agents in ew.policy_agents.items():
            idx = jnp.asarray([ew.agents.index(a) for a in agents])
            own = EpisodeWindow.empty(finished.shape[0])
            stats = episode_stats(own.record(finished, returns[:, idx].sum(-1), lengths))
            for key in per_policy:
                per_policy[key][pid] = stats[key.replace("policy", "episode")]
    nan = jnp.float32(jnp.nan)
    return {
        **episode_stats(window),
        "episodes_this_iter": jnp.sum(finished.astype(jnp.int32)),
        "timesteps_this_iter": jnp.sum(jnp.where(finished, lengths, 0)),
        **per_policy,
        "hist_stats": {
            "episode_reward": jnp.where(finished, team, nan),
            "episode_lengths": jnp.where(finished, lengths, 0),
        },
    }


class Evaluation(Stage):
    """Passes its item through; every `interval`-th training iteration (RLlib's
    `evaluation_interval`, counted after this iteration's update) plays `num_episodes`
    episodes with the newest params and keeps their metrics (see the module docstring).
    `env`: the evaluation env (default: the training env); `max_episode_steps`: the step
    limit of one episode (default: the env's, see `episode_step_limit`)."""

    name = "evaluation"

    def __init__(
        self,
        workers: WorkerSet,
        *,
        interval: int = 1,
        num_episodes: int = 10,
        explore: bool = True,
        env: Any = None,
        max_episode_steps: int | None = None,
    ):
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"evaluation interval must be an integer >= 1, got {interval!r}")
        self.workers = evaluation_workers(workers, num_episodes, env)
        self.interval = interval
        self.num_episodes = num_episodes
        self.explore = bool(explore)
        limit = max_episode_steps or episode_step_limit(self.workers.ma_env)
        if limit < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {limit}")
        self.max_steps = limit

    def _play(self, state: PlanState, key: jax.Array, run) -> Result:
        params = {pid: ps.params for pid, ps in state.policies.items()}
        return play_episodes(
            self.workers,
            params,
            key,
            self.num_episodes,
            explore=self.explore,
            max_steps=self.max_steps,
            run=run,
            filters=state.obs_filters,
        )

    def init(self, state: PlanState) -> tuple[PlanState, EvaluationState]:
        key = jax.random.fold_in(state.key, _EVAL_STREAM)
        n, agents = self.num_episodes, len(self.workers.agents)
        nothing = summarize_episodes(  # NaN statistics of no episode, before the first
            self.workers,
            jnp.zeros((n,), bool),
            jnp.zeros((n, agents), jnp.float32),
            jnp.zeros((n,), jnp.int32),
        )
        return state, EvaluationState(key=key, last=nothing, evaluated=jnp.zeros((), bool))

    def apply(self, state: PlanState, own: EvaluationState, item: Any):
        iteration = state.counters.training_iteration + 1  # this iteration, once reported
        run = iteration % self.interval == 0
        key, k_eval = jax.random.split(own.key)
        new = self._play(state, k_eval, run)
        last = jax.tree.map(lambda n, o: jnp.where(run, n, o), new, own.last)
        return state, EvaluationState(key=key, last=last, evaluated=run), item

    def metrics(self, state: PlanState, own: EvaluationState) -> Result:
        return {"evaluation": {**own.last, "evaluated": own.evaluated}}


def report_evaluation(result: dict) -> dict:
    """Host hook: keeps `result["evaluation"]` only in the results of iterations that
    evaluated (RLlib's), without the `evaluated` flag."""
    evaluation = result.get("evaluation")
    if isinstance(evaluation, dict) and "evaluated" in evaluation:
        if evaluation.pop("evaluated"):
            return result
        return {k: v for k, v in result.items() if k != "evaluation"}
    return result


def evaluate(
    workers: WorkerSet,
    params: dict[str, Any],
    key: jax.Array,
    *,
    num_episodes: int = 10,
    explore: bool = False,
    env: Any = None,
    max_episode_steps: int | None = None,
    filters: dict[str, Any] | None = None,
) -> Result:
    """Plays `num_episodes` episodes with `params` (`{policy_id: params}`, e.g. a trained
    `state.policies[pid].params`) and returns RLlib's evaluation metrics (device arrays;
    `jax.jit`/`vmap`-able; one device: `workers` without a mesh). Deterministic actions
    unless `explore`. `filters`: the run's `state.obs_filters` when it filtered observations
    (applied frozen)."""
    if workers.mesh is not None:
        raise ValueError("evaluate runs on one device: build the workers without a mesh")
    ew = evaluation_workers(workers, num_episodes, env)
    limit = max_episode_steps or episode_step_limit(ew.ma_env)
    return play_episodes(
        ew, params, key, num_episodes, explore=explore, max_steps=limit, filters=filters
    )
