"""RLlib's vision net (default filters, conv against a numpy reference, init), custom models
(registered, passed directly, import paths; shape errors; saved by name and loaded again),
and the fcnet's params unchanged bit for bit."""

import hashlib
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxplan
from jaxplan import cli, models
from jaxplan.models import (
    DEFAULT_FILTERS,
    MINATAR_FILTERS,
    ActorCritic,
    build_model,
    get_filter_config,
    init_actor_critic,
)
from jaxplan.ppo.config import ModelConfig, PPOConfig

TINY = {
    "num_workers": 2,
    "num_envs_per_worker": 2,
    "rollout_fragment_length": 32,
    "train_batch_size": 128,
    "sgd_minibatch_size": 64,
    "num_sgd_iter": 2,
}


def _model(**kw) -> ModelConfig:
    return PPOConfig.from_dict({"model": kw}).model


@pytest.fixture
def registry(monkeypatch):
    """A private model registry for the test (restored after)."""
    monkeypatch.setattr(models, "_REGISTRY", {})
    return models._REGISTRY


class TinyAC(nn.Module):
    """Separate actor and critic (one hidden layer each), with `policy` and `value`."""

    num_outputs: int
    width: int = 8

    def setup(self):
        self.pi = nn.Sequential([nn.Dense(self.width), nn.tanh, nn.Dense(self.num_outputs)])
        self.vf = nn.Sequential([nn.Dense(self.width), nn.tanh, nn.Dense(1)])

    def policy(self, obs):
        return self.pi(obs)

    def value(self, obs):
        return self.vf(obs)[:, 0]

    def __call__(self, obs):
        return self.policy(obs), self.value(obs)


def shared_trunk(obs_shape, num_outputs, model_config, custom_model_config):
    """A factory: one shared trunk with two heads, `__call__` only."""

    class Shared(nn.Module):
        @nn.compact
        def __call__(self, obs):
            x = nn.relu(nn.Dense(custom_model_config["width"])(obs))
            return nn.Dense(num_outputs)(x), nn.Dense(1)(x)[:, 0]

    return Shared()


# ---- vision net ---------------------------------------------------------------------------
def test_default_filters_follow_rllib():
    assert get_filter_config((84, 84, 4)) == (
        (16, (8, 8), (4, 4)),
        (32, (4, 4), (2, 2)),
        (256, (11, 11), (1, 1)),
    )
    assert get_filter_config((42, 42, 1)) == DEFAULT_FILTERS[(42, 42)]
    assert get_filter_config((10, 10, 6)) == MINATAR_FILTERS == ((16, (3, 3), (1, 1)),)
    with pytest.raises(ValueError, match=r"observations \[32, 32, 3\].*84x84xC.*conv_filters"):
        get_filter_config((32, 32, 3))
    with pytest.raises(ValueError, match=r"conv_filters\[0\]: kernel \[11, 11\].*\[10, 10\]"):
        build_model((10, 10, 2), 3, _model(conv_filters=[[8, [11, 11], 1]]))
    # rank-1 observations ignore conv_filters (RLlib's fcnet); [] flattens an image
    flat = build_model((4,), 2, _model(conv_filters=[[8, 3, 1]])).module
    assert flat.conv_filters == ()
    net = build_model((10, 10, 4), 3, _model(conv_filters=[], fcnet_hiddens=[8]))
    params = jax.eval_shape(net.init, jax.random.PRNGKey(0))["params"]
    assert params["actor"]["Dense_0"]["kernel"].shape == (400, 8)


@pytest.mark.parametrize(
    "obs_shape, share, features",
    [((10, 10, 4), False, 8 * 8 * 16), ((84, 84, 3), True, 256)],
)
def test_vision_net_shapes(obs_shape, share, features):
    config = _model(fcnet_hiddens=[16], vf_share_layers=share)
    net = build_model(obs_shape, 5, config)
    params = net.init(jax.random.PRNGKey(0))
    filters = get_filter_config(obs_shape)
    trunks = ["torso"] if share else ["actor", "critic"]
    in_channels = obs_shape[-1]
    for i, (out, kernel, _) in enumerate(filters):
        for trunk in trunks:
            assert params["params"][trunk][f"Conv_{i}"]["kernel"].shape == (
                *kernel,
                in_channels,
                out,
            )
        in_channels = out
    for trunk in trunks:  # flattened conv features into the first dense layer
        assert params["params"][trunk]["Dense_0"]["kernel"].shape == (features, 16)
    obs = jnp.ones((2, 3, *obs_shape))
    inputs, values = net(params, obs)
    assert inputs.shape == (2, 3, 5) and values.shape == (2, 3)
    assert net.policy(params, obs[0, 0]).shape == (5,)
    assert net.value(params, obs[0]).shape == (3,)
    np.testing.assert_allclose(net.value(params, obs), values, rtol=1e-5, atol=1e-6)
    # RLlib's init: Glorot-uniform conv kernels, zero biases, normc(0.01) outputs (near zero)
    if not share:
        k = np.asarray(params["params"]["actor"]["Conv_0"]["kernel"], np.float64)
        kh, kw, cin, cout = k.shape
        limit = np.sqrt(6.0 / (kh * kw * (cin + cout)))
        assert np.abs(k).max() <= limit and np.abs(k).max() > 0.9 * limit
        np.testing.assert_allclose(k.std(), limit / np.sqrt(3), rtol=0.1)
        assert not np.asarray(params["params"]["actor"]["Conv_0"]["bias"]).any()
        assert np.abs(np.asarray(inputs)).max() < 0.1


def _conv_same_then_valid(x, layers):
    """float64 numpy reference of RLlib's conv stack: 'same' padding (TF's rule: pad_total =
    max((out - 1) * s + k - in, 0), low half rounded down) but the last layer 'valid', relu."""
    for i, (w, b, (sh, sw)) in enumerate(layers):
        kh, kw = w.shape[:2]
        h, wd = x.shape[:2]
        if i < len(layers) - 1:
            oh, ow = -(-h // sh), -(-wd // sw)
            ph = max((oh - 1) * sh + kh - h, 0)
            pw = max((ow - 1) * sw + kw - wd, 0)
            x = np.pad(x, ((ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0)))
        else:
            oh, ow = (h - kh) // sh + 1, (wd - kw) // sw + 1
        out = np.zeros((oh, ow, w.shape[3]))
        for r in range(oh):
            for c in range(ow):
                patch = x[r * sh : r * sh + kh, c * sw : c * sw + kw, :]
                out[r, c] = np.einsum("hwi,hwio->o", patch, w) + b
        x = np.maximum(out, 0.0)
    return x


def test_conv_stack_matches_numpy_reference():
    filters = ((3, (2, 2), (1, 1)), (2, (3, 3), (2, 2)))
    model = ActorCritic((4,), "tanh", 2, obs_ndim=3, conv_filters=filters)
    params = init_actor_critic(model, jax.random.PRNGKey(3), (6, 5, 2))
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), params["params"]["actor"])
    # non-zero biases, so a wrong bias or padding shows
    rng = np.random.default_rng(0)
    p = {k: {**v, "bias": rng.normal(size=v["bias"].shape)} for k, v in p.items()}
    obs = rng.normal(size=(3, 6, 5, 2))
    layers = [
        (p[f"Conv_{i}"]["kernel"], p[f"Conv_{i}"]["bias"], f[2]) for i, f in enumerate(filters)
    ]
    want = []
    for o in obs:
        x = _conv_same_then_valid(o, layers).reshape(-1)  # (6,5) -same-> (6,5) -valid s2-> (2,2)
        x = np.tanh(x @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"])
        want.append(x @ p["Dense_1"]["kernel"] + p["Dense_1"]["bias"])
    params32 = {"params": {**params["params"], "actor": jax.tree.map(jnp.float32, p)}}
    got = model.apply(params32, jnp.float32(obs), method=ActorCritic.policy)
    np.testing.assert_allclose(np.asarray(got), np.stack(want), rtol=2e-5, atol=2e-5)


def test_fcnet_params_unchanged_bit_for_bit():
    """The fcnet's params for a fixed key are those of the MLP-only models.py (commit bc9a0d2):
    same tree, same bytes (sha256 over the leaves in flattening order)."""
    golden = {
        False: "8f06bd11c39afc503c65643848cca5a6769c61a8d521756f67ffd692583c1b8f",
        True: "30ef1b8f23ded27bfd257d2f38c875f9e5a63b9b04ddb0eda20f5d2b039b874c",
    }
    for share in (False, True):
        config = _model(fcnet_hiddens=[8, 8], vf_share_layers=share)
        params = build_model((4,), 2, config).init(jax.random.PRNGKey(7))
        flat = jax.tree_util.tree_flatten_with_path(params)[0]
        names = {jax.tree_util.keystr(k) for k, _ in flat}
        layers = (
            ["torso/Dense_0", "torso/Dense_1", "pi_head", "v_head"]
            if share
            else [f"{t}/Dense_{i}" for t in ("actor", "critic") for i in range(3)]
        )
        want = {
            "['params']" + "".join(f"['{n}']" for n in [*layer.split("/"), leaf])
            for layer in layers
            for leaf in ("bias", "kernel")
        }
        assert names == want
        digest = hashlib.sha256(b"".join(np.asarray(v).tobytes() for _, v in flat)).hexdigest()
        assert digest == golden[share]


# ---- custom models --------------------------------------------------------------------------
def test_custom_model_errors(registry):
    jaxplan.register_model("tiny", TinyAC)
    with pytest.raises(ValueError, match=r"'model.custom_model'\] = 'tinyy'.*registered: 'tiny'"):
        PPOConfig.from_dict({"model.custom_model": "tinyy"})
    with pytest.raises(ValueError, match=r"cannot import it \(ModuleNotFoundError"):
        PPOConfig.from_dict({"model.custom_model": "no_such_pkg.nets:Net"})
    with pytest.raises(ValueError, match=r"not a module instance"):
        PPOConfig.from_dict({"model.custom_model": TinyAC(num_outputs=2)})

    class ColumnValue(TinyAC):
        def value(self, obs):
            return self.vf(obs)  # [B, 1], not [B]

    with pytest.raises(ValueError, match=r"must return \(action_dist_inputs \[2, 2\], value \[2\]"):
        build_model((4,), 2, _model(custom_model=ColumnValue))  # __call__ uses value()

    class WrongPolicy(TinyAC):
        def __call__(self, obs):
            return self.pi(obs), self.value(obs)  # right; policy() is not

        def policy(self, obs):
            return self.pi(obs)[:, :1]

    with pytest.raises(
        ValueError, match=r"policy\(obs \[2, 4\]\) must return \[2, 2\], got \[2, 1\]"
    ):
        build_model((4,), 2, _model(custom_model=WrongPolicy))
    with pytest.raises(ValueError, match=r"the factory returned 3, not an nn.Module"):
        build_model((4,), 2, _model(custom_model=lambda *args: 3))


def _finite_run(config: PPOConfig):
    plan = jaxplan.execution_plan(jaxplan.build_workers(config), config)
    _, results = jax.jit(jaxplan.make_train(plan, 2))(jax.random.PRNGKey(0))
    stats = results["info"]["learner"]["default_policy"]["learner_stats"]
    assert np.isfinite(np.asarray(stats["total_loss"])).all()
    assert np.asarray(results["training_iteration"]).tolist() == [1, 2]
    return plan


def test_directly_passed_factory_trains():
    config = PPOConfig.from_dict(
        {**TINY, "model": {"custom_model": shared_trunk, "custom_model_config": {"width": 8}}}
    )
    plan = _finite_run(config)
    params = jax.eval_shape(plan.init, jax.random.PRNGKey(0)).policies["default_policy"].params
    assert set(params["params"]) == {"Dense_0", "Dense_1", "Dense_2"}
    # saved as an import path; a factory defined at module level resolves back to itself
    saved = config.to_dict()["model"]["custom_model"]
    assert saved.endswith("test_custom_models:shared_trunk")
    assert models.resolve_model(saved) is shared_trunk


def test_registered_model_trains_saves_and_loads(tmp_path, registry, monkeypatch):
    jaxplan.register_model("tiny_ac", TinyAC)
    out = tmp_path / "run"
    argv = ["train", "ppo", "--quiet", "--no-compile-cache", "--stop-iters", "2"]
    argv += [f"--config={k}={v}" for k, v in TINY.items()]
    argv += [
        "--config",
        "model.custom_model=tiny_ac",
        "--config",
        'model.custom_model_config={"width": 4}',
    ]
    assert cli.main([*argv, "--output", str(out)]) == 0
    saved = json.loads((out / "params.json").read_text())["config"]["model"]
    assert saved["custom_model"] == "tiny_ac" and saved["custom_model_config"] == {"width": 4}
    rows = [json.loads(line) for line in (out / "result.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    assert np.isfinite(rows[-1]["info"]["learner"]["default_policy"]["learner_stats"]["total_loss"])

    policy = jaxplan.load_policy(out)
    assert policy.params["params"]["pi"]["layers_0"]["kernel"].shape == (4, 4)
    obs = np.random.default_rng(1).normal(size=(16, 4)).astype(np.float32)
    logits = TinyAC(num_outputs=2, width=4).apply(policy.params, obs, method=TinyAC.policy)
    assert np.array_equal(np.asarray(policy.act(obs)), np.argmax(np.asarray(logits), -1))
    values = TinyAC(num_outputs=2, width=4).apply(policy.params, obs, method=TinyAC.value)
    np.testing.assert_allclose(np.asarray(policy.value(obs)), np.asarray(values), rtol=1e-6)

    # a loading process that has not registered the name gets told so, before any restore
    monkeypatch.setattr(models, "_REGISTRY", {"other": TinyAC})
    with pytest.raises(ValueError, match=r"'tiny_ac': no model registered.*registered: 'other'"):
        jaxplan.load_policy(out)


@pytest.mark.parametrize(
    "shape, kernel, stride, same",
    [
        ((10, 10, 4), (3, 3), (1, 1), False),  # MinAtar's conv
        ((10, 10, 4), (3, 3), (1, 1), True),
        ((84, 84, 3), (8, 8), (4, 4), True),
        ((11, 9, 2), (4, 4), (2, 2), True),  # even kernel: TF's uneven 'same' padding
        ((11, 9, 2), (4, 3), (2, 3), False),
    ],
)
def test_patch_conv_is_flax_conv(shape, kernel, stride, same):
    """The vision net's conv (strided slices and a matmul, fast in a loop body on CPU) computes
    `nn.Conv` with the same params, and its gradients."""
    from jaxplan.models import PatchConv

    x = jnp.asarray(np.random.default_rng(0).normal(size=(3, *shape)), jnp.float32)
    ref = nn.Conv(5, kernel, stride, padding="SAME" if same else "VALID")
    params = ref.init(jax.random.PRNGKey(0), x)
    ours = PatchConv(5, kernel, stride, same=same)
    np.testing.assert_allclose(ours.apply(params, x), ref.apply(params, x), atol=1e-5)
    g_ours = jax.grad(lambda p: jnp.sum(jnp.tanh(ours.apply(p, x))))(params)
    g_ref = jax.grad(lambda p: jnp.sum(jnp.tanh(ref.apply(p, x))))(params)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4), g_ours, g_ref)
