"""Environment adapter: a gymnax environment behind one small, explicit contract.

`Env.step` returns `(obs, state, reward, terminated, truncated, final_obs)`; `final_obs` is the
observation the transition actually reached (before any auto-reset), so a truncated episode can
bootstrap from `V(final_obs)` and a fragment cut from the value of the next observation.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

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
        shape = tuple(space.shape) or (1,)
        low = np.broadcast_to(np.asarray(space.low, np.float32), shape).copy()
        high = np.broadcast_to(np.asarray(space.high, np.float32), shape).copy()
        return Box(shape, low, high)
    raise ValueError(
        f"{name}: action space {type(space).__name__} is not supported "
        "(jaxplan supports Discrete and Box)"
    )
