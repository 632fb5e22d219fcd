"""Multi-agent environments: the contract rollouts use, a single-agent view of `Env`, a small
built-in multi-agent env, and an adapter for JaxMARL.

The contract (`MultiAgentEnv`), for one env (callers `vmap` over groups and envs):

- `agents`: the agent ids (static, ordered); `observation_shapes[agent]`, `action_spaces[agent]`.
- `max_episode_steps`: the step limit after which an episode is truncated, or None.
- `reset(key) -> (obs {agent: [*obs_shape] f32}, state)`.
- `step(key, state, actions {agent: action}) -> (obs, state, rewards {agent: f32},
  terminated {agent: bool}, truncated {agent: bool}, final_obs {agent: ...})`, resetting the
  env when the episode ends; `final_obs` is the observation the step reached (before a reset),
  which GAE bootstraps a truncated episode from.

An episode ends for all agents at once (JaxMARL's `"__all__"`); agents that finish earlier
keep acting until then.
"""

from __future__ import annotations

import difflib
from typing import Any

import jax
import jax.numpy as jnp

from jaxplan.env_adapters import BRAX_PREFIX, JUMANJI_PREFIX
from jaxplan.envs import (
    ActionSpace,
    Box,
    Discrete,
    Env,
    env_creator,
    make_custom_env,
    registered_envs,
)

SINGLE_AGENT_ID = "agent0"
"""The agent id of a single-agent env seen as a multi-agent one (RLlib's dummy agent id)."""

JAXMARL_PREFIX = "jaxmarl:"
BUILTIN = ("MultiAgentCartPole",)


def is_multi_agent_env(name: str) -> bool:
    """Whether an env id names a multi-agent env (built-in or `jaxmarl:...`), without making it."""
    return name in BUILTIN or name.startswith(JAXMARL_PREFIX)


class SingleAgentView:
    """A single-agent `Env` as a one-agent `MultiAgentEnv` (agent `SINGLE_AGENT_ID`)."""

    is_multi_agent = False

    def __init__(self, env: Env):
        self.env = env
        self.name = getattr(env, "name", type(env).__name__)
        self.agents = (SINGLE_AGENT_ID,)
        self.observation_shapes = {SINGLE_AGENT_ID: tuple(env.observation_shape)}
        self.action_spaces = {SINGLE_AGENT_ID: env.action_space}
        self.max_episode_steps = getattr(env, "max_episode_steps", None)

    def reset(self, key):
        obs, state = self.env.reset(key)
        return {SINGLE_AGENT_ID: obs}, state

    def step(self, key, state, actions):
        obs, state, reward, terminated, truncated, final_obs = self.env.step(
            key, state, actions[SINGLE_AGENT_ID]
        )
        one = lambda x: {SINGLE_AGENT_ID: x}  # noqa: E731
        return one(obs), state, one(reward), one(terminated), one(truncated), one(final_obs)


class MultiAgentCartPole:
    """`num_agents` CartPole-v1 poles, one per agent (RLlib's `MultiAgentCartPole` example
    env, with one shared episode). Every agent gets +1 per step; the episode ends for all when
    any pole falls (terminated) or after 500 steps (truncated), so the team return is
    `num_agents x` the episode length: about 2 x 14 for random actions, 2 x 500 at best."""

    is_multi_agent = True

    def __init__(self, num_agents: int = 2):
        from jaxplan._deferred_imports import import_gymnax

        if num_agents < 1:
            raise ValueError(f"MultiAgentCartPole: num_agents must be >= 1, got {num_agents}")
        self._env, self._params = import_gymnax().make("CartPole-v1")
        self.name = "MultiAgentCartPole"
        self.agents = tuple(f"agent_{i}" for i in range(num_agents))
        self.observation_shapes = {a: (4,) for a in self.agents}
        self.action_spaces = {a: Discrete(2) for a in self.agents}
        self.max_episode_steps = int(self._params.max_steps_in_episode)

    def _obs(self, obs):
        return {a: obs[i].astype(jnp.float32) for i, a in enumerate(self.agents)}

    def reset(self, key):
        keys = jax.random.split(key, len(self.agents))
        obs, state = jax.vmap(self._env.reset_env, in_axes=(0, None))(keys, self._params)
        return self._obs(obs), state

    def step(self, key, state, actions):
        n = len(self.agents)
        k_step, k_reset = jax.random.split(key)
        action = jnp.stack([actions[a] for a in self.agents])
        obs, stepped, _, fell, _ = jax.vmap(self._env.step_env, in_axes=(0, 0, 0, None))(
            jax.random.split(k_step, n), state, action, self._params
        )
        terminated = jnp.any(fell)
        truncated = jnp.logical_and(
            stepped.time[0] >= self._params.max_steps_in_episode, ~terminated
        )
        done = terminated | truncated
        obs_re, state_re = self.reset(k_reset)
        new_state = jax.tree.map(lambda r, s: jnp.where(done, r, s), state_re, stepped)
        final = self._obs(obs)
        new_obs = {a: jnp.where(done, obs_re[a], final[a]) for a in self.agents}
        every = lambda x: {a: x for a in self.agents}  # noqa: E731
        return (
            new_obs,
            new_state,
            every(jnp.float32(1.0)),
            every(terminated),
            every(truncated),
            final,
        )


class JaxMARLEnv:
    """A JaxMARL environment (`jaxmarl.make(name, **kwargs)`) behind the contract above.

    JaxMARL ends an episode with `dones["__all__"]` and resets inside `step`, without the final
    observation; the adapter calls `step_env` and resets itself so it keeps it. An episode that
    ends because the env's step counter reached `max_steps` (the MPE tasks) is *truncated*
    (bootstrapped from the final observation), any other end *terminated*.
    Needs the optional extra: `pip install 'jaxplan[jaxmarl]'`.
    """

    is_multi_agent = True

    def __init__(self, name: str, **kwargs: Any):
        try:
            import jaxmarl
        except ImportError:
            raise ImportError(
                f"env {JAXMARL_PREFIX}{name} needs JaxMARL: pip install 'jaxplan[jaxmarl]'"
            ) from None
        if name not in jaxmarl.registered_envs:
            close = difflib.get_close_matches(name, jaxmarl.registered_envs, n=1)
            hint = f" Did you mean {JAXMARL_PREFIX}{close[0]}?" if close else ""
            raise ValueError(f"Unknown JaxMARL env {name!r}.{hint}")
        self._env = jaxmarl.make(name, **kwargs)
        self.name = JAXMARL_PREFIX + name
        self.agents = tuple(self._env.agents)
        self.observation_shapes = {
            a: tuple(self._env.observation_space(a).shape) for a in self.agents
        }
        self.action_spaces = {a: _jaxmarl_space(self._env.action_space(a)) for a in self.agents}
        max_steps = getattr(self._env, "max_steps", None)
        self.max_episode_steps = None if max_steps is None else int(max_steps)

    def _f32(self, obs):
        return {a: jnp.asarray(obs[a], jnp.float32) for a in self.agents}

    def reset(self, key):
        obs, state = self._env.reset(key)
        return self._f32(obs), state

    def step(self, key, state, actions):
        key, key_reset = jax.random.split(key)
        obs, stepped, rewards, dones, _ = self._env.step_env(key, state, actions)
        done = jnp.asarray(dones["__all__"], bool)
        max_steps = getattr(self._env, "max_steps", None)
        if max_steps is not None and hasattr(stepped, "step"):
            at_limit = jnp.asarray(stepped.step >= max_steps, bool)
        else:
            at_limit = jnp.zeros((), bool)
        truncated = done & at_limit
        terminated = done & ~at_limit
        obs_re, state_re = self._env.reset(key_reset)
        new_state = jax.tree.map(lambda r, s: jax.lax.select(done, r, s), state_re, stepped)
        final = self._f32(obs)
        new_obs = {a: jnp.where(done, obs_re[a].astype(jnp.float32), final[a]) for a in self.agents}
        every = lambda x: {a: x for a in self.agents}  # noqa: E731
        rewards = {a: jnp.asarray(rewards[a], jnp.float32) for a in self.agents}
        return new_obs, new_state, rewards, every(terminated), every(truncated), final


def _jaxmarl_space(space) -> ActionSpace:
    if hasattr(space, "n"):
        return Discrete(int(space.n))
    if hasattr(space, "low") and hasattr(space, "high"):
        shape = tuple(space.shape)
        import numpy as np

        low = np.broadcast_to(np.asarray(space.low, np.float32), shape)
        high = np.broadcast_to(np.asarray(space.high, np.float32), shape)
        return Box(shape, low, high)
    raise TypeError(f"unsupported JaxMARL action space {space!r}")


def is_custom_env(name: str) -> bool:
    """Whether an env id is a name given to `jaxplan.register_env` or an import path
    `"package.module:creator"` (whether it is multi-agent is known only once it is made)."""
    return name in registered_envs() or (
        ":" in name and not name.startswith((JAXMARL_PREFIX, BRAX_PREFIX, JUMANJI_PREFIX))
    )


def make_env(name: str, env_config: dict | None = None):
    """An env from its id and `env_config`: a name given to `jaxplan.register_env` (its
    creator's env, checked against the contract, `jaxplan.envs.check_env`), `"CartPole-v1"`
    (gymnax, single-agent) -> `Env`, `"MultiAgentCartPole"` (built-in) or
    `"jaxmarl:MPE_simple_spread_v3"` (JaxMARL) -> a multi-agent env, `"brax:ant"` (Brax) ->
    `BraxEnv`, `"jumanji:Snake-v1"` (Jumanji) -> `JumanjiEnv`, or an import path
    `"package.module:creator"` (like a registered creator)."""
    env_config = dict(env_config or {})
    if name in registered_envs():
        return make_custom_env(name, env_creator(name), env_config)
    if name.startswith(JAXMARL_PREFIX):
        return JaxMARLEnv(name[len(JAXMARL_PREFIX) :], **env_config)
    if name.startswith(BRAX_PREFIX):
        from jaxplan.env_adapters import BraxEnv

        return BraxEnv(name[len(BRAX_PREFIX) :], **env_config)
    if name.startswith(JUMANJI_PREFIX):
        from jaxplan.env_adapters import JumanjiEnv

        return JumanjiEnv(name[len(JUMANJI_PREFIX) :], **env_config)
    if name == "MultiAgentCartPole":
        unknown = set(env_config) - {"num_agents"}
        if unknown:
            raise ValueError(
                f"Unknown env_config key(s) {sorted(unknown)} for {name}; valid: num_agents"
            )
        return MultiAgentCartPole(**env_config)
    creator = env_creator(name)
    if creator is not None:
        return make_custom_env(name, creator, env_config)
    try:
        return Env(name, **env_config)
    except ValueError as e:
        if not str(e).startswith("Unknown env "):
            raise
        registered = registered_envs()
        close = difflib.get_close_matches(name, registered, n=1)
        hint = f" Did you mean the registered {close[0]!r}?" if close else ""
        known = ", ".join(map(repr, registered)) or "none"
        raise ValueError(
            f"{e}. Brax: {BRAX_PREFIX}<Brax env name>; Jumanji: {JUMANJI_PREFIX}<Jumanji env "
            f"id>. Multi-agent: {', '.join(BUILTIN)}, or {JAXMARL_PREFIX}<JaxMARL env id>. "
            f"Registered envs (jaxplan.register_env, in this process): {known}, or an import "
            f"path 'package.module:creator'.{hint}"
        ) from None


def as_multi_agent(env):
    """The multi-agent view of an env: itself if it is one, else a `SingleAgentView`."""
    return env if getattr(env, "is_multi_agent", False) else SingleAgentView(env)
