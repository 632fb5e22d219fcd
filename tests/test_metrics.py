"""warn_about_bad_reward_scales and the host side of reporting."""

import dataclasses
import warnings

import numpy as np
import pytest

import jaxplan
from jaxplan import PPOConfig, warn_about_bad_reward_scales
from jaxplan.counters import Counter


def _result(reward_mean, vf_loss=1.0, policy_loss=0.1):
    stats = {"vf_loss": vf_loss, "policy_loss": policy_loss}
    return {
        "episode_reward_mean": reward_mean,
        "info": {"learner": {"default_policy": {"learner_stats": stats}}},
    }


@pytest.mark.parametrize(
    "reward, warns",
    [(2005.0, False), (2006.0, True), (-3000.0, True), (float("nan"), False), (50.0, False)],
)
def test_reward_scale_rule(reward, warns):
    config = PPOConfig()  # vf_clip_param 10: warn when round(|R| / 10) > 200
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = warn_about_bad_reward_scales(config, _result(reward))
    assert out["episode_reward_mean"] is reward or np.isnan(reward)
    assert any("vf_clip_param" in str(w.message) for w in caught) == warns


def test_vf_loss_rule_only_with_shared_layers():
    shared = PPOConfig.from_dict({"model": {"vf_share_layers": True}, "vf_loss_coeff": 0.5})
    separate = dataclasses.replace(shared, model=PPOConfig().model)
    for config, vf_loss, warns in [
        (shared, 201.0, True),
        (shared, 199.0, False),
        (separate, 1e6, False),
    ]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warn_about_bad_reward_scales(config, _result(1.0, vf_loss=vf_loss))
        assert any("value function loss" in str(w.message) for w in caught) == warns


def test_report_converts_to_python_and_runs_host_hooks():
    plan = jaxplan.ppo_plan({"vf_clip_param": 1.0}, env="CartPole-v1")
    assert len(plan.hooks) == 1  # warn_about_bad_reward_scales
    big = Counter(lo=np.uint32(5), hi=np.uint32(1))
    device_result = {
        "episode_reward_mean": np.float32(500.0),
        "timesteps_total": big,
        "training_iteration": np.int32(3),
        "info": {"learner": {}},
    }
    with pytest.warns(UserWarning, match="vf_clip_param"):
        out = plan.report(device_result)
    assert out["timesteps_total"] == 2**32 + 5 and isinstance(out["timesteps_total"], int)
    assert out["training_iteration"] == 3 and isinstance(out["episode_reward_mean"], float)
