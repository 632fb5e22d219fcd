"""PPO configuration: RLlib's keys and defaults, validated, with tuned presets per task.

`PPOConfig` is static (frozen, hashable parts decide shapes); the hyper-parameters that may be
traced (and so `vmap`ped over) are copied into `PPOHParams` inside `PlanState`.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
from flax import struct

from jaxplan.models import ACTIVATIONS
from jaxplan.stages.concat_batches import COUNT_STEPS_BY

ROLLOUT_MODES = ("bulk_sync", "async")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    fcnet_hiddens: tuple[int, ...] = (256, 256)
    fcnet_activation: str = "tanh"
    vf_share_layers: bool = False


@dataclasses.dataclass(frozen=True)
class MultiAgentConfig:
    """RLlib's `multiagent` block. `policies` maps policy ids to per-policy config overrides
    (`{}` for none; keys in `PER_POLICY_KEYS`); `policy_mapping` maps every agent id of the env
    to a policy id (RLlib's `policy_mapping_fn`, static). Without `policies` there is one
    policy, `default_policy`, shared by every agent."""

    policies: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    policy_mapping: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    policies_to_train: tuple[str, ...] | None = None
    count_steps_by: str = "env_steps"


PER_POLICY_KEYS = (
    "lr",
    "gamma",
    "lambda",
    "kl_coeff",
    "kl_target",
    "clip_param",
    "vf_clip_param",
    "vf_loss_coeff",
    "entropy_coeff",
    "grad_clip",
    "model",
    "vtrace",
    "vtrace_clip_rho_threshold",
    "vtrace_clip_pg_rho_threshold",
    "vtrace_clip_c_threshold",
)
"""Config keys a policy in `multiagent.policies` may override."""

MULTI_AGENT_ENVS = ("MultiAgentCartPole",)
JAXMARL_PREFIX = "jaxmarl:"


def is_multi_agent_env(name: str) -> bool:
    """Whether the env id names a multi-agent env (built-in or `jaxmarl:...`)."""
    return name in MULTI_AGENT_ENVS or name.startswith(JAXMARL_PREFIX)


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """RLlib PPO's configuration keys with RLlib's defaults (the fields `lambda_` and
    `fake_gpus` are RLlib's keys `lambda` and `_fake_gpus`)."""

    env: str = "CartPole-v1"
    env_config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    num_workers: int = 2
    num_envs_per_worker: int = 1
    rollout_fragment_length: int = 200
    train_batch_size: int = 4000
    sgd_minibatch_size: int = 128
    num_sgd_iter: int = 30
    shuffle_sequences: bool = True
    lr: float = 5e-5
    gamma: float = 0.99
    lambda_: float = 1.0
    kl_coeff: float = 0.2
    kl_target: float = 0.01
    clip_param: float = 0.3
    vf_clip_param: float = 10.0
    vf_loss_coeff: float = 1.0
    entropy_coeff: float = 0.0
    grad_clip: float | None = None
    normalize_actions: bool = True
    metrics_smoothing_episodes: int = 100
    # rollouts: "bulk_sync" (RLlib PPO) or "async" (staggered actor groups, APPO-style), and
    # V-trace correction of the advantages for the lag (IMPALA's clipping thresholds)
    rollout_mode: str = "bulk_sync"
    num_async: int = 1
    vtrace: bool = False
    vtrace_clip_rho_threshold: float = 1.0
    vtrace_clip_pg_rho_threshold: float = 1.0
    vtrace_clip_c_threshold: float = 1.0
    # devices (see jaxplan.devices): RLlib's num_gpus / _fake_gpus, and jaxplan's num_devices
    simple_optimizer: bool = False
    num_gpus: int = 0
    num_devices: int | None = None
    fake_gpus: bool = False  # key "_fake_gpus"
    model: ModelConfig = ModelConfig()
    multiagent: MultiAgentConfig = MultiAgentConfig()

    @property
    def policy_ids(self) -> tuple[str, ...]:
        """The policies of the plan (`default_policy` alone without `multiagent.policies`)."""
        return tuple(self.multiagent.policies) or ("default_policy",)

    def policy_config(self, policy_id: str) -> PPOConfig:
        """This config with `multiagent.policies[policy_id]`'s overrides applied (and without
        the other policies: the result describes one policy)."""
        alone = dataclasses.replace(
            self,
            multiagent=MultiAgentConfig(count_steps_by=self.multiagent.count_steps_by),
        )
        return alone.updated(dict(self.multiagent.policies.get(policy_id) or {}))

    @property
    def data_parallel_devices(self) -> int:
        """Devices of the data-parallel mesh: `num_devices` if set, else `num_gpus` (0 = one
        device without a mesh, -1 = all)."""
        return self.num_gpus if self.num_devices is None else self.num_devices

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_dict(cls, overrides: Mapping[str, Any]) -> PPOConfig:
        """RLlib-style dict (nested `model`/`multiagent`, or dotted keys) -> validated config."""
        return cls().updated(overrides)

    def updated(self, overrides: Mapping[str, Any]) -> PPOConfig:
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
        return out

    # ---- validation ---------------------------------------------------------------------
    def validate(self) -> PPOConfig:
        """Raises `ValueError` naming the offending key; returns `self`."""

        def check(ok: bool, key: str, msg: str):
            if not ok:
                raise ValueError(f"config[{key!r}] = {_lookup(self, key)!r}: {msg}")

        for key in (
            "num_envs_per_worker",
            "rollout_fragment_length",
            "train_batch_size",
            "num_sgd_iter",
            "metrics_smoothing_episodes",
        ):
            check(getattr(self, key) >= 1, key, "must be >= 1")
        check(self.num_workers >= 0, "num_workers", "must be >= 0 (0 = sample on one local group)")
        check(self.sgd_minibatch_size >= 0, "sgd_minibatch_size", "must be >= 0 (0 = whole batch)")
        check(
            self.sgd_minibatch_size <= self.train_batch_size,
            "sgd_minibatch_size",
            f"must be <= train_batch_size ({self.train_batch_size})",
        )
        check(self.lr > 0, "lr", "must be > 0")
        check(0.0 <= self.gamma <= 1.0, "gamma", "must be in [0, 1]")
        check(0.0 <= self.lambda_ <= 1.0, "lambda", "must be in [0, 1]")
        check(self.kl_coeff >= 0, "kl_coeff", "must be >= 0 (0 disables the KL loss term)")
        check(self.kl_target > 0, "kl_target", "must be > 0")
        check(self.clip_param > 0, "clip_param", "must be > 0")
        check(self.vf_clip_param > 0, "vf_clip_param", "must be > 0")
        check(self.vf_loss_coeff >= 0, "vf_loss_coeff", "must be >= 0")
        check(self.entropy_coeff >= 0, "entropy_coeff", "must be >= 0")
        check(self.grad_clip is None or self.grad_clip > 0, "grad_clip", "must be > 0 or None")
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
            self.rollout_mode in ROLLOUT_MODES, "rollout_mode", f"must be one of {ROLLOUT_MODES}"
        )
        check(self.num_async >= 1, "num_async", "must be >= 1")
        check(
            self.num_async == 1 or self.rollout_mode == "async",
            "num_async",
            "only applies to rollout_mode='async'",
        )
        for key in (
            "vtrace_clip_rho_threshold",
            "vtrace_clip_pg_rho_threshold",
            "vtrace_clip_c_threshold",
        ):
            check(getattr(self, key) > 0, key, "must be > 0")
        if self.rollout_mode == "async":
            per_device = max(1, self.num_workers) // max(1, self.data_parallel_devices)
            check(
                self.rollout_fragment_length % max(1, per_device) == 0,
                "rollout_fragment_length",
                f"must be a multiple of the actor groups per device ({per_device}) with "
                "rollout_mode='async' (each round every group advances T / groups steps)",
            )
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
        n = self.data_parallel_devices
        if n > 1:
            groups = max(1, self.num_workers)
            check(
                groups % n == 0,
                "num_workers",
                f"{groups} actor group(s) cannot be split evenly across {n} devices; "
                f"use a multiple of {n}",
            )
            check(
                self.simple_optimizer or self.sgd_minibatch_size % n == 0,
                "sgd_minibatch_size",
                f"does not split evenly across {n} devices; use a multiple of {n}",
            )
        check(
            self.multiagent.count_steps_by in COUNT_STEPS_BY,
            "multiagent.count_steps_by",
            f"must be one of {list(COUNT_STEPS_BY)}",
        )
        check(
            self.multiagent.count_steps_by == "env_steps" or is_multi_agent_env(self.env),
            "multiagent.count_steps_by",
            f"'agent_steps' needs a multi-agent env; {self.env!r} is single-agent",
        )
        self._validate_multiagent(check)
        return self

    def _validate_multiagent(self, check) -> None:
        ma = self.multiagent
        pids = self.policy_ids
        for pid, overrides in ma.policies.items():
            check(
                overrides is None or isinstance(overrides, Mapping),
                f"multiagent.policies.{pid}",
                "must be a dict of per-policy config overrides (or {})",
            )
            bad = [k for k in (overrides or {}) if k not in PER_POLICY_KEYS]
            check(
                not bad,
                f"multiagent.policies.{pid}",
                f"{bad} cannot differ per policy; per-policy keys: {', '.join(PER_POLICY_KEYS)}",
            )
            if overrides:
                try:
                    self.policy_config(pid)
                except ValueError as e:
                    raise ValueError(f"multiagent.policies.{pid}: {e}") from None
        unknown = sorted({p for p in ma.policy_mapping.values() if p not in pids})
        check(
            not unknown,
            "multiagent.policy_mapping",
            f"maps to unknown policy id(s) {unknown}; policies: {list(pids)}",
        )
        check(
            len(pids) == 1 or bool(ma.policy_mapping),
            "multiagent.policy_mapping",
            f"is needed to map the env's agents to the {len(pids)} policies {list(pids)}",
        )
        unknown = [p for p in (ma.policies_to_train or ()) if p not in pids]
        check(
            not unknown,
            "multiagent.policies_to_train",
            f"names unknown policy id(s) {unknown}; policies: {list(pids)}",
        )


@struct.dataclass
class PPOHParams:
    """PPO hyper-parameters that live in `PlanState` as traced scalars (vmap-able)."""

    lr: jnp.ndarray
    gamma: jnp.ndarray
    lambda_: jnp.ndarray
    clip_param: jnp.ndarray
    vf_clip_param: jnp.ndarray
    vf_loss_coeff: jnp.ndarray
    entropy_coeff: jnp.ndarray
    kl_target: jnp.ndarray

    @classmethod
    def from_config(cls, config: PPOConfig) -> PPOHParams:
        return cls(
            **{f.name: jnp.float32(getattr(config, f.name)) for f in dataclasses.fields(cls)}
        )


# Tuned presets: `jaxplan train ppo --env NAME` starts from these (on top of RLlib's defaults).
_SMALL_FAST = dict(
    num_workers=4,
    num_envs_per_worker=4,
    kl_coeff=0.0,
    clip_param=0.2,
    grad_clip=0.5,
    model={"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh"},
)
PRESETS: dict[str, dict[str, Any]] = {
    "CartPole-v1": dict(
        _SMALL_FAST,
        rollout_fragment_length=32,
        train_batch_size=512,
        sgd_minibatch_size=128,
        num_sgd_iter=8,
        lr=2.5e-3,
        gamma=0.99,
        lambda_=0.95,
        vf_clip_param=10.0,
        vf_loss_coeff=0.5,
        entropy_coeff=0.0,
    ),
    "Acrobot-v1": dict(
        _SMALL_FAST,
        rollout_fragment_length=64,
        train_batch_size=1024,
        sgd_minibatch_size=256,
        num_sgd_iter=4,
        lr=2.5e-3,
        lambda_=0.95,
        entropy_coeff=0.01,
        vf_loss_coeff=0.5,
        vf_clip_param=100.0,
    ),
    "Pendulum-v1": dict(
        _SMALL_FAST,
        num_envs_per_worker=8,
        rollout_fragment_length=64,
        train_batch_size=2048,
        sgd_minibatch_size=256,
        num_sgd_iter=10,
        lr=1e-3,
        gamma=0.95,
        lambda_=0.95,
        vf_clip_param=2000.0,
        vf_loss_coeff=0.5,
    ),
}
# multi-agent: the CartPole preset per agent; MPE (JaxMARL) in the style of IPPO's settings
PRESETS["MultiAgentCartPole"] = dict(PRESETS["CartPole-v1"])
PRESETS[JAXMARL_PREFIX + "MPE_simple_spread_v3"] = dict(
    _SMALL_FAST,
    num_envs_per_worker=8,
    rollout_fragment_length=32,
    train_batch_size=1024,
    sgd_minibatch_size=256,
    num_sgd_iter=4,
    lr=1e-3,
    lambda_=0.95,
    entropy_coeff=0.01,
    vf_loss_coeff=0.5,
    vf_clip_param=100.0,
)
for _name in ("Asterix-MinAtar", "Breakout-MinAtar", "Freeway-MinAtar", "SpaceInvaders-MinAtar"):
    PRESETS[_name] = dict(
        num_workers=8,
        num_envs_per_worker=8,
        rollout_fragment_length=128,
        train_batch_size=8192,
        sgd_minibatch_size=1024,
        num_sgd_iter=4,
        lr=5e-4,
        kl_coeff=0.0,
        clip_param=0.2,
        grad_clip=0.5,
        lambda_=0.95,
        entropy_coeff=0.01,
        vf_loss_coeff=0.5,
        vf_clip_param=100.0,
        model={"fcnet_hiddens": [256, 256], "fcnet_activation": "relu"},
    )


def preset_config(env: str, overrides: Mapping[str, Any] | None = None) -> PPOConfig:
    """RLlib defaults, then the tuned preset for `env` (if any), then `overrides`."""
    preset = {_key(k): v for k, v in PRESETS.get(env, {}).items()}
    return PPOConfig().updated({**preset, "env": env}).updated(overrides or {})


# ---- helpers ------------------------------------------------------------------------------
_ALIASES = {"lambda": "lambda_", "_fake_gpus": "fake_gpus"}
_KEYS = {field: key for key, field in _ALIASES.items()}


def _key(field_name: str) -> str:
    """The RLlib config key of a `PPOConfig` field."""
    return _KEYS.get(field_name, field_name)


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


def _apply(obj, overrides: dict[str, Any], prefix: str):
    fields = {f.name: f for f in dataclasses.fields(obj)}
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
            changes[name] = _coerce(full, value, fields[name].type, current)
    return dataclasses.replace(obj, **changes)


def _coerce(key: str, value: Any, annotation: str, current: Any):
    """Checks `value` against the field's annotation (a string under `from __future__`)."""

    def bad(expected: str):
        return ValueError(f"config[{key!r}] = {value!r}: expected {expected}")

    optional = "None" in annotation
    if value is None:
        if optional:
            return None
        raise bad(annotation)
    if annotation.startswith("bool"):
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if annotation.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise bad("an integer")
        return value
    if annotation.startswith("float"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad("a number")
        return float(value)
    if annotation.startswith("str"):
        if not isinstance(value, str):
            raise bad("a string")
        return value
    if annotation.startswith("tuple[int"):
        if not isinstance(value, list | tuple) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise bad("a list of integers")
        return tuple(value)
    if annotation.startswith("tuple[str"):
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise bad("a list of strings")
        return tuple(value)
    if annotation.startswith("Mapping"):
        if not isinstance(value, Mapping):
            raise bad("a dict")
        return dict(value)
    raise AssertionError(f"unhandled config annotation {annotation!r} for {key}")
