"""PPOConfig: RLlib's defaults, field natures, validation errors that name the key, type
coercion, presets, round trips."""

import dataclasses

import pytest

from jaxplan import PPOConfig, PPOHParams, preset_config
from jaxplan.ppo import presets
from jaxplan.ppo.config import PER_POLICY_KEYS, PRESETS, TRACED_FIELDS


def test_defaults_are_rllibs():
    c = PPOConfig()
    assert (c.lr, c.train_batch_size, c.sgd_minibatch_size, c.num_sgd_iter) == (5e-5, 4000, 128, 30)
    assert (c.clip_param, c.vf_clip_param, c.kl_coeff, c.kl_target) == (0.3, 10.0, 0.2, 0.01)
    assert (c.lambda_, c.gamma, c.entropy_coeff, c.vf_loss_coeff) == (1.0, 0.99, 0.0, 1.0)
    assert (c.rollout_fragment_length, c.num_workers, c.num_envs_per_worker) == (200, 2, 1)
    assert c.model.fcnet_hiddens == (256, 256) and c.model.fcnet_activation == "tanh"
    assert not c.model.vf_share_layers
    assert c.multiagent.count_steps_by == "env_steps"
    assert c.metrics_smoothing_episodes == 100


@pytest.mark.parametrize(
    "key, suggestion",
    [
        ("lamda", "lambda"),
        ("train_batchsize", "train_batch_size"),
        ("num_sgd_iters", "num_sgd_iter"),
        ("model.fcnet_hidden", "model.fcnet_hiddens"),
        ("entropy_coef", "entropy_coeff"),
    ],
)
def test_unknown_key_names_nearest_valid_key(key, suggestion):
    with pytest.raises(ValueError) as e:
        PPOConfig.from_dict({key: 1})
    msg = str(e.value)
    assert f"Unknown config key {key!r}" in msg
    assert f"did you mean {suggestion!r}" in msg


def test_unknown_key_without_close_match_lists_valid_keys():
    with pytest.raises(ValueError, match="Valid keys: .*train_batch_size"):
        PPOConfig.from_dict({"zzzzzz": 1})


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"lr": 0}, "lr"),
        ({"lr": -1e-3}, "lr"),
        ({"gamma": 1.5}, "gamma"),
        ({"lambda": -0.1}, "lambda"),
        ({"clip_param": 0}, "clip_param"),
        ({"entropy_coeff": -0.01}, "entropy_coeff"),
        ({"kl_coeff": -1}, "kl_coeff"),
        ({"grad_clip": 0}, "grad_clip"),
        ({"num_sgd_iter": 0}, "num_sgd_iter"),
        ({"train_batch_size": 0}, "train_batch_size"),
        ({"num_workers": -1}, "num_workers"),
        ({"rollout_fragment_length": 0}, "rollout_fragment_length"),
        ({"sgd_minibatch_size": 5000}, "sgd_minibatch_size"),  # > train_batch_size 4000
        ({"model": {"fcnet_hiddens": []}}, "model.fcnet_hiddens"),
        ({"model.fcnet_activation": "sigmoidal"}, "model.fcnet_activation"),
        ({"multiagent.count_steps_by": "episodes"}, "multiagent.count_steps_by"),
    ],
)
def test_bad_values_name_the_key(overrides, key):
    with pytest.raises(ValueError) as e:
        PPOConfig.from_dict(overrides)
    assert f"config[{key!r}]" in str(e.value)


@pytest.mark.parametrize(
    "overrides, key, expected",
    [
        ({"train_batch_size": "big"}, "train_batch_size", "an integer"),
        ({"train_batch_size": 3.5}, "train_batch_size", "an integer"),
        ({"lr": "fast"}, "lr", "a number"),
        ({"shuffle_sequences": 1}, "shuffle_sequences", "true or false"),
        ({"model": {"fcnet_hiddens": "64"}}, "model.fcnet_hiddens", "a list of integers"),
        ({"model": 3}, "model", "must be a dict"),
        ({"lr": None}, "lr", "expected a number"),
        ({"num_workers": True}, "num_workers", "an integer"),
        ({"gamma": False}, "gamma", "a number"),
        ({"env": 3}, "env", "a string"),
        ({"env_config": [1]}, "env_config", "a dict"),
        ({"model.fcnet_hiddens": [64, True]}, "model.fcnet_hiddens", "a list of integers"),
        ({"multiagent.policies_to_train": "p0"}, "multiagent.policies_to_train", "strings"),
    ],
)
def test_wrong_types_are_errors(overrides, key, expected):
    with pytest.raises(ValueError) as e:
        PPOConfig.from_dict(overrides)
    assert repr(key) in str(e.value) and expected in str(e.value)


def test_values_are_coerced_as_json_and_yaml_mean_them():
    c = PPOConfig.from_dict(
        {
            "train_batch_size": 512.0,
            "lr": 1,
            "model.fcnet_hiddens": [32.0, 32],
            "multiagent.policies_to_train": ["default_policy"],
            "grad_clip": None,
            "num_devices": None,
        }
    )
    assert c.train_batch_size == 512 and type(c.train_batch_size) is int
    assert c.lr == 1.0 and type(c.lr) is float
    assert c.model.fcnet_hiddens == (32, 32) and all(type(h) is int for h in c.model.fcnet_hiddens)
    assert c.multiagent.policies_to_train == ("default_policy",)
    assert c.grad_clip is None and c.num_devices is None


def test_field_natures_derive_per_policy_keys_and_hparams():
    assert set(TRACED_FIELDS) == {f.name for f in dataclasses.fields(PPOHParams)}
    traced_keys = {"lambda" if n == "lambda_" else n for n in TRACED_FIELDS}
    assert traced_keys == {
        "lr",
        "gamma",
        "lambda",
        "kl_target",
        "clip_param",
        "vf_clip_param",
        "vf_loss_coeff",
        "entropy_coeff",
    }
    assert set(PER_POLICY_KEYS) - traced_keys == {
        "kl_coeff",
        "grad_clip",
        "lr_schedule",
        "entropy_coeff_schedule",
        "model",
        "vtrace",
        "vtrace_clip_rho_threshold",
        "vtrace_clip_pg_rho_threshold",
        "vtrace_clip_c_threshold",
    }
    assert traced_keys < set(PER_POLICY_KEYS)
    h = PPOHParams.from_config(preset_config("Pendulum-v1"))
    assert h.lambda_.dtype == "float32" and float(h.gamma) == pytest.approx(0.95)
    c = PPOConfig.from_dict(
        {"multiagent": {"policies": {"p": {"lambda": 0.5, "model": {"fcnet_hiddens": [8]}}}}}
    )
    assert c.policy_config("p").lambda_ == 0.5 and c.policy_config("p").model.fcnet_hiddens == (8,)
    with pytest.raises(ValueError, match=r"\['num_sgd_iter'\] cannot differ per policy"):
        PPOConfig.from_dict({"multiagent": {"policies": {"p": {"num_sgd_iter": 2}}}})


def test_invariants_owned_by_plan_components_are_not_config_errors():
    """Device divisibility, rollout modes and the policy mapping are checked when the plan is
    built (by WorkerSet, MultiGPUTrainOneStep, ParallelRollouts, resolve_policy_mapping)."""
    PPOConfig.from_dict({"num_devices": 4, "num_workers": 2, "sgd_minibatch_size": 130})
    PPOConfig.from_dict({"rollout_mode": "async", "num_workers": 3, "num_async": 0})
    PPOConfig.from_dict({"multiagent": {"policies": {"a": {}, "b": {}}}})
    PPOConfig.from_dict({"multiagent": {"policy_mapping": {"x": "nope"}}})


def test_agent_steps_on_single_agent_env_is_an_error():
    with pytest.raises(ValueError, match="agent_steps.*single-agent"):
        PPOConfig.from_dict({"multiagent": {"count_steps_by": "agent_steps"}})


def test_dotted_and_nested_overrides_and_lambda_alias():
    c = PPOConfig.from_dict({"model.fcnet_hiddens": [64, 64], "lambda": 0.9, "lr": 1})
    assert c.model.fcnet_hiddens == (64, 64) and c.model.fcnet_activation == "tanh"
    assert c.lambda_ == 0.9 and isinstance(c.lr, float)
    c2 = c.updated({"model": {"fcnet_activation": "relu"}})
    assert c2.model.fcnet_hiddens == (64, 64) and c2.model.fcnet_activation == "relu"


def test_to_dict_round_trips():
    c = preset_config("CartPole-v1", {"grad_clip": None})
    d = c.to_dict()
    assert "lambda" in d and "lambda_" not in d
    assert PPOConfig.from_dict(d) == c


def test_presets_validate_and_apply_on_top_of_defaults():
    assert PRESETS is presets.PRESETS
    for env in PRESETS:
        c = preset_config(env)
        assert c.env == env
    c = preset_config("CartPole-v1", {"lr": 1e-4})
    assert c.lr == 1e-4 and c.train_batch_size == PRESETS["CartPole-v1"]["train_batch_size"]
    # a preset never silently changes an RLlib default it does not name
    assert c.kl_target == PPOConfig().kl_target


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        PPOConfig().lr = 1.0  # type: ignore[misc]
