"""One trained policy of a run, to act with: `load_policy(DIR) -> TrainedPolicy`.

```python
import jax, jaxplan

policy = jaxplan.load_policy("runs/ppo-cartpole")    # latest checkpoint, the run's first seed
action = policy.act(obs)                             # obs [4] -> int32 []   (the argmax action)
actions = policy.act(obs_batch)                      # [B, 4] -> [B]
sampled = policy.act(obs, jax.random.PRNGKey(0), explore=True)
```

Loading checks the checkpoint against the network the run's config builds (`load_run`) and the
env to act in against the network's observation and action shapes, and refuses a mismatch
naming both. A run trained with `observation_filter="MeanStdFilter"` filters the observations
with the checkpoint's statistics, frozen (`obs_filter`), before the network sees them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxplan.algorithms import get_algorithm
from jaxplan.batch import DEFAULT_POLICY_ID
from jaxplan.config import TrainerConfig
from jaxplan.envs import ActionSpace, Box, Discrete
from jaxplan.multi_agent import as_multi_agent, make_env
from jaxplan.stages.acting import to_env_action
from jaxplan.trained import TrainedRun, load_run, read_params


class TrainedPolicy:
    """Policy `policy_id` of run seed `seed` at training iteration `iteration` of the run in
    `directory`: its `config`, its (static) `policy`, its `params` (host arrays), the `env` it
    acts in, that env's `observation_shape` and `action_space` for this policy, and the
    run's observation filter `obs_filter` (`jaxplan.filters.MeanStd`, applied frozen; None
    without `observation_filter`).

    `act` and `value` take one observation `[*observation_shape]` or a batch
    `[*B, *observation_shape]` and are jitted (one compile per input shape)."""

    def __init__(self, run: TrainedRun, policy_id: str, seed: int, env: Any):
        self.directory = run.directory
        self.policy_id = policy_id
        self.seed = seed
        self.iteration = run.iteration
        self.config: TrainerConfig = run.config
        self.policy = run.plan.workers.policies[policy_id]
        self.params = run.seed_params(seed)[policy_id]
        self.obs_filter = run.seed_filters(seed).get(policy_id)
        self.env = env
        self.observation_shape, self.action_space = check_env(run, policy_id, env)
        self.normalize_actions = run.plan.workers.normalize_actions
        policy, space, normalize = self.policy, self.action_space, self.normalize_actions
        obs_filter = self.obs_filter

        def seen(obs):
            return obs if obs_filter is None else obs_filter(obs)

        def act(params, obs, key, explore):
            actions, _ = policy.compute_actions(params, seen(obs), key, explore=explore)
            return to_env_action(space, actions, normalize_actions=normalize)

        self._act = jax.jit(act, static_argnames="explore")
        self._value = None
        if hasattr(policy, "value"):  # an actor-critic (PPOPolicy)
            self._value = jax.jit(lambda params, obs: policy.value(params, seen(obs)))

    def act(self, obs: Any, key: jax.Array | None = None, explore: bool = False) -> jax.Array:
        """The env actions for `obs` (`[*observation_shape]` -> one action, `[*B,
        *observation_shape]` -> `[*B, ...]`): the distribution's mode (argmax / mean), or
        with `explore=True` a sample drawn with `key` (required then). Box actions are mapped
        onto the env's bounds as in training (`normalize_actions`) or clipped to them."""
        self._refuse_recurrent("act")
        obs = self._observations(obs)
        if explore and key is None:
            raise ValueError("act(obs, key, explore=True) samples actions: pass a PRNG key")
        if key is None:
            key = jax.random.PRNGKey(0)  # not used by deterministic actions
        return self._act(self.params, obs, key, explore=bool(explore))

    def value(self, obs: Any) -> jax.Array:
        """The critic's value estimates of raw `obs` (`[*B, *observation_shape]` -> `[*B]`;
        filtered here like in `act`)."""
        self._refuse_recurrent("value")
        if self._value is None:
            raise TypeError(f"{type(self.policy).__name__} has no value function")
        return self._value(self.params, self._observations(obs))

    def _refuse_recurrent(self, method: str) -> None:
        if getattr(self.policy, "recurrent", False):
            raise ValueError(
                f"policy {self.policy_id!r} is recurrent (model.use_lstm): {method}() carries "
                "no state from one call to the next; evaluate it with jaxplan.load_run(DIR)"
                ".evaluate() or `jaxplan evaluate DIR`, which carry each env's state"
            )

    def _observations(self, obs: Any) -> jax.Array:
        shape, want = tuple(np.shape(obs)), self.observation_shape
        if shape[len(shape) - len(want) :] != want or len(shape) < len(want):
            raise ValueError(
                f"policy {self.policy_id!r} ({self.config.env}) takes observations of shape "
                f"{list(want)} or batches [B, {', '.join(map(str, want))}]; got {list(shape)}"
            )
        return jnp.asarray(obs, jnp.float32)

    def __repr__(self):
        return (
            f"TrainedPolicy({str(self.directory)!r}, policy_id={self.policy_id!r}, "
            f"seed={self.seed}, iteration={self.iteration}, obs={list(self.observation_shape)}, "
            f"actions={describe_space(self.action_space)})"
        )


def load_policy(
    directory: str | os.PathLike,
    policy_id: str | None = None,
    *,
    seed: int | None = None,
    checkpoint: str | int = "latest",
    env: Any = None,
) -> TrainedPolicy:
    """Policy `policy_id` (default: `"default_policy"`, or the run's only policy) of run seed
    `seed` (default: the run's first) from checkpoint `checkpoint` (`"latest"`, `"best"` or a
    kept iteration) of the run in `directory`, to act in `env` (an env id, made with the run's
    `env_config` when it is the run's env, or an env object; default: the run's evaluation
    env). Raises `ValueError` naming the valid choices for a bad seed or policy id (before
    reading the checkpoint), and naming both shapes when `env` does not fit the network."""
    directory = Path(directory)
    saved = read_params(directory)
    seeds = [int(s) for s in saved["seeds"]]
    if seed is not None and (isinstance(seed, bool) or seed not in seeds):
        raise ValueError(f"{directory}: seed {seed!r} is not one of the run's seeds {seeds}")
    ids = get_algorithm(saved["algorithm"]).config_class.from_dict(saved["config"]).policy_ids
    if policy_id is None:
        policy_id = ids[0] if len(ids) == 1 else DEFAULT_POLICY_ID
    if policy_id not in ids:
        raise ValueError(
            f"{directory}: no policy {policy_id!r} in the run; its policies: {', '.join(ids)}"
        )
    run = load_run(directory, checkpoint)
    if env is None:
        env = run.evaluation_env()
    elif isinstance(env, str):
        env = make_env(env, run.config.env_config if env == run.config.env else None)
    return TrainedPolicy(run, policy_id, seeds[0] if seed is None else seed, env)


def check_env(run: TrainedRun, policy_id: str, env: Any) -> tuple[tuple[int, ...], ActionSpace]:
    """The observation shape and action space of the agents of `env` that policy `policy_id`
    acts for (the run's agent -> policy mapping); raises `ValueError` naming both envs and
    shapes when they are not those the policy's network was built for."""
    workers = run.plan.workers
    trained_agents = workers.policy_agents[policy_id]
    trained = (
        tuple(workers.ma_env.observation_shapes[trained_agents[0]]),
        workers.ma_env.action_spaces[trained_agents[0]],
    )
    view = as_multi_agent(env)
    name = getattr(view, "name", type(env).__name__)
    agents = [a for a in view.agents if workers.policy_mapping.get(a) == policy_id]
    if not agents:
        raise ValueError(
            f"{run.directory}: env {name} has agents {list(view.agents)}, none of which policy "
            f"{policy_id!r} acted for in the run ({run.config.env}: {list(trained_agents)})"
        )
    for agent in agents:
        shape, space = tuple(view.observation_shapes[agent]), view.action_spaces[agent]
        if shape != trained[0] or not _same_kind(space, trained[1]):
            raise ValueError(
                f"{run.directory}: env {name} does not fit policy {policy_id!r}: it has "
                f"observations {list(shape)} and actions {describe_space(space)}, the policy "
                f"was trained on {run.config.env} with observations {list(trained[0])} and "
                f"actions {describe_space(trained[1])}"
            )
    return tuple(view.observation_shapes[agents[0]]), view.action_spaces[agents[0]]


def describe_space(space: ActionSpace) -> str:
    """`Discrete(2)`, `Box[1]` (the shape)."""
    if isinstance(space, Box):
        return f"Box{list(space.shape)}"
    return repr(space)


def _same_kind(a: ActionSpace, b: ActionSpace) -> bool:
    """Whether one network's outputs fit both spaces: as many discrete actions, or Box actions
    of one shape (bounds may differ: actions are mapped onto each env's bounds)."""
    if isinstance(a, Discrete) and isinstance(b, Discrete):
        return a.n == b.n
    return isinstance(a, Box) and isinstance(b, Box) and tuple(a.shape) == tuple(b.shape)
