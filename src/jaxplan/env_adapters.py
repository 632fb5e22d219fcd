"""Brax and Jumanji environments behind jaxplan's single-agent env contract (`jaxplan.envs`).

`make_env("brax:inverted_pendulum")` -> `BraxEnv`, `make_env("jumanji:Snake-v1")` ->
`JumanjiEnv`; each needs its optional extra (`pip install 'jaxplan[brax]'`,
`'jaxplan[jumanji]'`), imported only when such an env is made.

Both adapters step the library's env without its auto-reset wrapper and reset themselves when
an episode ends, with a fresh `reset(key)` (a new random initial state), keeping the
observation the step reached as `final_obs` (what GAE bootstraps a truncated episode from).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import inspect
import io
import math
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from jaxplan.envs import ActionSpace, Box, Discrete

BRAX_PREFIX = "brax:"
JUMANJI_PREFIX = "jumanji:"


def _select(done: jax.Array, on_done: Any, otherwise: Any) -> Any:
    """`on_done` where `done` else `otherwise`, leaf by leaf (same structures)."""
    return jax.tree.map(lambda a, b: jnp.where(done, a, b).astype(b.dtype), on_done, otherwise)


def _known_name(library: str, prefix: str, name: str, registered: list[str]) -> None:
    """`ValueError` naming the nearest and all of `library`'s env names when `name` is not
    one of `registered`."""
    if name not in registered:
        close = difflib.get_close_matches(name, registered, n=1)
        hint = f" Did you mean {prefix}{close[0]}?" if close else ""
        raise ValueError(
            f"Unknown {library} env {name!r}.{hint} Valid {library} envs: "
            + ", ".join(prefix + n for n in registered)
        )


def _unknown_keys(env: str, given: dict, valid: list[str]) -> None:
    """`ValueError` naming the first unknown `env_config` key, its nearest valid name and all
    valid ones."""
    unknown = [k for k in given if k not in valid]
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), valid, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"Unknown env_config key(s) {unknown} for {env}.{hint} Valid keys: " + ", ".join(valid)
        )


def _init_params(*classes: type) -> list[str]:
    """The named constructor parameters of `classes` (no `self`, `*args`, `**kwargs`)."""
    names: list[str] = []
    for cls in classes:
        for p in inspect.signature(cls.__init__).parameters.values():
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                if p.name not in names:
                    names.append(p.name)
    return names


def _node_types(treedef: Any) -> set[type]:
    """The types of every inner node of `treedef`."""
    types, stack = set(), [treedef]
    while stack:
        node = stack.pop()
        data = node.node_data()
        if data is not None:
            types.add(data[0])
        stack.extend(node.children())
    return types


def _one_level(x: Any) -> tuple[list[tuple[str, Any]], Any]:
    """`x`'s pytree children, named by their keys, and the treedef that rebuilds `x`."""
    pairs, treedef = jax.tree_util.tree_flatten_with_path(x, is_leaf=lambda y: y is not x)
    names = [jax.tree_util.keystr(path, simple=True, separator=".") for path, _ in pairs]
    return list(zip(names, (leaf for _, leaf in pairs), strict=True)), treedef


def _to_state_dict(x: Any) -> dict[str, Any]:
    return {name: serialization.to_state_dict(child) for name, child in _one_level(x)[0]}


def _from_state_dict(target: Any, state: dict[str, Any]) -> Any:
    children, treedef = _one_level(target)
    restored = [serialization.from_state_dict(c, state[name]) for name, c in children]
    return jax.tree_util.tree_unflatten(treedef, restored)


def register_for_checkpoints(tree: Any) -> None:
    """Lets jaxplan's checkpoints (flax msgpack) save and restore `tree`'s pytree node types
    that flax does not know (Jumanji's and MJX's dataclass states): each is stored as the dict
    of its pytree children by key. Types flax already serializes are left alone."""
    for cls in _node_types(jax.tree.structure(tree)):
        if dataclasses.is_dataclass(cls):
            with contextlib.suppress(ValueError):  # already registered (flax structs)
                serialization.register_serialization_state(cls, _to_state_dict, _from_state_dict)


# ---- Brax ------------------------------------------------------------------------------------
def import_brax_envs() -> Any:
    """`brax.envs`; `ImportError` naming the extra when Brax is not installed. MuJoCo prints
    two lines about its optional Warp backend on import; they are swallowed."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            from brax import envs
    except ImportError:
        raise ImportError("Brax envs need Brax: pip install 'jaxplan[brax]'") from None
    return envs


class BraxEnv:
    """A Brax environment (`brax.envs.get_environment(name, **kwargs)`) behind the contract.

    - Observations: Brax's `state.obs`, f32 `[observation_size]`; actions: `Box` of
      `[action_size]` in Brax's bounds [-1, 1] (each env scales them to its actuators).
    - Episodes: Brax's `EpisodeWrapper` counts the steps; an episode is cut after
      `episode_length` steps (default 1000, Brax's) as *truncated* (its
      `state.info["truncation"]`), and ends *terminated* when the env's own `done` is set (a
      pole fell, a robot tipped over), also on the last allowed step.
    - `env_config`: `episode_length`, `action_repeat` (default 1: each action applied that many
      times, rewards summed; `episode_length` counts those repeated steps, so an episode is
      `episode_length // action_repeat` adapter steps, `max_episode_steps`), and
      the env's constructor arguments (`backend`: "generalized" (Brax's default), "positional",
      "spring" or "mjx"; per-env ones such as `reset_noise_scale`).
    """

    def __init__(
        self, name: str, episode_length: int = 1000, action_repeat: int = 1, **kwargs: Any
    ):
        envs = import_brax_envs()
        from brax.envs.base import PipelineEnv
        from brax.envs.wrappers.training import EpisodeWrapper

        # brax 0.14 has no public list of its env names
        _known_name("Brax", BRAX_PREFIX, name, sorted(envs._envs))
        self.name = BRAX_PREFIX + name
        valid = ["episode_length", "action_repeat"] + [
            k for k in _init_params(envs._envs[name], PipelineEnv) if k != "sys"
        ]
        _unknown_keys(self.name, kwargs, valid)
        for key, value in (("episode_length", episode_length), ("action_repeat", action_repeat)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"env_config[{key!r}] = {value!r}: must be an integer >= 1")
        if episode_length % action_repeat:
            raise ValueError(
                f"env_config['episode_length'] = {episode_length} is not a multiple of "
                f"action_repeat ({action_repeat})"
            )
        with warnings.catch_warnings():  # "Brax ... not actively being maintained" (mjcf.load)
            warnings.filterwarnings("ignore", "Brax System", UserWarning)
            self._base = envs.get_environment(name, **kwargs)
        self._env = EpisodeWrapper(self._base, episode_length, action_repeat)
        self.max_episode_steps: int = episode_length // action_repeat
        first = jax.eval_shape(self._env.reset, jax.random.PRNGKey(0))
        register_for_checkpoints(first)
        obs = first.obs
        if not hasattr(obs, "shape"):
            raise ValueError(f"{self.name}: observations {obs!r} are not one array")
        self.observation_shape: tuple[int, ...] = tuple(obs.shape)
        size = int(self._base.action_size)
        self.action_space: ActionSpace = Box(
            (size,), np.full(size, -1.0, np.float32), np.full(size, 1.0, np.float32)
        )

    def reset(self, key: jax.Array) -> tuple[jax.Array, Any]:
        """`key -> (obs [*observation_shape] f32, Brax State)`."""
        state = self._env.reset(key)
        return jnp.asarray(state.obs, jnp.float32), state

    def step(self, key: jax.Array, state: Any, action: jax.Array):
        """One transition with auto-reset (`key` draws the next episode's initial state):
        `(obs, state, reward f32, terminated bool, truncated bool, final_obs)`."""
        stepped = self._env.step(state, action)
        done = stepped.done > 0
        truncated = done & (stepped.info["truncation"] > 0)
        terminated = done & ~truncated
        first = self._env.reset(key)
        final_obs = jnp.asarray(stepped.obs, jnp.float32)
        obs = jnp.where(done, jnp.asarray(first.obs, jnp.float32), final_obs)
        new_state = _select(done, first, stepped)
        reward = jnp.asarray(stepped.reward, jnp.float32)
        return obs, new_state, reward, terminated, truncated, final_obs

    def __repr__(self):
        return f"BraxEnv({self.name!r}, obs={self.observation_shape}, actions={self.action_space})"


# ---- Jumanji ---------------------------------------------------------------------------------
def import_jumanji() -> Any:
    """`jumanji`; `ImportError` naming the extra when it is not installed."""
    try:
        import jumanji
    except ImportError:
        raise ImportError("Jumanji envs need Jumanji: pip install 'jaxplan[jumanji]'") from None
    return jumanji


class JumanjiEnv:
    """A Jumanji environment (`jumanji.make(name, **kwargs)`) behind the contract.

    - Observations: Jumanji's observation is a structure (Snake: `grid [12, 12, 5]`,
      `step_count`, `action_mask [4]`); the adapter flattens every field, in the observation's
      field order, into one f32 vector (`observation_fields` lists each field's name and
      shape; a single-array observation keeps its shape). The action mask is thus a feature
      the policy sees, not a constraint: an invalid action does what the env makes of it
      (Snake ends the episode).
    - Actions: `DiscreteArray(n)` -> `Discrete(n)`; `MultiDiscreteArray(num_values)` ->
      `Discrete(prod(num_values))`, the index unravelled row-major (Minesweeper's 10 x 10
      cells: action `10 * row + col`); a float `BoundedArray` -> `Box` with its bounds.
    - Episodes: a `TimeStep` with `step_type` LAST ends one: *truncated* when its `discount`
      is non-zero (Jumanji's `truncation`) or the env's step counter reached its `time_limit`
      (most Jumanji envs, Snake and Maze among them, report a time-limit end as a
      termination), else *terminated*. `max_episode_steps` is the env's `time_limit` (None if
      it has none, e.g. Game2048).
    - `env_config`: the env's constructor arguments (Snake: `num_rows`, `num_cols`,
      `time_limit`).
    """

    def __init__(self, name: str, **kwargs: Any):
        jumanji = import_jumanji()
        _known_name("Jumanji", JUMANJI_PREFIX, name, sorted(jumanji.registered_environments()))
        self.name = JUMANJI_PREFIX + name
        if kwargs:
            from jumanji import registration

            spec = registration._REGISTRY[name]
            cls = registration.load(spec.entry_point)
            valid = [k for k in _init_params(cls) if k not in ("viewer", "generator")]
            _unknown_keys(self.name, kwargs, valid)
        self._env = jumanji.make(name, **kwargs)
        unwrapped = self._env.unwrapped
        limit = getattr(unwrapped, "time_limit", None)
        self.max_episode_steps: int | None = (
            int(limit) if isinstance(limit, int | np.integer) and limit > 0 else None
        )
        state, timestep = jax.eval_shape(self._env.reset, jax.random.PRNGKey(0))
        register_for_checkpoints(state)
        paths = jax.tree_util.tree_flatten_with_path(timestep.observation)[0]
        self.observation_fields: tuple[tuple[str, tuple[int, ...]], ...] = tuple(
            (_field_name(path), tuple(leaf.shape)) for path, leaf in paths
        )
        if len(paths) == 1:
            self.observation_shape: tuple[int, ...] = tuple(paths[0][1].shape)
        else:
            size = sum(math.prod(shape) for _, shape in self.observation_fields)
            self.observation_shape = (size,)
        self._action_spec = self._env.action_spec
        self.action_space: ActionSpace = _jumanji_space(self.name, self._action_spec)
        self._num_values = getattr(self._action_spec, "num_values", None)
        self._multi_discrete = type(self._action_spec).__name__ == "MultiDiscreteArray"
        reward = self._env.reward_spec
        if tuple(reward.shape) != ():
            raise ValueError(
                f"{self.name}: rewards of shape {tuple(reward.shape)} (one per agent) are not "
                "supported; the adapter takes single-agent envs (a scalar reward)"
            )

    def _obs(self, observation: Any) -> jax.Array:
        leaves = jax.tree.leaves(observation)
        if len(leaves) == 1:
            return jnp.asarray(leaves[0], jnp.float32).reshape(self.observation_shape)
        return jnp.concatenate([jnp.asarray(x, jnp.float32).ravel() for x in leaves])

    def _action(self, action: jax.Array) -> jax.Array:
        """A jaxplan action as Jumanji's: a multi-discrete index unravelled, a `Box` action
        in the spec's shape and dtype."""
        if not self._multi_discrete:
            return action.reshape(self._action_spec.shape).astype(self._action_spec.dtype)
        dims = tuple(int(n) for n in np.asarray(self._num_values).ravel())
        idx = jnp.stack(jnp.unravel_index(action, dims)).astype(self._action_spec.dtype)
        return idx.reshape(self._action_spec.shape)

    def reset(self, key: jax.Array) -> tuple[jax.Array, Any]:
        """`key -> (obs [*observation_shape] f32, Jumanji state)`."""
        state, timestep = self._env.reset(key)
        return self._obs(timestep.observation), state

    def step(self, key: jax.Array, state: Any, action: jax.Array):
        """One transition with auto-reset (`key` draws the next episode's initial state):
        `(obs, state, reward f32, terminated bool, truncated bool, final_obs)`."""
        stepped, timestep = self._env.step(state, self._action(action))
        done = timestep.last()
        at_limit = jnp.zeros((), bool)
        if self.max_episode_steps is not None and hasattr(stepped, "step_count"):
            at_limit = stepped.step_count >= self.max_episode_steps
        truncated = done & ((timestep.discount != 0) | at_limit)
        terminated = done & ~truncated
        first, first_timestep = self._env.reset(key)
        final_obs = self._obs(timestep.observation)
        obs = jnp.where(done, self._obs(first_timestep.observation), final_obs)
        new_state = _select(done, first, stepped)
        reward = jnp.asarray(timestep.reward, jnp.float32).reshape(())
        return obs, new_state, reward, terminated, truncated, final_obs

    def __repr__(self):
        return (
            f"JumanjiEnv({self.name!r}, obs={self.observation_shape}, actions={self.action_space})"
        )


def _field_name(path: tuple) -> str:
    """`observation.grid`'s key path as "grid" (nested: "agent_position.row")."""
    return ".".join(str(getattr(k, "name", getattr(k, "key", getattr(k, "idx", k)))) for k in path)


def _jumanji_space(name: str, spec: Any) -> ActionSpace:
    kind = type(spec).__name__
    if kind == "DiscreteArray":
        return Discrete(int(spec.num_values))
    if kind == "MultiDiscreteArray":
        n = math.prod(int(v) for v in np.asarray(spec.num_values).ravel())
        if n > np.iinfo(np.int32).max:
            raise ValueError(
                f"{name}: the multi-discrete action {spec.name!r} has {n} combinations, more "
                "than one int32 Discrete action can index"
            )
        return Discrete(n)
    if kind == "BoundedArray" and np.issubdtype(spec.dtype, np.floating):
        return Box.bounded(spec.shape, spec.minimum, spec.maximum)
    raise ValueError(
        f"{name}: action spec {spec!r} is not supported (jaxplan maps DiscreteArray, "
        "MultiDiscreteArray and float BoundedArray)"
    )
