"""The algorithms `jaxplan train <name>` knows: each has a module with an `ALGORITHM`
(`Algorithm`: its config class, tuned presets, workers and execution plan), imported only when
asked for, so the CLI can list them and check flags before JAX loads."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Callable, Mapping
from typing import Any

MODULES = {
    "ppo": "jaxplan.ppo.plan",
    "a2c": "jaxplan.a2c.plan",
    "a3c": "jaxplan.a3c.plan",
    "impala": "jaxplan.impala.plan",
    "appo": "jaxplan.appo.plan",
    "dqn": "jaxplan.dqn.plan",
    "sac": "jaxplan.sac.plan",
}
"""CLI name -> the module whose `ALGORITHM` describes it."""

ALGORITHM_NAMES = tuple(MODULES)


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """One algorithm: `name` is RLlib's trainer name (`"PPO"`, saved in a run's params.json),
    `config_class` its config (a `jaxplan.config.TrainerConfig`), `presets` its tuned
    overrides per env id, `build_workers(config) -> WorkerSet` and
    `execution_plan(workers, config) -> Plan` its plan (RLlib's names), and
    `describe(config) -> str` what one iteration does after sampling (one line, for the CLI's
    header, e.g. `train_batch(config)` and the SGD)."""

    name: str
    config_class: type
    presets: Mapping[str, Mapping[str, Any]]
    build_workers: Callable[[Any], Any]
    execution_plan: Callable[[Any, Any], Any]
    describe: Callable[[Any], str]

    def preset_config(self, env: str, overrides: Mapping[str, Any] | None = None) -> Any:
        """RLlib's defaults, then the tuned preset for `env` (if any), then `overrides`."""
        from jaxplan.config import preset_of

        return preset_of(self.config_class, self.presets, env, overrides)

    def plan(self, config: Any = None, *, env: str | None = None) -> Any:
        """The plan for a config: a `config_class` instance, or an RLlib-style dict (or None)
        applied on top of the tuned preset for its env (`env`, else the dict's `"env"`, else
        the default). `env` given with a config instance replaces its env."""
        if dataclasses.is_dataclass(config) and type(config) is not self.config_class:
            raise ValueError(
                f"{self.name} needs a config of type {self.config_class.__name__} (or a dict "
                f"of its keys), got {type(config).__name__}"
            )
        if not isinstance(config, self.config_class):
            overrides = dict(config or {})
            name = env or overrides.get("env", self.config_class.env)
            config = self.preset_config(name, overrides)
        elif env is not None and env != config.env:
            config = config.updated({"env": env})
        return self.execution_plan(self.build_workers(config), config)


def train_batch(config: Any) -> str:
    """`"train batch >= N env steps"` (or agent steps): the on-policy algorithms' header."""
    count = config.multiagent.count_steps_by.replace("_", " ")
    return f"train batch >= {config.train_batch_size} {count}"


def get_algorithm(name: str) -> Algorithm:
    """The algorithm called `name` (the CLI's `ppo`, or RLlib's `PPO`); `ValueError` naming
    the known ones otherwise."""
    key = str(name).lower()
    if key not in MODULES:
        close = difflib.get_close_matches(key, ALGORITHM_NAMES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown algorithm {name!r}{hint} Known: {', '.join(ALGORITHM_NAMES)}")
    return importlib.import_module(MODULES[key]).ALGORITHM
