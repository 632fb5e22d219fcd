"""Flax models: RLlib's default actor-critic networks, custom models, and their init.

The default network is picked from the observation shape as RLlib's `ModelCatalog` does:
rank-3 observations `[H, W, C]` get the vision net (a conv stack, then the fcnet layers),
every other rank the fcnet (an MLP on the flattened observation). `build_model` returns an
`ActorCriticNet`: a flax module as pure functions of `(params, obs)`. With `model.use_lstm`
(RLlib's LSTM wrapper) it returns a `RecurrentNet` instead: that trunk under an LSTM or GRU
cell, as pure functions of `(params, obs, state)` (`jaxplan.recurrent` replays it).

Custom models (RLlib's `model.custom_model`)
--------------------------------------------
`model.custom_model` is a name given to `register_model` (RLlib's
`ModelCatalog.register_custom_model`), an import path `"package.module:attribute"`, or, in
Python, the model itself. A model is either

- a flax `nn.Module` subclass, built as `Model(num_outputs=num_outputs,
  **custom_model_config)`, or
- a factory `(obs_shape, num_outputs, model_config, custom_model_config) -> nn.Module`
  (`model_config` is the policy's `ModelConfig`, `custom_model_config` its dict).

The module's contract:

- `__call__(obs [B, *obs_shape] float32) -> (action_dist_inputs [B, num_outputs],
  value [B])`. Any leading batch dims of the caller are flattened to one `B` first (and
  restored after), so the module sees exactly one batch axis.
- `num_outputs` is what the action distribution takes (`jaxplan.distributions`): the logits
  for `Discrete(n)` (`n`), `concat(mean, log_std)` for `Box` actions of `d` dims (`2 d`).
- Optional methods `policy(obs) -> action_dist_inputs` and `value(obs) -> value` are used
  when acting or computing values alone (else `__call__` is, and the unused half left to
  XLA to drop). Share layers between them or not, as you like.
- Params are the module's own `init` (its initializers; only the `params` collection: no
  batch statistics or other mutable state).

The shapes are checked when the policy is built (abstractly, before anything compiles): a
module returning others is a `ValueError` naming them. A run saves the model's name in
`params.json` (`model_name`): a registered name, or for a model passed directly its import
path `"module:qualname"`; loading the run (`jaxplan.load_policy`, `jaxplan evaluate`)
resolves that name again, so register the model (or make it importable) in the loading
process. A model whose path cannot be imported (defined in a function or a notebook) is
refused at load with a message saying so; register it under the saved name to load it.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxplan import batch as sb

ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu, "elu": nn.elu, "swish": nn.swish, "linear": None}

ConvFilter = tuple[int, tuple[int, int], tuple[int, int]]
"""One conv layer, RLlib's `[out_channels, [kh, kw], stride]` (stride as `(sh, sw)`)."""

MINATAR_FILTERS: tuple[ConvFilter, ...] = ((16, (3, 3), (1, 1)),)
"""10x10 images (MinAtar): MinAtar's own baseline network (Young & Tian 2019), one 16-channel
3x3 stride-1 conv, then the dense layers. (RLlib's 10x10 default, two 5x5 stride-2 convs, is
meant for its test images; on 10x10xC frames it leaves 3x3 cells.)"""

DEFAULT_FILTERS: dict[tuple[int, int], tuple[ConvFilter, ...]] = {
    # RLlib's `get_filter_config` (ray 1.x rllib/models/utils.py): Atari frames
    (84, 84): ((16, (8, 8), (4, 4)), (32, (4, 4), (2, 2)), (256, (11, 11), (1, 1))),
    # RLlib's half-size Atari frames
    (42, 42): ((16, (4, 4), (2, 2)), (32, (4, 4), (2, 2)), (256, (11, 11), (1, 1))),
    (10, 10): MINATAR_FILTERS,
}
"""`conv_filters` picked from an image's `(H, W)` when `model.conv_filters` is None."""


def get_filter_config(obs_shape: Sequence[int]) -> tuple[ConvFilter, ...]:
    """The default `conv_filters` for images of shape `[H, W, C]` (`DEFAULT_FILTERS`, RLlib's
    `get_filter_config`); `ValueError` naming the shape and the known sizes otherwise."""
    filters = DEFAULT_FILTERS.get(tuple(obs_shape[:2])) if len(obs_shape) == 3 else None
    if filters is None:
        known = ", ".join(f"{h}x{w}xC" for h, w in DEFAULT_FILTERS)
        raise ValueError(
            f"model.conv_filters: no default conv stack for observations {list(obs_shape)} "
            f"(defaults exist for {known}); set model.conv_filters, e.g. "
            "[[16, [4, 4], 2], [32, [4, 4], 2]], or [] to flatten the image into the fcnet"
        )
    return filters


def conv_output_shape(obs_shape: Sequence[int], filters: Sequence[ConvFilter]) -> tuple:
    """`[H', W', C']` after the conv stack: 'same' padding for every layer but the last, which
    is 'valid' (RLlib's VisionNet); `ValueError` naming the layer when an image is too small."""
    h, w, c = obs_shape
    for i, (out, (kh, kw), (sh, sw)) in enumerate(filters):
        if i < len(filters) - 1:
            h, w = -(-h // sh), -(-w // sw)
        else:
            if kh > h or kw > w:
                raise ValueError(
                    f"model.conv_filters[{i}]: kernel [{kh}, {kw}] is larger than its input "
                    f"[{h}, {w}] (observations {list(obs_shape)}; the last conv is 'valid')"
                )
            h, w = (h - kh) // sh + 1, (w - kw) // sw + 1
        c = out
    return h, w, c


class PatchConv(nn.Module):
    """`x [N, H, W, C] -> [N, H', W', features]`: `nn.Conv` (same params: `kernel [kh, kw, C,
    features]`, `bias`; 'SAME' padding by TF's rule, else 'VALID') computed as strided slices
    (the `kh * kw` patches) and one matmul. XLA's CPU conv's weight gradient is ~20-70x slower
    inside a loop body (`make_train`'s scan) than the matmul (benchmarks/README.md)."""

    features: int
    kernel_size: tuple[int, int]
    strides: tuple[int, int] = (1, 1)
    same: bool = False

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        (kh, kw), (sh, sw) = self.kernel_size, self.strides
        c = x.shape[-1]
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (kh, kw, c, self.features))
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        h, w = x.shape[1], x.shape[2]
        if self.same:
            ho, wo = -(-h // sh), -(-w // sw)
            ph = max((ho - 1) * sh + kh - h, 0)
            pw = max((wo - 1) * sw + kw - w, 0)
            x = jnp.pad(x, ((0, 0), (ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0)))
        else:
            ho, wo = (h - kh) // sh + 1, (w - kw) // sw + 1
        patches = jnp.stack(
            [
                x[:, i : i + (ho - 1) * sh + 1 : sh, j : j + (wo - 1) * sw + 1 : sw, :]
                for i in range(kh)
                for j in range(kw)
            ],
            axis=3,
        )  # [N, H', W', kh * kw, C]
        return jnp.einsum("nhwpc,pco->nhwo", patches, kernel.reshape(kh * kw, c, -1)) + bias


class MLP(nn.Module):
    """`obs [..., *obs_shape] -> [..., num_outputs]`: RLlib's fcnet on the flattened
    observation, or with `conv_filters` its vision net's conv stack first (obs `[..., H, W,
    C]`; 'same' padding but the last conv 'valid', each conv followed by `conv_activation`),
    then the flattened features through the dense layers.

    Layers are `Conv_0 ..` and `Dense_0 .. Dense_{len(hiddens)}`; the last is the output layer.
    """

    hiddens: Sequence[int]
    activation: str
    num_outputs: int
    obs_ndim: int
    conv_filters: Sequence[ConvFilter] = ()
    conv_activation: str = "relu"

    @nn.compact
    def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:
        batch_shape = obs.shape[: obs.ndim - self.obs_ndim]
        if self.conv_filters:
            x = obs.reshape(-1, *obs.shape[obs.ndim - 3 :]).astype(jnp.float32)
            conv_act = ACTIVATIONS[self.conv_activation]
            for i, (out, kernel, stride) in enumerate(self.conv_filters):
                last = i == len(self.conv_filters) - 1
                x = PatchConv(out, tuple(kernel), tuple(stride), same=not last, name=f"Conv_{i}")(x)
                if conv_act is not None:
                    x = conv_act(x)
            x = x.reshape(*batch_shape, -1)
        else:
            x = obs.reshape(*batch_shape, -1).astype(jnp.float32)
        act = ACTIVATIONS[self.activation]
        for width in self.hiddens:
            x = nn.Dense(width)(x)
            if act is not None:
                x = act(x)
        return OutputDense(self.num_outputs, name=f"Dense_{len(self.hiddens)}")(x)


NARROW_FEATURES = 16
"""`OutputDense` contracts the transposed kernel for at most this many features."""


class OutputDense(nn.Module):
    """`nn.Dense` with the same params (`kernel [in, features]`, `bias [features]`) and the
    same numbers, for a narrow output layer: on the CPU, for at most `NARROW_FEATURES`
    features, it multiplies by the kernel's transpose `[features, in]`, kept so by an
    `optimization_barrier`. The kernel's gradient is then a `[features, B] x [B, in]`
    product, which XLA's CPU matmul runs several times faster than the `[in, B] x [B,
    features]` one (benchmarks/README.md, "Issue 14, 6 December"). Elsewhere it is
    `nn.Dense`'s plain product."""

    features: int

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        init = nn.initializers.lecun_normal()
        kernel = self.param("kernel", init, (x.shape[-1], self.features))
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        if jax.default_backend() != "cpu" or self.features > NARROW_FEATURES:
            return x @ kernel + bias
        kernel_t = jax.lax.optimization_barrier(kernel.T)  # [features, in]
        contract = (((x.ndim - 1,), (1,)), ((), ()))
        return jax.lax.dot_general(x, kernel_t, contract) + bias


class ActorCritic(nn.Module):
    """`obs -> (action_dist_inputs [..., num_outputs], value [...])`.

    Separate actor and critic networks (RLlib's `vf_share_layers=False`), or one shared torso
    with a policy head and a value head; with `conv_filters` each network (or the shared
    torso) starts with the conv stack. Initialise with `init_actor_critic` (RLlib's init), not
    with flax's default `init`.
    """

    hiddens: Sequence[int]
    activation: str
    num_outputs: int
    obs_ndim: int
    share_layers: bool = False
    conv_filters: Sequence[ConvFilter] = ()
    conv_activation: str = "relu"

    def setup(self):
        convs = {"conv_filters": self.conv_filters, "conv_activation": self.conv_activation}
        if self.share_layers:
            self.torso = MLP(
                self.hiddens[:-1], self.activation, self.hiddens[-1], self.obs_ndim, **convs
            )
            self.pi_head = OutputDense(self.num_outputs)
            self.v_head = OutputDense(1)
        else:
            self.actor = MLP(
                self.hiddens, self.activation, self.num_outputs, self.obs_ndim, **convs
            )
            self.critic = MLP(self.hiddens, self.activation, 1, self.obs_ndim, **convs)

    def _features(self, obs):
        x = self.torso(obs)
        act = ACTIVATIONS[self.activation]
        return act(x) if act is not None else x

    def policy(self, obs: jnp.ndarray) -> jnp.ndarray:
        if self.share_layers:
            return self.pi_head(self._features(obs))
        return self.actor(obs)

    def value(self, obs: jnp.ndarray) -> jnp.ndarray:
        if self.share_layers:
            return self.v_head(self._features(obs))[..., 0]
        return self.critic(obs)[..., 0]

    def __call__(self, obs: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
        if self.share_layers:
            x = self._features(obs)
            return self.pi_head(x), self.v_head(x)[..., 0]
        return self.actor(obs), self.critic(obs)[..., 0]


OUTPUT_STD = 0.01  # RLlib's fcnet: normc(0.01) for the logits and the value output


def _kernel_std(model: ActorCritic, path: tuple[str, ...]) -> float:
    """normc std of the kernel at `path`: 0.01 for the policy and value outputs, else 1.0."""
    if path[0] in ("pi_head", "v_head"):
        return OUTPUT_STD
    if path[0] in ("actor", "critic") and path[1] == f"Dense_{len(model.hiddens)}":
        return OUTPUT_STD
    return 1.0


def _is_conv(name: tuple[str, ...]) -> bool:
    return name[-1] == "kernel" and name[-2].startswith("Conv_")


def init_actor_critic(
    model: nn.Module, key: jax.Array, obs_shape: tuple[int, ...], *example: jax.Array
):
    """Params of `model` with RLlib's inits and zero biases: dense kernels by
    `normc_initializer` (each kernel column, one unit's incoming weights, is a normal draw
    scaled to norm `std`), conv kernels Glorot-uniform (RLlib's `SlimConv2d`: xavier_uniform,
    limit `sqrt(6 / (fan_in + fan_out))`, fans `kh*kw*in` and `kh*kw*out`).

    All dense kernels come from one normal draw with `key` sliced per layer (conv kernels from
    one uniform draw with `fold_in(key, 1)`): the same distribution as a draw per layer, but
    one random-number kernel for XLA to compile instead of one per layer shape (about 1.5-3 s
    less compile time on a 2-core CPU). `example`: more inputs of `model.init` after the
    observations (the recurrent model's).
    """
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, *obs_shape)), *example)
    flat, treedef = jax.tree_util.tree_flatten_with_path(shapes)
    names = [tuple(k.key for k in path) for path, _ in flat]

    def sizes(conv: bool) -> list[int]:
        return [
            math.prod(leaf.shape) if n[-1] == "kernel" and _is_conv(n) == conv else 0
            for n, (_, leaf) in zip(names, flat, strict=True)
        ]

    dense_sizes, conv_sizes = sizes(False), sizes(True)
    draw = jax.random.normal(key, (sum(dense_sizes),), jnp.float32)
    if sum(conv_sizes):
        uniform = jax.random.uniform(
            jax.random.fold_in(key, 1), (sum(conv_sizes),), jnp.float32, -1.0, 1.0
        )
    leaves, offset, conv_offset = [], 0, 0
    for name, (_, leaf), size, conv_size in zip(names, flat, dense_sizes, conv_sizes, strict=True):
        if conv_size:
            kh, kw, cin, cout = leaf.shape
            limit = math.sqrt(6.0 / (kh * kw * (cin + cout)))
            w = uniform[conv_offset : conv_offset + conv_size].reshape(leaf.shape)
            conv_offset += conv_size
            leaves.append(w * limit)
            continue
        if size == 0:
            leaves.append(jnp.zeros(leaf.shape, leaf.dtype))
            continue
        w = draw[offset : offset + size].reshape(leaf.shape)
        offset += size
        std = _kernel_std(model, name[1:])  # drop the "params" collection
        leaves.append(w * (std / jnp.sqrt(jnp.sum(jnp.square(w), axis=0, keepdims=True))))
    return jax.tree_util.tree_unflatten(treedef, leaves)


# ---- recurrent models (RLlib's `use_lstm`) ---------------------------------------------------
CELL_TYPES = ("lstm", "gru")
"""`model.lstm_cell_type` (a jaxplan key): flax's `OptimizedLSTMCell` or `GRUCell`."""


class RecurrentActorCritic(nn.Module):
    """RLlib's `use_lstm` wrapper: the fcnet (or vision net) trunk without its output layer
    (its last hidden layer's activations), then the previous action (one-hot for `Discrete`)
    and reward if asked, then one recurrent cell of `cell_size` units; the policy logits and
    the value are two linear heads on the cell's output (RLlib's LSTM wrapper reads its value
    from the LSTM output too, whatever `vf_share_layers` says).

    `carry` is flax's (LSTM: `(c, h)`; GRU: `h`), `[*B, cell_size]` arrays. Methods:
    `features(obs, prev_actions, prev_rewards) -> [*B, F]`, `cell_step(carry, x) -> (carry,
    y)`, `heads(y) -> (action_dist_inputs [*B, num_outputs], value [*B])`; `__call__` is one
    step of all three (for `init`)."""

    hiddens: Sequence[int]
    activation: str
    num_outputs: int
    obs_ndim: int
    cell_size: int
    cell_type: str = "lstm"
    conv_filters: Sequence[ConvFilter] = ()
    conv_activation: str = "relu"
    prev_action_size: int = 0  # 0: no previous action; `Discrete(n)`: n (one-hot); Box: dims
    prev_action_discrete: bool = True
    use_prev_reward: bool = False

    def setup(self):
        convs = {"conv_filters": self.conv_filters, "conv_activation": self.conv_activation}
        self.torso = MLP(
            self.hiddens[:-1], self.activation, self.hiddens[-1], self.obs_ndim, **convs
        )
        if self.cell_type == "lstm":
            self.cell = nn.OptimizedLSTMCell(self.cell_size)
        else:
            self.cell = nn.GRUCell(self.cell_size)
        self.pi_head = OutputDense(self.num_outputs)
        self.v_head = OutputDense(1)

    def features(self, obs, prev_actions=None, prev_rewards=None):
        x = self.torso(obs)
        act = ACTIVATIONS[self.activation]
        parts = [act(x) if act is not None else x]
        batch = x.shape[:-1]
        if self.prev_action_size:
            if self.prev_action_discrete:
                parts.append(jax.nn.one_hot(prev_actions, self.prev_action_size))
            else:
                parts.append(prev_actions.reshape(*batch, -1).astype(jnp.float32))
        if self.use_prev_reward:
            parts.append(prev_rewards.astype(jnp.float32)[..., None])
        return jnp.concatenate(parts, axis=-1) if len(parts) > 1 else parts[0]

    def cell_step(self, carry, x):
        return self.cell(carry, x)

    def heads(self, y):
        return self.pi_head(y), self.v_head(y)[..., 0]

    def __call__(self, obs, carry, prev_actions=None, prev_rewards=None):
        carry, y = self.cell_step(carry, self.features(obs, prev_actions, prev_rewards))
        return self.heads(y), carry


@dataclasses.dataclass(frozen=True)
class RecurrentNet:
    """A `RecurrentActorCritic` as pure functions of params and the recurrent state, which is
    a dict of batch fields (`initial_state`): `state_in_0` (`h`), `state_in_1` (LSTM: `c`),
    and with `lstm_use_prev_action` / `lstm_use_prev_reward` the previous step's
    `prev_actions` / `prev_rewards`; all zero at an episode's first step."""

    module: RecurrentActorCritic
    obs_shape: tuple[int, ...]
    num_outputs: int
    prev_action_shape: tuple[int, ...] = ()
    prev_action_dtype: Any = jnp.int32

    @property
    def num_state_arrays(self) -> int:
        return 2 if self.module.cell_type == "lstm" else 1

    def initial_state(self, batch_shape: tuple[int, ...]) -> dict[str, jax.Array]:
        """The zero state of `batch_shape` envs (`{field: [*batch_shape, ...]}`)."""
        size = self.module.cell_size
        out = {
            sb.state_in(i): jnp.zeros((*batch_shape, size), jnp.float32)
            for i in range(self.num_state_arrays)
        }
        if self.module.prev_action_size:
            shape = (*batch_shape, *self.prev_action_shape)
            out[sb.PREV_ACTIONS] = jnp.zeros(shape, self.prev_action_dtype)
        if self.module.use_prev_reward:
            out[sb.PREV_REWARDS] = jnp.zeros(batch_shape, jnp.float32)
        return out

    def init(self, key: jax.Array) -> Any:
        """RLlib's normc init for the trunk and the heads (`init_actor_critic`), flax's own for
        the cell (LeCun-normal input kernels, orthogonal recurrent kernels, zero biases)."""
        example = self._example()
        params = init_actor_critic(self.module, key, self.obs_shape, *example)
        own = self.module.init(
            jax.random.fold_in(key, 2), jnp.zeros((1, *self.obs_shape)), *example
        )
        return {"params": {**params["params"], "cell": own["params"]["cell"]}}

    def _example(self):
        state = self.initial_state((1,))
        return (
            self._carry(state),
            state.get(sb.PREV_ACTIONS),
            state.get(sb.PREV_REWARDS),
        )

    def _carry(self, state: dict[str, jax.Array]) -> Any:
        """flax's carry from the state fields (LSTM `(c, h)` from `state_in_1`, `state_in_0`)."""
        if self.num_state_arrays == 2:
            return (state[sb.state_in(1)], state[sb.state_in(0)])
        return state[sb.state_in(0)]

    def _fields(self, carry: Any, name) -> dict[str, jax.Array]:
        """flax's carry as `{name(i): array}` (`name` is `state_in` or `state_out`)."""
        arrays = (carry[1], carry[0]) if self.num_state_arrays == 2 else (carry,)
        return {name(i): a for i, a in enumerate(arrays)}

    def _features(self, params, obs, state):
        return self.module.apply(
            params,
            obs,
            state.get(sb.PREV_ACTIONS),
            state.get(sb.PREV_REWARDS),
            method=RecurrentActorCritic.features,
        )

    def step(self, params: Any, obs: jax.Array, state: dict[str, jax.Array]):
        """One step of envs `[*B]` from `state`: `(action_dist_inputs [*B, num_outputs],
        value [*B], {state_out_i: [*B, cell_size]})`."""
        x = self._features(params, obs, state)
        carry, y = self.module.apply(
            params, self._carry(state), x, method=RecurrentActorCritic.cell_step
        )
        inputs, value = self.module.apply(params, y, method=RecurrentActorCritic.heads)
        return inputs, value, self._fields(carry, sb.state_out)

    def unroll(
        self,
        params: Any,
        obs: jax.Array,
        state: dict[str, jax.Array],
        resets: jax.Array,
    ):
        """Time-major sequences: `obs [L, *B, *obs_shape]`, `state` the fields `[L, *B, ...]`
        (`state_in_i` is read at `t = 0` only: the state the sequences start from;
        `prev_actions` / `prev_rewards` at every step), `resets [L, *B]` bool: the state is
        zeroed before step `t` where set (an episode began there). The trunk runs once on all
        `L x B` inputs, the cell is a `scan` over `L`. Returns `(action_dist_inputs [L, *B,
        num_outputs], values [L, *B], {state_out_i: [L, *B, cell_size]})`."""
        x = self._features(params, obs, state)
        carry = self._carry({k: v[0] for k, v in state.items() if k.startswith("state_in_")})

        def body(carry, inp):
            x_t, reset_t = inp
            carry = jax.tree.map(
                lambda c: jnp.where(reset_t[..., None], jnp.zeros_like(c), c), carry
            )
            carry, y = self.module.apply(params, carry, x_t, method=RecurrentActorCritic.cell_step)
            return carry, (y, self._fields(carry, sb.state_out))

        _, (y, carries) = jax.lax.scan(body, carry, (x, resets))
        inputs, values = self.module.apply(params, y, method=RecurrentActorCritic.heads)
        return inputs, values, carries


# ---- custom models --------------------------------------------------------------------------
ModelFactory = Callable[[tuple[int, ...], int, Any, dict], nn.Module]
"""`(obs_shape, num_outputs, model_config, custom_model_config) -> nn.Module`."""

_REGISTRY: dict[str, Any] = {}


def register_model(name: str, model: type[nn.Module] | ModelFactory) -> None:
    """Makes `model` (a flax `nn.Module` subclass or a `ModelFactory`, see the module
    docstring for the contract) available as `model.custom_model = name` (RLlib's
    `ModelCatalog.register_custom_model`). Registering a name again replaces its model."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_model: the name must be a non-empty string, got {name!r}")
    if not callable(model):
        raise ValueError(
            f"register_model({name!r}, ...): expected a flax nn.Module subclass or a factory "
            f"(obs_shape, num_outputs, model_config, custom_model_config) -> nn.Module, "
            f"got {model!r}"
        )
    _REGISTRY[name] = model


def registered_models() -> list[str]:
    """The names given to `register_model`, sorted."""
    return sorted(_REGISTRY)


def resolve_model(spec: Any) -> type[nn.Module] | ModelFactory:
    """The model that `model.custom_model = spec` names: a registered name, an import path
    `"module:attribute"`, or the model itself; `ValueError` naming the registered names when
    a name is neither registered nor importable."""
    if not isinstance(spec, str):
        if callable(spec) and not isinstance(spec, nn.Module):
            return spec
        raise ValueError(
            f"model.custom_model = {spec!r}: expected a registered name, 'module:attribute', "
            "a flax nn.Module subclass or a model factory (not a module instance: the model "
            "is built for the env's num_outputs)"
        )
    if spec in _REGISTRY:
        return _REGISTRY[spec]
    known = ", ".join(map(repr, registered_models())) or "none"
    if ":" not in spec:
        raise ValueError(
            f"model.custom_model = {spec!r}: no model registered under this name; registered: "
            f"{known} (jaxplan.register_model(name, model), or give 'module:attribute')"
        )
    module_name, _, attr = spec.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as e:  # noqa: BLE001 - any import failure is the same user error
        raise ValueError(
            f"model.custom_model = {spec!r}: cannot import it ({type(e).__name__}: {e}); "
            f"registered names: {known}. Register the model under this name "
            "(jaxplan.register_model) in this process to use it"
        ) from None
    return resolve_model(obj)


def model_name(spec: Any) -> str | None:
    """What a run saves for `model.custom_model = spec`: the name itself, the name a model was
    registered under, or the model's import path `"module:qualname"`."""
    if spec is None or isinstance(spec, str):
        return spec
    for name, model in _REGISTRY.items():
        if model is spec:
            return name
    return f"{getattr(spec, '__module__', '?')}:{getattr(spec, '__qualname__', repr(spec))}"


@dataclasses.dataclass(frozen=True)
class ActorCriticNet:
    """A flax actor-critic `module` as pure functions of `(params, obs [*B, *obs_shape])`:
    `init(key) -> params`, `policy -> action_dist_inputs [*B, num_outputs]`, `value -> [*B]`,
    and `__call__ -> (action_dist_inputs, value)`. `custom` modules get their batch dims
    flattened to one and their own `init`; the default `ActorCritic` gets RLlib's init."""

    module: nn.Module
    obs_shape: tuple[int, ...]
    num_outputs: int
    custom: bool = False

    def init(self, key: jax.Array) -> Any:
        if not self.custom:
            return init_actor_critic(self.module, key, self.obs_shape)
        variables = self.module.init(key, jnp.zeros((1, *self.obs_shape)))
        return {"params": variables.get("params", {})}

    def _apply(self, params, obs, method: str | None):
        if not self.custom:
            fn = getattr(ActorCritic, method) if method else None
            return self.module.apply(params, obs, method=fn)
        batch = obs.shape[: obs.ndim - len(self.obs_shape)]
        flat = obs.reshape(-1, *self.obs_shape).astype(jnp.float32)
        if method and hasattr(type(self.module), method):
            out = self.module.apply(params, flat, method=getattr(type(self.module), method))
        else:
            out = self.module.apply(params, flat)
            if method:
                out = out[0 if method == "policy" else 1]
        return jax.tree.map(lambda x: x.reshape(*batch, *x.shape[1:]), out)

    def policy(self, params: Any, obs: jax.Array) -> jax.Array:
        return self._apply(params, obs, "policy")

    def value(self, params: Any, obs: jax.Array) -> jax.Array:
        return self._apply(params, obs, "value")

    def __call__(self, params: Any, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        return self._apply(params, obs, None)

    def check_shapes(self, name: str) -> None:
        """Raises `ValueError` naming the shapes when the module's outputs for `obs [2,
        *obs_shape]` are not `([2, num_outputs], [2])` (traced abstractly: nothing runs)."""
        obs = jax.ShapeDtypeStruct((2, *self.obs_shape), jnp.float32)
        want = f"(action_dist_inputs [2, {self.num_outputs}], value [2])"
        dims = ", ".join(map(str, self.obs_shape))
        try:
            variables = jax.eval_shape(
                self.module.init, jax.random.PRNGKey(0), jnp.zeros((1, *self.obs_shape))
            )
        except Exception as e:
            raise ValueError(
                f"custom_model {name}: init on observations [1, {dims}] failed: "
                f"{type(e).__name__}: {e}"
            ) from e
        extra = sorted(set(variables) - {"params"})
        if extra:
            raise ValueError(
                f"custom_model {name}: has variable collections {extra} besides 'params'; "
                "only params are trained and saved (no batch statistics or other state)"
            )
        params = {"params": variables.get("params", {})}

        def shapes(method: str | None):
            flat = self.module.apply if method is None else self._apply
            try:
                if method is None:
                    out = jax.eval_shape(lambda p, o: flat(p, o), params, obs)
                else:
                    out = jax.eval_shape(lambda p, o: flat(p, o, method), params, obs)
            except Exception as e:
                raise ValueError(
                    f"custom_model {name}: {method or '__call__'}(obs {list(obs.shape)}) failed: "
                    f"{type(e).__name__}: {e}"
                ) from e
            return out

        def shape(x):
            return list(x.shape) if hasattr(x, "shape") else repr(x)

        out = shapes(None)
        ok = (
            isinstance(out, tuple)
            and len(out) == 2
            and all(hasattr(x, "shape") for x in out)
            and tuple(out[0].shape) == (2, self.num_outputs)
            and tuple(out[1].shape) == (2,)
        )
        if not ok:
            got = (
                "(" + ", ".join(str(shape(x)) for x in out) + ")"
                if isinstance(out, tuple)
                else shape(out)
            )
            raise ValueError(
                f"custom_model {name}: __call__(obs {list(obs.shape)}) must return {want}, "
                f"got {got}"
            )
        for method, expected in (("policy", (2, self.num_outputs)), ("value", (2,))):
            if hasattr(type(self.module), method):
                got = shapes(method)
                if tuple(getattr(got, "shape", ())) != expected or not hasattr(got, "shape"):
                    raise ValueError(
                        f"custom_model {name}: {method}(obs {list(obs.shape)}) must return "
                        f"{list(expected)}, got {shape(got)}"
                    )


def build_model(
    obs_shape: tuple[int, ...], num_outputs: int, config: Any, action_space: Any = None
) -> ActorCriticNet | RecurrentNet:
    """The actor-critic for observations `obs_shape` and `num_outputs` distribution inputs
    from a `ModelConfig`: its `custom_model` if set (shapes checked), else RLlib's default
    (`ActorCritic`: the vision net for rank-3 observations, with `conv_filters` or the
    defaults for the image size, else the fcnet); with `use_lstm`, that trunk under a
    recurrent cell (`RecurrentNet`; `action_space` sizes the previous-action input)."""
    obs_shape = tuple(obs_shape)
    if getattr(config, "use_lstm", False) and config.custom_model is not None:
        raise ValueError(
            "model.use_lstm wraps the default network; it cannot wrap model.custom_model "
            f"({model_name(config.custom_model)!r}): build the recurrence into the custom model"
        )
    if config.custom_model is not None:
        model = resolve_model(config.custom_model)
        custom_config = dict(config.custom_model_config)
        if isinstance(model, type) and issubclass(model, nn.Module):
            module = model(num_outputs=num_outputs, **custom_config)
        else:
            module = model(obs_shape, num_outputs, config, custom_config)
        name = repr(model_name(config.custom_model))
        if not isinstance(module, nn.Module):
            raise ValueError(
                f"custom_model {name}: the factory returned {module!r}, not an nn.Module"
            )
        net = ActorCriticNet(module, obs_shape, num_outputs, custom=True)
        net.check_shapes(name)
        return net
    filters: tuple = ()
    if len(obs_shape) == 3:
        filters = (
            get_filter_config(obs_shape) if config.conv_filters is None else config.conv_filters
        )
        if filters:
            conv_output_shape(obs_shape, filters)
    if getattr(config, "use_lstm", False):
        return _recurrent_net(obs_shape, num_outputs, config, tuple(filters), action_space)
    module = ActorCritic(
        hiddens=tuple(config.fcnet_hiddens),
        activation=config.fcnet_activation,
        num_outputs=num_outputs,
        obs_ndim=len(obs_shape),
        share_layers=config.vf_share_layers,
        conv_filters=tuple(filters),
        conv_activation=config.conv_activation,
    )
    return ActorCriticNet(module, obs_shape, num_outputs)


def _recurrent_net(obs_shape, num_outputs, config, filters, action_space) -> RecurrentNet:
    """`build_model`'s `use_lstm` network."""
    from jaxplan.envs import Discrete

    size, discrete, shape, dtype = 0, True, (), jnp.int32
    if config.lstm_use_prev_action:
        if action_space is None:
            raise ValueError("model.lstm_use_prev_action needs the action space")
        discrete = isinstance(action_space, Discrete)
        if discrete:
            size = action_space.n
        else:
            shape, dtype = tuple(action_space.shape), jnp.float32
            size = max(1, math.prod(shape))
    module = RecurrentActorCritic(
        hiddens=tuple(config.fcnet_hiddens),
        activation=config.fcnet_activation,
        num_outputs=num_outputs,
        obs_ndim=len(obs_shape),
        cell_size=config.lstm_cell_size,
        cell_type=config.lstm_cell_type,
        conv_filters=filters,
        conv_activation=config.conv_activation,
        prev_action_size=size,
        prev_action_discrete=discrete,
        use_prev_reward=config.lstm_use_prev_reward,
    )
    return RecurrentNet(module, obs_shape, num_outputs, shape, dtype)
