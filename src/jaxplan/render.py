"""Animations of trained policies: record an episode's env states, render them with gymnax's
`Visualizer` to a GIF (`jaxplan rollout DIR --gif out.gif`).

Rendering needs the `render` extra (`pip install 'jaxplan[render]'`: matplotlib and pillow,
and pygame for the classic-control envs, which gymnax draws with Gymnasium's renderer); it is
imported only when a GIF is written.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxplan.stages.acting import step_envs
from jaxplan.stages.evaluation import episode_step_limit, evaluation_workers
from jaxplan.workers import WorkerSet

CLASSIC_CONTROL = (
    "Acrobot-v1",
    "CartPole-v1",
    "Pendulum-v1",
    "MountainCar-v0",
    "MountainCarContinuous-v0",
)
RENDERABLE = (
    *CLASSIC_CONTROL,
    "Catch-bsuite",
    "Asterix-MinAtar",
    "Breakout-MinAtar",
    "Freeway-MinAtar",
    "Seaquest-MinAtar",
    "SpaceInvaders-MinAtar",
    "Pong-misc",
    "PointRobot-misc",
    "MetaMaze-misc",
    "FourRooms-misc",
)
"""The envs gymnax 1.0.1's `gymnax.visualize.Visualizer` draws."""


def check_renderable(env: Any) -> None:
    """Raises `ValueError` when gymnax cannot draw `env` (a multi-agent env, or a gymnax env
    its `Visualizer` does not know), `ImportError` naming the missing packages."""
    name = getattr(env, "name", type(env).__name__)
    if getattr(env, "is_multi_agent", False) or name not in RENDERABLE:
        raise ValueError(f"{name} cannot be rendered: gymnax draws only {', '.join(RENDERABLE)}")
    needed = ["matplotlib", "PIL"] + (["pygame"] if name in CLASSIC_CONTROL else [])
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        names = ["pillow" if m == "PIL" else m for m in missing]
        raise ImportError(
            f"rendering {name} needs {' and '.join(names)}: pip install 'jaxplan[render]'"
        )


def record_episode(
    workers: WorkerSet,
    params: dict[str, Any],
    key: jax.Array,
    *,
    num_episodes: int = 1,
    explore: bool = False,
    env: Any = None,
    max_steps: int | None = None,
    filters: dict[str, Any] | None = None,
) -> tuple[list[Any], np.ndarray]:
    """Episode 1 of `jaxplan.stages.evaluation.evaluate(workers, params, key, num_episodes=...,
    explore=..., env=...)` (the same actor groups and keys), stepped on the host: the env
    state each action was taken in (one per step, single-env pytrees) and the return after
    each step (`[steps]`, summed over agents), until the episode ends or `max_steps`
    (default: the env's limit). `filters`: the run's observation filters (frozen)."""
    ew = evaluation_workers(workers, num_episodes, env)
    limit = max_steps or episode_step_limit(ew.ma_env)
    k_reset, k_steps = jax.random.split(key)
    actors = jax.jit(ew.reset_actors)(k_reset)

    @jax.jit
    def step(params, actors, t):
        actors, _, (done, ep_return, _) = step_envs(
            ew,
            params,
            actors,
            jax.random.fold_in(k_steps, t),
            None,
            explore=explore,
            filters=filters,
        )
        return actors, done[0, 0], ep_return[0, 0].sum()

    states, returns = [], []
    for t in range(limit):
        states.append(jax.device_get(jax.tree.map(lambda x: x[0, 0], actors.env_state)))
        actors, done, ret = step(params, actors, np.int32(t))
        returns.append(float(ret))
        if bool(done):
            break
    return states, np.asarray(returns, np.float32)


def write_gif(env: Any, states: list[Any], returns: np.ndarray, path: str | os.PathLike) -> Path:
    """Draws `states` (`record_episode`) of the gymnax `env` (a `jaxplan.envs.Env`), one frame
    each titled with the step and the return so far, to the GIF `path` (written to a temporary
    file next to it and renamed, so `path` is never half-written). Returns `path`."""
    check_renderable(env)
    from gymnax.visualize import Visualizer

    path = Path(path)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.gif")  # the suffix picks the writer
    try:
        with _quiet_pygame():
            gymnax_env, env_params = env.gymnax_env
            Visualizer(gymnax_env, env_params, states, returns).animate(str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


@contextlib.contextmanager
def _quiet_pygame():
    """No audio or display for pygame while it draws off-screen (else every frame prints
    ALSA and XDG_RUNTIME_DIR errors on a headless machine); the user's settings win."""
    names = {"SDL_AUDIODRIVER": "dummy", "SDL_VIDEODRIVER": "dummy"}
    names["PYGAME_HIDE_SUPPORT_PROMPT"] = "1"
    saved = {k: os.environ.get(k) for k in names}
    for k, v in names.items():
        os.environ.setdefault(k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
