"""Configuration shared by every algorithm: RLlib's common keys (`TrainerConfig`), how a key
declares its nature, traced hyper-parameters (`HParams`), presets, and the generic parsing,
coercion and validation behind every algorithm's config.

Each config field declares its nature once, as metadata: `traced` (a float hyper-parameter
copied into the algorithm's `HParams` inside `PlanState`, so `vmap`-able, and overridable per
policy), `per_policy` (static, overridable in `multiagent.policies[pid]`) or static (the
default). An algorithm's config subclasses `TrainerConfig` (adding its keys, or redefining a
common key's default); its per-policy keys and traced fields are derived from the metadata.
A config is static (frozen; it decides shapes). Invariants between the config and the env,
devices or plan stages are checked by those components when the plan is built, before
anything compiles.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import math
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

import jax.numpy as jnp
import yaml

from jaxplan.batch import DEFAULT_POLICY_ID
from jaxplan.filters import OBSERVATION_FILTERS
from jaxplan.models import ACTIVATIONS, CELL_TYPES, ConvFilter, model_name, resolve_model
from jaxplan.multi_agent import is_custom_env, is_multi_agent_env
from jaxplan.stages.concat_batches import COUNT_STEPS_BY

_ALIASES = {"lambda": "lambda_", "_fake_gpus": "fake_gpus"}
_KEYS = {field: key for key, field in _ALIASES.items()}


def _key(field_name: str) -> str:
    """The RLlib config key of a config field."""
    return _KEYS.get(field_name, field_name)


NATURE = "nature"
"""`Field.metadata` key of a config field's nature: "static" (default), "per_policy", "traced"."""


def traced(default: float) -> Any:
    """A traced hyper-parameter field: in the algorithm's `HParams` (vmap-able), overridable
    per policy."""
    return dataclasses.field(default=default, metadata={NATURE: "traced"})


def per_policy(default: Any) -> Any:
    """A static field that `multiagent.policies[pid]` may override."""
    return dataclasses.field(default=default, metadata={NATURE: "per_policy"})


def fields_of(cls: type, *natures: str) -> tuple[str, ...]:
    """Names of the fields of config dataclass `cls` with one of `natures`, in field order."""
    return tuple(
        f.name for f in dataclasses.fields(cls) if f.metadata.get(NATURE, "static") in natures
    )


Schedule = tuple[tuple[float, float], ...]
"""RLlib's schedule: `[[timestep, value], ...]` with non-decreasing timesteps."""

ClipRewards = bool | float | None
"""RLlib's `clip_rewards`: None/False (none), True (the sign) or a number c ([-c, c])."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """RLlib's `model` block (`jaxplan.models`: the networks and the custom-model contract).

    The default network follows the observation shape: rank-3 `[H, W, C]` observations get
    the vision net (`conv_filters` with `conv_activation`, flattened, then the fcnet layers),
    other ranks the fcnet (`fcnet_hiddens`, `fcnet_activation`). `conv_filters` is a list of
    `[out_channels, [kh, kw], stride]` (kernel and stride an int or a pair); None picks
    `jaxplan.models.get_filter_config`'s default for the image size (84x84, 42x42: RLlib's;
    10x10 (MinAtar): MinAtar's one 16-channel 3x3 conv); `[]` flattens images into the fcnet
    (jaxplan's; RLlib has no such setting). `custom_model` replaces the default network: a
    name given to `jaxplan.register_model`, an import path `"module:attribute"`, or in Python
    a flax module class or factory; `custom_model_config` is passed to it.

    `use_lstm` (RLlib's) puts a recurrent cell of `lstm_cell_size` units on top of the default
    network (`jaxplan.models.RecurrentActorCritic`; `lstm_cell_type` "lstm" or "gru", a
    jaxplan key), fed the previous action and reward with `lstm_use_prev_action` /
    `lstm_use_prev_reward`; the learner replays `max_seq_len`-step sequences from their stored
    start state (`jaxplan.recurrent`)."""

    fcnet_hiddens: tuple[int, ...] = (256, 256)
    fcnet_activation: str = "tanh"
    vf_share_layers: bool = False
    conv_filters: tuple[ConvFilter, ...] | None = None
    conv_activation: str = "relu"
    custom_model: Any = None
    custom_model_config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # recurrent policies (RLlib's keys; jaxplan.models.RecurrentNet): the default network under
    # an LSTM, trained on chunks of max_seq_len steps; lstm_cell_type "gru" is jaxplan's key
    use_lstm: bool = False
    lstm_cell_size: int = 256
    max_seq_len: int = 20
    lstm_use_prev_action: bool = False
    lstm_use_prev_reward: bool = False
    lstm_cell_type: str = "lstm"


@dataclasses.dataclass(frozen=True)
class EvaluationConfig:
    """RLlib's `evaluation_config`: what differs when evaluating. `explore=False` acts with
    each distribution's deterministic action; `env_config` is merged over the training
    env's `env_config`."""

    explore: bool = True
    env_config: Mapping[str, Any] = dataclasses.field(default_factory=dict)


EVALUATION_DURATION_UNITS = ("episodes",)


@dataclasses.dataclass(frozen=True)
class MultiAgentConfig:
    """RLlib's `multiagent` block. `policies` maps policy ids to per-policy config overrides
    (`{}` for none; keys in the config's `per_policy_keys()`); `policy_mapping` maps every
    agent id of the env to a policy id (RLlib's `policy_mapping_fn`, static; checked against
    the env by `resolve_policy_mapping`). Without `policies` there is one policy,
    `default_policy`, shared by every agent."""

    policies: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    policy_mapping: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    policies_to_train: tuple[str, ...] | None = None
    count_steps_by: str = "env_steps"


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """RLlib's common configuration keys (its `COMMON_CONFIG`) with RLlib's defaults; an
    algorithm's config subclasses it (field `fake_gpus` is RLlib's key `_fake_gpus`)."""

    env: str = "CartPole-v1"
    env_config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    num_workers: int = 2
    num_envs_per_worker: int = 1
    rollout_fragment_length: int = 200
    train_batch_size: int = 200
    lr: float = traced(1e-4)
    gamma: float = traced(0.99)
    # RLlib's schedules, [[timestep, value], ...]: piecewise linear in the env steps sampled
    # before the iteration, the last value outside the points; `lr_schedule` overrides `lr`
    lr_schedule: Schedule | None = per_policy(None)
    grad_clip: float | None = per_policy(None)
    normalize_actions: bool = True
    # RLlib's filters (jaxplan.filters): "MeanStdFilter" normalises every observation the
    # policies see and the batches hold with running statistics; clip_rewards clips the
    # batches' rewards (None/False: no, True: their sign, c: to [-c, c]), not the metrics'
    observation_filter: str = "NoFilter"
    clip_rewards: ClipRewards = None
    metrics_smoothing_episodes: int = 100
    # evaluation (RLlib's keys; jaxplan.stages.evaluation): every `evaluation_interval`
    # iterations (None or 0: never), `evaluation_duration` episodes with the newest params and
    # `evaluation_config`'s settings, results under "evaluation"; `evaluation_num_episodes` is
    # RLlib's older name of the duration (it wins when set)
    evaluation_interval: int | None = None
    evaluation_duration: int = 10
    evaluation_duration_unit: str = "episodes"
    evaluation_num_episodes: int | None = None
    evaluation_config: EvaluationConfig = EvaluationConfig()
    # devices (see jaxplan.devices): RLlib's num_gpus / _fake_gpus, and jaxplan's num_devices
    simple_optimizer: bool = False
    num_gpus: int = 0
    num_devices: int | None = None
    fake_gpus: bool = False  # key "_fake_gpus"
    model: ModelConfig = per_policy(ModelConfig())
    multiagent: MultiAgentConfig = MultiAgentConfig()

    @classmethod
    def per_policy_keys(cls) -> tuple[str, ...]:
        """Config keys a policy in `multiagent.policies` may override (the traced ones too)."""
        return tuple(_key(name) for name in fields_of(cls, "traced", "per_policy"))

    @classmethod
    def traced_fields(cls) -> tuple[str, ...]:
        """The fields that are traced hyper-parameters (the algorithm's `HParams` fields)."""
        return fields_of(cls, "traced")

    @property
    def policy_ids(self) -> tuple[str, ...]:
        """The policies of the plan (`default_policy` alone without `multiagent.policies`)."""
        return tuple(self.multiagent.policies) or (DEFAULT_POLICY_ID,)

    def policy_config(self, policy_id: str) -> Self:
        """This config with `multiagent.policies[policy_id]`'s overrides applied (and without
        the other policies: the result describes one policy)."""
        alone = dataclasses.replace(
            self,
            multiagent=MultiAgentConfig(count_steps_by=self.multiagent.count_steps_by),
        )
        return alone.updated(dict(self.multiagent.policies.get(policy_id) or {}))

    @property
    def evaluation_episodes(self) -> int:
        """Episodes per evaluation: `evaluation_num_episodes` if set, else
        `evaluation_duration`."""
        if self.evaluation_num_episodes is not None:
            return self.evaluation_num_episodes
        return self.evaluation_duration

    @property
    def data_parallel_devices(self) -> int:
        """Devices of the data-parallel mesh: `num_devices` if set, else `num_gpus` (0 = one
        device without a mesh, -1 = all)."""
        return self.num_gpus if self.num_devices is None else self.num_devices

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_dict(cls, overrides: Mapping[str, Any]) -> Self:
        """RLlib-style dict (nested `model`/`multiagent`, or dotted keys) -> validated config."""
        return cls().updated(overrides)

    def updated(self, overrides: Mapping[str, Any]) -> Self:
        """A validated copy with `overrides` applied; unknown keys raise `ValueError` naming the
        nearest valid key."""
        return _apply(self, _nest(overrides), prefix="").validate()

    def to_dict(self) -> dict[str, Any]:
        """RLlib-style nested dict (`lambda`, lists for tuples)."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if dataclasses.is_dataclass(v):
                v = {g.name: _plain(getattr(v, g.name)) for g in dataclasses.fields(v)}
            out[_key(f.name)] = _plain(v)
        return _named_models(out)

    # ---- validation ---------------------------------------------------------------------
    def check(self, ok: bool, key: str, msg: str) -> None:
        """Raises `ValueError("config[key] = value: msg")` unless `ok`."""
        if not ok:
            raise ValueError(f"config[{key!r}] = {_lookup(self, key)!r}: {msg}")

    def validate(self) -> Self:
        """Checks the config's own keys (ranges, and relations between keys); raises
        `ValueError` naming the offending key; returns `self`. An algorithm's config extends
        it with its keys' checks. What depends on the env, the devices or a stage (mesh
        divisibility, rollout modes, the policy mapping) is checked by the component that
        owns it when the plan is built."""
        check = self.check
        for key, value in _numbers(self.to_dict()):  # env_config and schedules included
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"config[{key!r}] = {value!r}: must be finite (not NaN/inf)")
            if isinstance(value, int) and not -(2**31) <= value < 2**31:
                raise ValueError(
                    f"config[{key!r}] = {value!r}: out of range; integers must be within "
                    f"+-2**31 ({2**31:,}), the devices' int32"
                )
        for key in (
            "num_envs_per_worker",
            "rollout_fragment_length",
            "train_batch_size",
            "metrics_smoothing_episodes",
        ):
            check(getattr(self, key) >= 1, key, "must be >= 1")
        check(self.num_workers >= 0, "num_workers", "must be >= 0 (0 = sample on one local group)")
        check(self.lr > 0, "lr", "must be > 0")
        check(0.0 <= self.gamma <= 1.0, "gamma", "must be in [0, 1]")
        for f in dataclasses.fields(self):
            points = getattr(self, f.name)
            if not f.name.endswith("_schedule") or points is None:
                continue
            key, positive = f.name, f.name == "lr_schedule"
            steps = [t for t, _ in points]
            check(len(points) >= 1, key, "must hold at least one [timestep, value] point")
            check(
                steps[0] >= 0 and all(a <= b for a, b in zip(steps, steps[1:], strict=False)),
                key,
                "timesteps must be >= 0 and non-decreasing",
            )
            check(
                all(v > 0 if positive else v >= 0 for _, v in points),
                key,
                "values must be > 0" if positive else "values must be >= 0",
            )
        check(self.grad_clip is None or self.grad_clip > 0, "grad_clip", "must be > 0 or None")
        check(
            self.observation_filter in OBSERVATION_FILTERS,
            "observation_filter",
            f"is not supported; valid values: {list(OBSERVATION_FILTERS)}",
        )
        check(
            self.clip_rewards is None
            or isinstance(self.clip_rewards, bool)
            or self.clip_rewards > 0,
            "clip_rewards",
            "must be None or false (no clipping), true (the sign) or a number c > 0 ([-c, c])",
        )
        check(
            self.evaluation_interval is None or self.evaluation_interval >= 0,
            "evaluation_interval",
            "must be None or 0 (no evaluation) or an iteration count >= 1",
        )
        check(self.evaluation_duration >= 1, "evaluation_duration", "must be >= 1")
        check(
            self.evaluation_num_episodes is None or self.evaluation_num_episodes >= 1,
            "evaluation_num_episodes",
            "must be >= 1 or None",
        )
        check(
            self.evaluation_duration_unit in EVALUATION_DURATION_UNITS,
            "evaluation_duration_unit",
            f"must be one of {list(EVALUATION_DURATION_UNITS)} (whole episodes are played; "
            "'timesteps' is not supported)",
        )
        check(
            len(self.model.fcnet_hiddens) >= 1 and all(h >= 1 for h in self.model.fcnet_hiddens),
            "model.fcnet_hiddens",
            "must be a non-empty list of positive layer widths",
        )
        check(
            self.model.fcnet_activation in ACTIVATIONS,
            "model.fcnet_activation",
            f"must be one of {sorted(ACTIVATIONS)}",
        )
        check(
            self.model.conv_activation in ACTIVATIONS,
            "model.conv_activation",
            f"must be one of {sorted(ACTIVATIONS)}",
        )
        check(
            self.model.conv_filters is None
            or all(
                out >= 1 and min(kernel) >= 1 and min(stride) >= 1
                for out, kernel, stride in self.model.conv_filters
            ),
            "model.conv_filters",
            "channels, kernel sizes and strides must be >= 1",
        )
        if self.model.use_lstm:
            self._check_recurrent()
        if self.model.custom_model is not None:
            try:
                resolve_model(self.model.custom_model)
            except ValueError as e:
                raise ValueError(
                    str(e).replace("model.custom_model", "config['model.custom_model']", 1)
                ) from None
        for key in ("num_gpus", "num_devices"):
            value = getattr(self, key)
            check(
                value is None or value >= -1,
                key,
                "must be -1 (all devices), 0 (one device, no mesh) or a device count",
            )
        check(
            self.num_devices is None or self.num_gpus in (0, self.num_devices),
            "num_gpus",
            f"disagrees with num_devices ({self.num_devices}); set one of them",
        )
        check(
            self.multiagent.count_steps_by in COUNT_STEPS_BY,
            "multiagent.count_steps_by",
            f"must be one of {list(COUNT_STEPS_BY)}",
        )
        check(
            self.multiagent.count_steps_by == "env_steps"
            or is_multi_agent_env(self.env)
            or is_custom_env(self.env),  # known only once made
            "multiagent.count_steps_by",
            f"'agent_steps' needs a multi-agent env; {self.env!r} is single-agent",
        )
        for pid, overrides in self.multiagent.policies.items():
            check(
                overrides is None or isinstance(overrides, Mapping),
                f"multiagent.policies.{pid}",
                "must be a dict of per-policy config overrides (or {})",
            )
            keys = type(self).per_policy_keys()
            bad = [k for k in (overrides or {}) if k not in keys]
            check(
                not bad,
                f"multiagent.policies.{pid}",
                f"{bad} cannot differ per policy; per-policy keys: {', '.join(keys)}",
            )
            if overrides:
                try:
                    self.policy_config(pid)
                except ValueError as e:
                    raise ValueError(f"multiagent.policies.{pid}: {e}") from None
        return self

    supports_recurrent: typing.ClassVar[bool] = False
    """Whether the algorithm trains `model.use_lstm` policies (its learner replays sequences)."""

    def _check_recurrent(self) -> None:
        """`model.use_lstm`'s keys, and that the algorithm and the rollouts support it."""
        check, model = self.check, self.model
        name = type(self).__name__.removesuffix("Config")
        check(
            type(self).supports_recurrent,
            "model.use_lstm",
            f"recurrent policies are not supported by {name} (PPO and A2C train them: "
            "their TrainOneStep replays max_seq_len sequences); set model.use_lstm=false",
        )
        check(model.lstm_cell_size >= 1, "model.lstm_cell_size", "must be >= 1")
        check(model.max_seq_len >= 1, "model.max_seq_len", "must be >= 1")
        check(
            model.lstm_cell_type in CELL_TYPES,
            "model.lstm_cell_type",
            f"must be one of {list(CELL_TYPES)}",
        )
        check(
            model.custom_model is None,
            "model.use_lstm",
            "wraps the default network, not model.custom_model (build the recurrence into the "
            "custom model)",
        )
        check(
            self.rollout_fragment_length % model.max_seq_len == 0,
            "model.max_seq_len",
            f"must divide rollout_fragment_length ({self.rollout_fragment_length}): a fragment "
            "is cut into whole sequences (no zero-padding); e.g. max_seq_len="
            f"{_divisor_near(self.rollout_fragment_length, model.max_seq_len)}",
        )


def _divisor_near(n: int, want: int) -> int:
    """The divisor of `n` closest to `want` (the smaller one on a tie)."""
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - want), d))


class HParams:
    """Base of an algorithm's traced hyper-parameters: a `flax.struct.dataclass` whose fields
    are its config's `traced` fields, as f32 scalars in `PolicyState.hparams` (vmap-able).
    Subclasses are hand-written so that type checkers see `hparams.lr`; `check_hparams`
    keeps them equal to the config's traced set."""

    @classmethod
    def from_config(cls, config: TrainerConfig) -> Self:
        """The config's traced fields as f32 scalars."""
        return cls(
            **{f.name: jnp.float32(getattr(config, f.name)) for f in dataclasses.fields(cls)}
        )

    def merged(self, overrides: Any) -> Self:
        """These hyper-parameters with `overrides`: None keeps them, an instance of this class
        replaces them, a mapping `{field: value}` (e.g. `{"lr": 1e-3}`) replaces those fields.
        Every value is one f32 scalar (a number, a 0-d array, or a traced scalar under `vmap`).

        Raises `ValueError` naming the offending field and what is valid.
        """
        cls = type(self)
        names = [f.name for f in dataclasses.fields(self)]
        if overrides is None:
            return self
        if isinstance(overrides, cls):
            values = {n: getattr(overrides, n) for n in names}
        elif isinstance(overrides, Mapping):
            unknown = [k for k in overrides if k not in names]
            if unknown:
                close = difflib.get_close_matches(str(unknown[0]), names, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ValueError(
                    f"unknown hyper-parameter(s) {unknown}.{hint} Valid (the traced "
                    f"{cls.__name__.removesuffix('HParams')} config keys): {', '.join(names)}"
                )
            values = {n: overrides.get(n, getattr(self, n)) for n in names}
        else:
            raise ValueError(
                f"got {overrides!r}; expected a {cls.__name__} or a mapping of its fields "
                f"({', '.join(names)}) to numbers"
            )
        return cls(**{n: _hparam_scalar(v, repr(n)) for n, v in values.items()})


def check_hparams(hparams_cls: type, config_cls: type) -> None:
    """At import: `TypeError` unless `hparams_cls`'s fields are `config_cls`'s traced ones."""
    names = [f.name for f in dataclasses.fields(hparams_cls)]
    if set(names) != set(config_cls.traced_fields()):
        raise TypeError(
            f"{hparams_cls.__name__} fields {names} must be the {config_cls.__name__} fields "
            f"declared traced {list(config_cls.traced_fields())}"
        )


def _hparam_scalar(value: Any, where: str) -> jnp.ndarray:
    """`value` as an f32 scalar, or `ValueError` naming `where` and its shape or type."""
    if isinstance(value, bool | str) or value is None:
        raise ValueError(f"{where} = {value!r}: expected a number")
    try:
        array = jnp.asarray(value)
    except TypeError as e:
        raise ValueError(f"{where} = {value!r}: expected a number ({e})") from None
    if array.shape != ():
        raise ValueError(
            f"{where} has shape {list(array.shape)}; each hyper-parameter is one scalar per "
            "run (to sweep, vmap over keys and hparams: see `make_train` / `train_seeds`)"
        )
    if not (jnp.issubdtype(array.dtype, jnp.floating) or jnp.issubdtype(array.dtype, jnp.integer)):
        raise ValueError(f"{where} has dtype {array.dtype}; expected a real number")
    return array.astype(jnp.float32)


def load_presets(path: str | Path) -> dict[str, dict]:
    """Env id -> config overrides (an RLlib-style dict), from a YAML mapping (anchors and `<<`
    merges resolved; top-level keys starting with `_` are shared blocks, not envs)."""
    data = yaml.safe_load(Path(path).read_text())
    return {env: copy.deepcopy(dict(v)) for env, v in data.items() if not env.startswith("_")}


def preset_of(
    config_cls: type[TrainerConfig],
    presets: Mapping[str, Mapping[str, Any]],
    env: str,
    overrides: Mapping[str, Any] | None = None,
) -> TrainerConfig:
    """RLlib's defaults (`config_cls()`), then the tuned preset for `env` (if any), then
    `overrides`."""
    preset = {_key(k): v for k, v in presets.get(env, {}).items()}
    return config_cls().updated({**preset, "env": env}).updated(overrides or {})


# ---- helpers ------------------------------------------------------------------------------
def _numbers(tree: Any, prefix: str = "") -> typing.Iterator[tuple[str, int | float]]:
    """`(dotted key, value)` of every int or float (not bool) in a nested dict / list, with
    list items keyed as `key[i]`."""
    if isinstance(tree, Mapping):
        for k, v in tree.items():
            yield from _numbers(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(tree, list | tuple):
        for i, v in enumerate(tree):
            yield from _numbers(v, f"{prefix}[{i}]")
    elif isinstance(tree, int | float) and not isinstance(tree, bool):
        yield prefix, tree


def _named_models(tree: Any) -> Any:
    """`tree` (a `to_dict` result) with every `custom_model` given by a model object replaced
    by the name a run saves (`jaxplan.models.model_name`)."""
    if isinstance(tree, Mapping):
        return {
            k: model_name(v) if k == "custom_model" else _named_models(v) for k, v in tree.items()
        }
    return tree


def _plain(v):
    if isinstance(v, tuple):
        return list(v)
    if isinstance(v, Mapping):
        return dict(v)
    return v


def _lookup(config, dotted: str):
    obj = config
    for part in dotted.split("."):
        if isinstance(obj, Mapping):
            obj = obj.get(part)
        else:
            obj = getattr(obj, _ALIASES.get(part, part))
    return obj


def _nest(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`{"model.fcnet_hiddens": x}` -> `{"model": {"fcnet_hiddens": x}}` (merging)."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        if not isinstance(key, str):
            raise ValueError(f"config keys must be strings, got {key!r}")
        head, _, rest = key.partition(".")
        if rest:
            value = _nest({rest: value})
        if isinstance(value, Mapping) and isinstance(out.get(head), dict):
            out[head] = {**out[head], **value}
        else:
            out[head] = (
                dict(value) if isinstance(value, Mapping) and head != "env_config" else value
            )
    return out


@functools.cache
def _types(cls: type) -> dict[str, Any]:
    """Field name -> resolved type of a config dataclass (annotations are strings here)."""
    return typing.get_type_hints(cls)


def _apply(obj, overrides: dict[str, Any], prefix: str):
    fields = {f.name for f in dataclasses.fields(obj)}
    valid = sorted(_key(n) for n in fields)
    changes = {}
    for key, value in overrides.items():
        name = _ALIASES.get(key, key)
        full = prefix + key
        if name not in fields:
            close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
            hint = f"; did you mean {prefix + close[0]!r}?" if close else "."
            where = f" under {prefix[:-1]!r}" if prefix else ""
            raise ValueError(
                f"Unknown config key {full!r}{hint} Valid keys{where}: " + ", ".join(valid)
            )
        current = getattr(obj, name)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, Mapping):
                raise ValueError(f"config[{full!r}] must be a dict, got {value!r}")
            changes[name] = _apply(current, dict(value), prefix=full + ".")
        else:
            try:
                changes[name] = _coerce(value, _types(type(obj))[name])
            except TypeError as e:
                raise ValueError(f"config[{full!r}] = {value!r}: expected {e}") from None
    return dataclasses.replace(obj, **changes)


_EXPECTED = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
_PLURAL = {
    bool: "booleans",
    int: "integers",
    float: "numbers",
    str: "strings",
    ConvFilter: "[out_channels, [kh, kw], stride] filters",
}


def _conv_filter(value: Any) -> ConvFilter:
    """RLlib's `[out_channels, kernel, stride]` (kernel and stride an int or a pair) as
    `(out, (kh, kw), (sh, sw))`; `TypeError` otherwise."""

    def pair(x):
        if isinstance(x, int) and not isinstance(x, bool):
            return (x, x)
        if isinstance(x, list | tuple) and len(x) == 2:
            return (_coerce(x[0], int), _coerce(x[1], int))
        raise TypeError("pair")

    try:
        out, kernel, stride = value
        return (_coerce(out, int), pair(kernel), pair(stride))
    except (TypeError, ValueError):
        raise TypeError(f"a list of {_PLURAL[ConvFilter]}") from None


def _plural(tp: Any) -> str:
    """What a list of type `tp` (`tuple[X, ...]` or `tuple[X, Y]`) holds, for messages."""
    args = typing.get_args(tp)
    if args[-1] is Ellipsis:
        inner = args[0]
        return (
            _PLURAL[inner]
            if inner in _PLURAL
            else _plural(inner).replace("2 numbers", "[number, number] pairs")
        )
    return f"{len(args)} {_PLURAL[args[0]]}"


_ACCEPTS = {bool: bool, int: int, float: int | float, str: str}


def _coerce(value: Any, tp: Any) -> Any:
    """`value` as type `tp` (`bool`, `int`, `float`, `str`, `X | None`, `tuple[X, ...]`,
    `Mapping[...]`), the way a JSON/YAML config means it: integral floats are ints, ints are
    floats, bools are neither, lists are tuples. Raises `TypeError(what was expected)`."""
    if tp is Any:
        return value
    if tp == ConvFilter:
        return _conv_filter(value)
    if tp == ClipRewards:
        if value is None or isinstance(value, bool):
            return value
        return _coerce(value, float)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(value, inner)
    if origin is tuple:
        expected = f"a list of {_plural(tp)}"
        if not isinstance(value, list | tuple):
            raise TypeError(expected)
        inner = args[:1] * len(value) if args[-1] is Ellipsis else args
        if len(inner) != len(value):
            raise TypeError(expected)
        try:
            return tuple(_coerce(v, t) for v, t in zip(value, inner, strict=True))
        except TypeError:
            raise TypeError(expected) from None
    if origin is Mapping:
        if not isinstance(value, Mapping):
            raise TypeError("a dict")
        return dict(value)
    if tp not in _EXPECTED:
        raise AssertionError(f"unhandled config field type {tp!r}")
    if tp is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) != (tp is bool) or not isinstance(value, _ACCEPTS[tp]):
        raise TypeError(_EXPECTED[tp])
    return tp(value)
