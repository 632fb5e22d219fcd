"""PPOConfig: RLlib's defaults, validation errors that name the key, presets, round trips."""

import dataclasses

import pytest

from jaxplan import PPOConfig, preset_config
from jaxplan.ppo.config import PRESETS


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
        ({"lr": None}, "lr", "expected"),
    ],
)
def test_wrong_types_are_errors(overrides, key, expected):
    with pytest.raises(ValueError) as e:
        PPOConfig.from_dict(overrides)
    assert repr(key) in str(e.value) and expected in str(e.value)


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
