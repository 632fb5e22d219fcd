"""Environments: the single-agent env contract, the gymnax adapter `Env`, and your own envs.

The contract (one env; callers `vmap` over actor groups and envs, and `jit` everything):

- `observation_shape: tuple[int, ...]`: the shape of one observation.
- `action_space`: `Discrete(n)` (actions are int32 scalars in `[0, n)`) or `Box(shape, low,
  high)` (float32 arrays of `shape`; with `normalize_actions` the policy's output is mapped
  into the bounds).
- `max_episode_steps: int | None` (optional, default None): the step limit after which the env
  truncates an episode; evaluation uses it to bound its episodes.
- `reset(key) -> (obs, state)`: `obs` float32 `[*observation_shape]`, `state` any pytree of
  arrays (static shapes and dtypes).
- `step(key, state, action) -> (obs, state, reward, terminated, truncated, final_obs)`:
  `reward` a float32 scalar, `terminated` and `truncated` bool scalars, `obs` and `final_obs`
  float32 `[*observation_shape]`, `state` the same pytree structure, shapes and dtypes as
  `reset`'s. The env resets itself when an episode ends (`terminated | truncated`): `obs` and
  `state` are then the first of the next episode, and `final_obs` the observation the step
  actually reached, the last of the ended episode; otherwise `final_obs == obs`.
  `terminated`: the episode reached a terminal state (GAE cuts the value: nothing follows);
  `truncated`: it was cut short, e.g. by the time limit (GAE bootstraps from
  `V(final_obs)`). At most one of the two is true: an episode that terminates on its last
  allowed step is terminated.

`Env` wraps a gymnax env (`Env("CartPole-v1")`) to this contract; `"brax:<name>"` and
`"jumanji:<id>"` name Brax and Jumanji envs behind it (`jaxplan.env_adapters`, optional
extras). Your own env, any object
that obeys it (`SingleAgentEnv`), is given a name with `register_env(name, creator)`, RLlib's
`register_env`: `creator(env_config: dict) -> env`; then `PPOConfig(env=name, env_config=...)`
uses it wherever a gymnax name would be (`jaxplan.multi_agent.make_env` resolves names). An env
name can also be an import path `"package.module:creator"` (the CLI's `--env`; a checkpoint
saves the name, so loading a run resolves it again: register the name in the loading process,
or use an import path). A creator may also return a multi-agent env
(`jaxplan.multi_agent`'s contract, `is_multi_agent = True`). A created env is checked against
the contract abstractly (`jax.eval_shape`, nothing runs) when it is made, before anything
compiles: `check_env` raises `ValueError` naming what is wrong.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Discrete:
    """`n` actions, as int32 scalars in [0, n)."""

    n: int


@dataclasses.dataclass(frozen=True)
class Box:
    """Continuous actions of `shape` bounded by `low`/`high` (numpy float arrays)."""

    shape: tuple[int, ...]
    low: Any
    high: Any

    @classmethod
    def bounded(cls, shape: tuple[int, ...], low: Any, high: Any) -> Box:
        """A Box of `shape` (`()` -> `(1,)`) with `low`/`high` broadcast to it as float32."""
        shape = tuple(shape) or (1,)
        low = np.broadcast_to(np.asarray(low, np.float32), shape).copy()
        high = np.broadcast_to(np.asarray(high, np.float32), shape).copy()
        return cls(shape, low, high)

    def __hash__(self):  # numpy arrays are not hashable; bounds are fixed per env
        return hash((self.shape, np.asarray(self.low).tobytes(), np.asarray(self.high).tobytes()))

    def __eq__(self, other):
        return (
            isinstance(other, Box)
            and self.shape == other.shape
            and np.array_equal(self.low, other.low)
            and np.array_equal(self.high, other.high)
        )


ActionSpace = Discrete | Box


@runtime_checkable
class SingleAgentEnv(Protocol):
    """The single-agent env contract (see the module docstring); `max_episode_steps` is
    optional (None: no limit)."""

    observation_shape: tuple[int, ...]
    action_space: ActionSpace

    def reset(self, key: jax.Array) -> tuple[jax.Array, Any]: ...

    def step(
        self, key: jax.Array, state: Any, action: jax.Array
    ) -> tuple[jax.Array, Any, jax.Array, jax.Array, jax.Array, jax.Array]: ...


class Env:
    """A single-agent gymnax environment with fixed `EnvParams` (static at trace time).

    Shapes are for one env; callers `vmap` over workers and envs.
    """

    def __init__(self, name: str, **env_params: Any):
        from jaxplan._deferred_imports import import_gymnax

        gymnax = import_gymnax()

        if name not in gymnax.registered_envs:
            close = difflib.get_close_matches(name, gymnax.registered_envs, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"Unknown env {name!r}.{hint} Valid gymnax envs: "
                + ", ".join(gymnax.registered_envs)
            )
        self.name = name
        self._env, params = gymnax.make(name)
        if env_params:
            unknown = [k for k in env_params if not hasattr(params, k)]
            if unknown:
                raise ValueError(
                    f"Unknown env_config key(s) {unknown} for {name}; valid keys: "
                    f"{', '.join(f.name for f in dataclasses.fields(params))}"
                )
            params = params.replace(
                **{k: _param_value(name, k, v, getattr(params, k)) for k, v in env_params.items()}
            )
        self.params = params
        obs_space = self._env.observation_space(params)
        self.observation_shape: tuple[int, ...] = tuple(obs_space.shape)
        self.action_space: ActionSpace = _convert_space(name, self._env.action_space(params))

    @property
    def max_episode_steps(self) -> int | None:
        """Steps after which an episode is truncated (gymnax's `max_steps_in_episode`), or
        None if the env has no limit."""
        limit = getattr(self.params, "max_steps_in_episode", None)
        return None if limit is None else int(limit)

    @property
    def gymnax_env(self) -> tuple[Any, Any]:
        """The wrapped gymnax env and its `EnvParams` (for gymnax's renderer)."""
        return self._env, self.params

    def reset(self, key: jax.Array) -> tuple[jax.Array, Any]:
        """`key -> (obs [*observation_shape] float32, env_state)`."""
        obs, state = self._env.reset(key, self.params)
        return jnp.asarray(obs, jnp.float32).reshape(self.observation_shape), state

    def step(self, key: jax.Array, state: Any, action: jax.Array):
        """One transition with auto-reset.

        Returns `(obs, state, reward f32, terminated bool, truncated bool, final_obs)`; after an
        episode end `obs` is the first observation of the next episode and `final_obs` the last
        one of the ended episode. Otherwise `final_obs == obs`.
        """
        obs, state, reward, terminated, truncated, info = self._env.step(
            key, state, action, self.params
        )
        final_obs = jnp.asarray(info["final_observation"], jnp.float32)
        return (
            jnp.asarray(obs, jnp.float32).reshape(self.observation_shape),
            state,
            jnp.asarray(reward, jnp.float32),
            jnp.asarray(terminated, bool),
            # an episode that ends by termination on its last allowed step is terminated
            jnp.logical_and(jnp.asarray(truncated, bool), jnp.logical_not(terminated)),
            final_obs.reshape(self.observation_shape),
        )

    def __repr__(self):
        return f"Env({self.name!r}, obs={self.observation_shape}, actions={self.action_space})"


def _param_value(env: str, key: str, value: Any, default: Any) -> Any:
    """`env_config[key]` as the type of the env's default param (a bool, an int, a float, or
    an array of that shape); raises `ValueError` naming the key and the expected type."""
    expected = None
    if isinstance(default, bool):
        if not isinstance(value, bool):
            expected = "true or false"
    elif isinstance(default, int | float):
        integral = isinstance(value, float) and value.is_integer()
        if isinstance(value, bool) or not isinstance(value, int | float):
            expected = "an integer" if isinstance(default, int) else "a number"
        elif isinstance(default, int):
            if not (isinstance(value, int) or integral):
                expected = "an integer"
            value = int(value) if expected is None else value
        else:
            value = float(value)
    else:  # an array param (e.g. Acrobot's available_torque)
        shape = np.shape(default)
        try:
            array = np.asarray(value, dtype=np.asarray(default).dtype)
            ok = array.shape == shape and not isinstance(value, str | bool)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            expected = f"numbers of shape {list(shape)}"
        value = jnp.asarray(array) if ok else value
    if expected is not None:
        raise ValueError(
            f"env_config[{key!r}] = {value!r}: {env}'s {key} must be {expected} "
            f"(default {np.asarray(default).tolist()!r})"
        )
    return value


def _convert_space(name: str, space: Any) -> ActionSpace:
    from gymnax.environments import spaces

    if isinstance(space, spaces.Discrete):
        return Discrete(int(space.n))
    if isinstance(space, spaces.Box):
        return Box.bounded(space.shape, space.low, space.high)
    raise ValueError(
        f"{name}: action space {type(space).__name__} is not supported "
        "(jaxplan supports Discrete and Box)"
    )


# ---- your own envs --------------------------------------------------------------------------
EnvCreator = Callable[[dict], Any]
"""`creator(env_config: dict) -> env` obeying the contract (RLlib's env creator)."""

_REGISTRY: dict[str, EnvCreator] = {}


def register_env(name: str, creator: EnvCreator) -> None:
    """Makes `PPOConfig(env=name, env_config=...)` build `creator(dict(env_config))` (RLlib's
    `ray.tune.register_env`); the env must obey the contract (module docstring), checked when
    it is made. Registering a name again replaces its creator; a registered name takes
    precedence over a gymnax env of the same name."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_env: the name must be a non-empty string, got {name!r}")
    if not callable(creator):
        raise ValueError(
            f"register_env({name!r}, ...): expected a creator env_config (dict) -> env, "
            f"got {creator!r}"
        )
    _REGISTRY[name] = creator


def registered_envs() -> list[str]:
    """The names given to `register_env`, sorted."""
    return sorted(_REGISTRY)


def env_creator(name: str) -> EnvCreator | None:
    """The creator a name resolves to: a registered name's, or for an import path
    `"package.module:attribute"` that attribute; None for other names (gymnax ids and the
    like). `ValueError` when an import path cannot be imported or is not callable."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" not in name:
        return None
    module_name, _, attr = name.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as e:  # noqa: BLE001 - any import failure is the same user error
        known = ", ".join(map(repr, registered_envs())) or "none"
        raise ValueError(
            f"env {name!r}: cannot import it ({type(e).__name__}: {e}); registered envs: "
            f"{known}. Register the env under this name (jaxplan.register_env) in this "
            "process, or give an importable 'package.module:creator'"
        ) from None
    if not callable(obj):
        raise ValueError(f"env {name!r}: {obj!r} is not a creator env_config (dict) -> env")
    return obj


def make_custom_env(name: str, creator: EnvCreator, env_config: Mapping[str, Any]) -> Any:
    """`creator(dict(env_config))`, checked against the contract (`check_env`)."""
    env = creator(dict(env_config))
    if env is None:
        raise ValueError(f"env {name!r}: the creator returned None, not an env")
    check_env(env, name)
    return env


def _describe(x: Any) -> str:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"{np.dtype(x.dtype).name}{list(x.shape)}"
    return type(x).__name__


def _abstract(where: str, call: str, fn: Callable, *args: Any) -> Any:
    """`jax.eval_shape(fn, *args)` (nothing runs); a failure is a `ValueError` naming `call`."""
    try:
        return jax.eval_shape(fn, *args)
    except Exception as e:  # noqa: BLE001 - report any failure of the user's env as one error
        raise ValueError(f"{where}: {call} failed: {type(e).__name__}: {e}") from e


def _check_space(where: str, space: Any) -> None:
    if isinstance(space, Discrete):
        if not isinstance(space.n, int | np.integer) or space.n < 1:
            raise ValueError(f"{where}: action_space Discrete(n={space.n!r}) needs an int n >= 1")
        return
    if isinstance(space, Box):
        shape = space.shape
        if not isinstance(shape, tuple) or not all(isinstance(d, int) and d > 0 for d in shape):
            raise ValueError(f"{where}: action_space Box shape {shape!r} is not a tuple of ints")
        for bound in ("low", "high"):
            try:
                np.broadcast_to(np.asarray(getattr(space, bound), np.float32), shape)
            except (TypeError, ValueError):
                raise ValueError(
                    f"{where}: action_space Box {bound} {getattr(space, bound)!r} does not "
                    f"broadcast to its shape {shape}"
                ) from None
        return
    raise ValueError(
        f"{where}: action_space is {space!r}; expected jaxplan.envs.Discrete(n) or "
        "jaxplan.envs.Box(shape, low, high)"
    )


def check_env(env: Any, name: str) -> None:
    """Checks `env` against the contract (the module docstring; `jaxplan.multi_agent`'s for a
    multi-agent env) with `jax.eval_shape`, so nothing runs or compiles: the attributes, the
    arity of `reset`/`step`, every shape and dtype, and that `step` keeps `reset`'s state
    structure. Raises `ValueError` naming the env and what is wrong."""
    where = f"env {name!r}"
    if getattr(env, "is_multi_agent", False):
        _check_multi_agent(env, where)
        return
    for attr in ("observation_shape", "action_space", "reset", "step"):
        if not hasattr(env, attr):
            raise ValueError(
                f"{where}: {type(env).__name__} has no {attr!r}; an env needs observation_shape, "
                "action_space, reset(key) and step(key, state, action) (jaxplan.envs)"
            )
    shape = env.observation_shape
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError(f"{where}: observation_shape {shape!r} is not a tuple of ints")
    _check_space(where, env.action_space)
    limit = getattr(env, "max_episode_steps", None)
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ValueError(f"{where}: max_episode_steps {limit!r} is not None or an int >= 1")
    key = jax.eval_shape(lambda: jax.random.PRNGKey(0))
    obs_want = f"float32{list(shape)}"

    def check_obs(what: str, x: Any) -> None:
        if _describe(x) != obs_want:
            raise ValueError(
                f"{where}: {what} is {_describe(x)}; observation_shape {shape} needs {obs_want}"
            )

    out = _abstract(where, "reset(key)", env.reset, key)
    if not isinstance(out, tuple) or len(out) != 2:
        got = f"{len(out)} values" if isinstance(out, tuple) else _describe(out)
        raise ValueError(f"{where}: reset(key) must return (obs, state), got {got}")
    obs, state = out
    check_obs("reset's obs", obs)
    space = env.action_space
    action = (
        jax.ShapeDtypeStruct((), jnp.int32)
        if isinstance(space, Discrete)
        else jax.ShapeDtypeStruct(tuple(space.shape), jnp.float32)
    )
    out = _abstract(
        where, f"step(key, state, action {_describe(action)})", env.step, key, state, action
    )
    fields = "(obs, state, reward, terminated, truncated, final_obs)"
    if not isinstance(out, tuple) or len(out) != 6:
        got = f"{len(out)} values" if isinstance(out, tuple) else _describe(out)
        raise ValueError(f"{where}: step(key, state, action) must return {fields}, got {got}")
    obs, new_state, reward, terminated, truncated, final_obs = out
    check_obs("step's obs", obs)
    check_obs("step's final_obs", final_obs)
    for what, x, want in (
        ("reward", reward, "float32[]"),
        ("terminated", terminated, "bool[]"),
        ("truncated", truncated, "bool[]"),
    ):
        if _describe(x) != want:
            raise ValueError(f"{where}: step's {what} is {_describe(x)}, expected {want}")
    _check_same_state(where, state, new_state)


def _check_same_state(where: str, state: Any, new_state: Any) -> None:
    """`step`'s state must be a pytree like `reset`'s (rollouts carry it through `lax.scan`)."""
    if jax.tree.structure(state) != jax.tree.structure(new_state):
        raise ValueError(
            f"{where}: step's state {jax.tree.structure(new_state)} has another structure "
            f"than reset's {jax.tree.structure(state)}"
        )
    paths = jax.tree_util.tree_flatten_with_path(state)[0]
    for (path, a), b in zip(paths, jax.tree.leaves(new_state), strict=True):
        if _describe(a) != _describe(b):
            raise ValueError(
                f"{where}: state{jax.tree_util.keystr(path)} is {_describe(a)} after reset "
                f"but {_describe(b)} after step (shapes and dtypes must stay fixed)"
            )


def _check_multi_agent(env: Any, where: str) -> None:
    """The multi-agent contract (`jaxplan.multi_agent`), abstractly."""
    for attr in ("agents", "observation_shapes", "action_spaces", "reset", "step"):
        if not hasattr(env, attr):
            raise ValueError(f"{where}: multi-agent env {type(env).__name__} has no {attr!r}")
    agents = tuple(env.agents)
    for a in agents:
        if a not in env.observation_shapes or a not in env.action_spaces:
            raise ValueError(f"{where}: agent {a!r} has no observation shape or action space")
        _check_space(f"{where} agent {a!r}", env.action_spaces[a])
    key = jax.eval_shape(lambda: jax.random.PRNGKey(0))
    out = _abstract(where, "reset(key)", env.reset, key)
    if not isinstance(out, tuple) or len(out) != 2:
        raise ValueError(f"{where}: reset(key) must return (obs, state)")
    obs, state = out

    def check_obs(what, obs):
        for a in agents:
            want = f"float32{list(env.observation_shapes[a])}"
            got = _describe(obs.get(a)) if isinstance(obs, Mapping) else _describe(obs)
            if got != want:
                raise ValueError(f"{where}: {what}[{a!r}] is {got}, expected {want}")

    check_obs("reset's obs", obs)
    actions = {
        a: jax.ShapeDtypeStruct((), jnp.int32)
        if isinstance(env.action_spaces[a], Discrete)
        else jax.ShapeDtypeStruct(tuple(env.action_spaces[a].shape), jnp.float32)
        for a in agents
    }
    out = _abstract(where, "step(key, state, actions)", env.step, key, state, actions)
    if not isinstance(out, tuple) or len(out) != 6:
        raise ValueError(
            f"{where}: step must return (obs, state, rewards, terminated, truncated, final_obs)"
        )
    obs, new_state, rewards, terminated, truncated, final_obs = out
    check_obs("step's obs", obs)
    check_obs("step's final_obs", final_obs)
    for what, x, want in (
        ("rewards", rewards, "float32[]"),
        ("terminated", terminated, "bool[]"),
        ("truncated", truncated, "bool[]"),
    ):
        for a in agents:
            got = _describe(x.get(a)) if isinstance(x, Mapping) else _describe(x)
            if got != want:
                raise ValueError(f"{where}: step's {what}[{a!r}] is {got}, expected {want}")
    _check_same_state(where, state, new_state)
