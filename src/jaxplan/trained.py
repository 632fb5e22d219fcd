"""A finished (or interrupted) run, loaded from its output folder: config, plan and state.

```python
import jaxplan.trained

run = jaxplan.trained.load_run("runs/ppo-cartpole")
params = run.policy_params()                 # {policy_id: params}, leading seed axis if several
metrics = run.evaluate(num_episodes=20)      # per seed: RLlib's evaluation metrics
```
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import serialization

from jaxplan.algorithms import get_algorithm
from jaxplan.config import TrainerConfig
from jaxplan.flow import Plan
from jaxplan.results import read_checkpoint, with_empty_fields
from jaxplan.workers import PlanState

_ONE_DEVICE = {"num_devices": 0, "num_gpus": 0, "_fake_gpus": False}


@dataclasses.dataclass
class TrainedRun:
    """A run's resolved `config`, its `plan` rebuilt on one device, its `seeds` and its
    checkpointed `state` (host arrays, leading seed axis when there are several seeds) of
    training iteration `iteration`."""

    directory: Path
    iteration: int
    config: TrainerConfig
    plan: Plan
    seeds: list[int]
    state: PlanState

    def policy_params(self) -> dict[str, Any]:
        """`{policy_id: params}` of the checkpoint (leading seed axis with several seeds)."""
        return {pid: ps.params for pid, ps in self.state.policies.items()}

    def seed_params(self, seed: int | None = None) -> dict[str, Any]:
        """`{policy_id: params}` of the run seed `seed` (default: the run's first seed);
        raises `ValueError` listing the run's seeds when it is not one of them."""
        return self._of_seed(self.policy_params(), seed)

    def seed_filters(self, seed: int | None = None) -> dict[str, Any]:
        """`{policy_id: MeanStd}`: the observation filters of run seed `seed` (default: the
        run's first seed) as they were at the checkpoint (`{}` without `observation_filter`);
        a trained policy applies them frozen."""
        return self._of_seed(self.state.obs_filters, seed)

    def _of_seed(self, tree: Any, seed: int | None) -> Any:
        seed = self.seeds[0] if seed is None else seed
        if isinstance(seed, bool) or seed not in self.seeds:
            raise ValueError(
                f"{self.directory}: seed {seed!r} is not one of the run's seeds {self.seeds}"
            )
        if len(self.seeds) == 1:
            return tree
        i = self.seeds.index(seed)
        return jax.tree.map(lambda x: x[i], tree)

    def evaluation_env(self, env_config: dict | None = None):
        """The run's evaluation env: its env with `evaluation_config.env_config` over its
        `env_config`, and `env_config` over both."""
        from jaxplan.multi_agent import make_env

        config = self.config
        overrides = {**config.evaluation_config.env_config, **(env_config or {})}
        return make_env(config.env, {**config.env_config, **overrides})

    def evaluate(
        self,
        *,
        num_episodes: int = 10,
        explore: bool = False,
        seed: int = 0,
        seeds: list[int] | None = None,
        env_config: dict | None = None,
    ) -> list[dict]:
        """Plays `num_episodes` episodes per seed with that seed's trained params (on the
        run's evaluation env, see `evaluation_env`; `env_config` over its config), one
        compiled program for all seeds (`seeds`: the run seeds to evaluate, default all);
        returns per seed RLlib's evaluation metrics (Python numbers, plus `seed`).
        Deterministic actions unless `explore`; the episodes' key is
        `fold_in(PRNGKey(seed), run seed)`. Observations go through the seed's filters,
        frozen (`seed_filters`)."""
        from jaxplan.stages.evaluation import evaluate
        from jaxplan.stages.metrics import result_to_host

        seeds = self.seeds if seeds is None else list(seeds)
        params = [self.seed_params(s) for s in seeds]  # checks the seeds
        filters = [self.seed_filters(s) for s in seeds]
        workers = self.plan.workers
        changed = env_config or self.config.evaluation_config.env_config
        env = self.evaluation_env(env_config) if changed else None

        def one(params, filters, key):
            return evaluate(
                workers,
                params,
                key,
                num_episodes=num_episodes,
                explore=explore,
                env=env,
                filters=filters,
            )

        base = jax.random.PRNGKey(seed)
        keys = jax.vmap(lambda s: jax.random.fold_in(base, s))(np.asarray(seeds))
        params, filters = jax.tree.map(lambda *xs: np.stack(xs), *zip(params, filters, strict=True))
        out = jax.device_get(jax.jit(jax.vmap(one))(params, filters, keys))
        return [
            {"seed": s, **result_to_host(jax.tree.map(lambda x, i=i: x[i], out))}
            for i, s in enumerate(seeds)
        ]


def read_params(directory: str | os.PathLike) -> dict[str, Any]:
    """The `params.json` of the run in `directory` (its algorithm, seeds and config); raises
    `ValueError` naming the file when it is missing or not a jaxplan run's (of a known
    algorithm)."""
    path = Path(directory) / "params.json"
    try:
        params = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read the run's params ({e})") from None
    if "algorithm" not in params or "config" not in params or "seeds" not in params:
        raise ValueError(f"{path}: not the params of a jaxplan run")
    try:
        get_algorithm(params["algorithm"])
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return params


def load_run(directory: str | os.PathLike, which: str | int = "latest") -> TrainedRun:
    """Reads `directory/params.json` (the config and seeds) and one of its checkpoints (the
    whole run state; `which`: `"latest"`, `"best"` or a kept iteration, see
    `jaxplan.results.read_checkpoint`) and rebuilds the run's plan on one device (device
    settings do not change the state). Raises `ValueError` naming the file when either is
    missing or not a jaxplan run's."""
    directory = Path(directory)
    params = read_params(directory)
    algorithm = get_algorithm(params["algorithm"])
    config = algorithm.config_class.from_dict(params["config"]).updated(_ONE_DEVICE)
    plan = algorithm.plan(config)
    seeds = [int(s) for s in params["seeds"]]
    raw = read_checkpoint(directory, which)
    init = plan.init if len(seeds) == 1 else jax.vmap(plan.init)
    keys = jax.vmap(jax.random.PRNGKey)(np.asarray(seeds))
    target = jax.eval_shape(init, keys[0] if len(seeds) == 1 else keys)
    target = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), target)
    # fields added after the checkpoint was written (obs_filters, policy_states), unused here
    saved = with_empty_fields(serialization.to_state_dict(target), raw["state"])
    try:
        state = serialization.from_state_dict(target, saved)
    except (ValueError, KeyError) as e:
        raise ValueError(f"{directory}: the checkpoint does not fit the run's plan: {e}") from None
    for (path, x), t in zip(
        jax.tree_util.tree_flatten_with_path(state)[0], jax.tree.leaves(target), strict=True
    ):
        if np.shape(x) != t.shape:
            raise ValueError(
                f"{directory}: the checkpoint's state{jax.tree_util.keystr(path)} has shape "
                f"{list(np.shape(x))}, the run's plan {list(t.shape)}"
            )
    iteration = int(np.max(state.counters.training_iteration))
    return TrainedRun(directory, iteration, config, plan, seeds, state)
