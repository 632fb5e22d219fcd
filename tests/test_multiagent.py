"""Multi-agent, multi-policy plans: policy mapping, per-policy batches and states,
SelectExperiences, agent-step counting, RLlib's multi-agent result keys, learning."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxplan import (
    MultiAgentBatch,
    ParallelRollouts,
    PPOConfig,
    PPOPolicy,
    RandomPolicy,
    SelectExperiences,
    WorkerSet,
    execution_plan,
    ppo_plan,
    preset_config,
    run_iterations,
    sample_only_plan,
    train_seeds,
)
from jaxplan.envs import Discrete
from jaxplan.multi_agent import make_env

T = 4  # TagEnv episode length


@dataclasses.dataclass(frozen=True)
class TagEnv:
    """3 agents; agent i observes [i, step in episode] and gets reward `REWARDS[i]` per step;
    episodes last `T` steps (truncated). Every number a test reads is known in advance."""

    agents: tuple = ("a0", "a1", "a2")
    rewards: tuple = (1.0, 2.0, 5.0)
    is_multi_agent: bool = True
    name: str = "Tag"

    @property
    def observation_shapes(self):
        return {a: (2,) for a in self.agents}

    @property
    def action_spaces(self):
        return {a: Discrete(2) for a in self.agents}

    def _obs(self, t):
        return {a: jnp.stack([jnp.float32(i), t]) for i, a in enumerate(self.agents)}

    def reset(self, key):
        return self._obs(jnp.float32(0)), jnp.float32(0)

    def step(self, key, t, actions):
        t = t + 1
        done = t >= T
        final = self._obs(t)
        t_new = jnp.where(done, 0.0, t)
        every = lambda x: {a: x for a in self.agents}  # noqa: E731
        rewards = {a: jnp.float32(r) for a, r in zip(self.agents, self.rewards, strict=True)}
        return self._obs(t_new), t_new, rewards, every(jnp.bool_(False)), every(done), final


SMALL = {
    "num_workers": 1,
    "num_envs_per_worker": 2,
    "rollout_fragment_length": 4,
    "train_batch_size": 32,
    "sgd_minibatch_size": 8,
    "num_sgd_iter": 2,
    "lr": 1e-3,
    "model": {"fcnet_hiddens": [8]},
}
MAPPING = {"a0": "p0", "a1": "p0", "a2": "p1"}  # a0 and a1 share p0


def _tag_plan(train=("p0", "p1"), count_steps_by="env_steps", extra=None):
    config = PPOConfig().updated(
        {
            **SMALL,
            **(extra or {}),
            "multiagent": {
                "policies": {"p0": {}, "p1": {"lr": 5e-3}},
                "policy_mapping": MAPPING,
                "policies_to_train": list(train),
                "count_steps_by": "env_steps",
            },
        }
    )
    env = TagEnv()
    policies = {
        pid: PPOPolicy((2,), Discrete(2), config.policy_config(pid)) for pid in ("p0", "p1")
    }
    # the config's check of agent_steps reads the env id, and TagEnv is not a registered env
    config = dataclasses.replace(
        config, multiagent=dataclasses.replace(config.multiagent, count_steps_by=count_steps_by)
    )
    workers = WorkerSet(
        env,
        policies,
        policy_mapping=MAPPING,
        policies_to_train=list(train),
        num_workers=config.num_workers,
        num_envs_per_worker=config.num_envs_per_worker,
        rollout_fragment_length=config.rollout_fragment_length,
    )
    return execution_plan(workers, config)


def _run(plan, iterations, seed=0):
    state = jax.jit(plan.init)(jax.random.PRNGKey(seed))
    state2, results = jax.jit(lambda s: run_iterations(plan, s, iterations))(state)
    return state, state2, plan.reports(results)


# ---- per-policy batches ---------------------------------------------------------------------
def test_agents_sharing_a_policy_fill_its_batch_with_both_agents_rows():
    plan = _tag_plan()
    workers = plan.workers
    assert workers.policy_agents == {"p0": ("a0", "a1"), "p1": ("a2",)}
    flow_state = jax.jit(plan.init)(jax.random.PRNGKey(0))

    _, batch = jax.jit(ParallelRollouts(workers).pull)(flow_state)
    env_steps = 1 * 2 * 4
    assert batch.env_steps == env_steps
    p0, p1 = batch.policy_batches["p0"], batch.policy_batches["p1"]
    assert p0["obs"].shape == (2 * env_steps, 2) and p1["obs"].shape == (env_steps, 2)
    ids, counts = np.unique(np.asarray(p0["obs"][:, 0]), return_counts=True)
    assert ids.tolist() == [0.0, 1.0] and counts.tolist() == [env_steps, env_steps]
    assert set(np.asarray(p1["obs"][:, 0]).tolist()) == {2.0}
    # each row carries its own agent's reward
    np.testing.assert_array_equal(
        np.asarray(p0["rewards"]), np.where(p0["obs"][:, 0] == 0, 1.0, 2.0)
    )
    assert set(np.asarray(p1["rewards"]).tolist()) == {5.0}
    assert batch.agent_steps() == 3 * env_steps


def test_select_experiences_drops_exactly_the_non_trainable_policies():
    rows = lambda n: {"x": jnp.zeros((n, 1))}  # noqa: E731
    batch = MultiAgentBatch({"a": rows(4), "b": rows(6), "c": rows(2)}, env_steps=4)
    out = SelectExperiences(["a", "c"])(batch)
    assert list(out.policy_batches) == ["a", "c"] and out.env_steps == 4
    assert out.agent_steps() == 6


def test_frozen_policy_acts_but_never_changes():
    plan = _tag_plan(train=("p0",))
    state0, state, reports = _run(plan, 3)
    p1_before = jax.tree.leaves(state0.policies["p1"])
    p1_after = jax.tree.leaves(state.policies["p1"])
    for a, b in zip(p1_before, p1_after, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    changed = jax.tree.leaves(
        jax.tree.map(
            lambda a, b: bool(jnp.any(a != b)),
            state0.policies["p0"].params,
            state.policies["p0"].params,
        )
    )
    assert any(changed)
    last = reports[-1]
    assert list(last["info"]["learner"]) == ["p0"]
    assert last["info"]["policy_versions"] == {"p0": 3, "p1": 0}
    # the frozen policy still acted: its agent's returns are reported
    assert last["policy_reward_mean"]["p1"] == 5.0 * T


# ---- counting by env steps or agent steps -------------------------------------------------------
@pytest.mark.parametrize(
    "count_steps_by,train,rounds",
    [
        ("env_steps", ("p0", "p1"), 4),  # 32 / 8 env steps per round
        ("agent_steps", ("p0", "p1"), 2),  # 32 / (8 x 3 agents' rows) -> ceil = 2
        ("agent_steps", ("p0",), 2),  # only p0's rows count: 32 / 16
        ("agent_steps", ("p1",), 4),  # p1 has one agent: 32 / 8
    ],
)
def test_concat_batches_counts_env_or_selected_agent_steps(count_steps_by, train, rounds):
    plan = _tag_plan(train=train, count_steps_by=count_steps_by)
    _, _, reports = _run(plan, 2)
    r = reports[-1]
    assert r["timesteps_this_iter"] == rounds * 8
    assert r["agent_timesteps_total"] == 3 * r["timesteps_total"]
    selected_rows = sum({"p0": 2, "p1": 1}[p] for p in train) * 8 * rounds
    assert r["info"]["num_agent_steps_trained"] == 2 * selected_rows
    assert r["info"]["num_steps_trained"] == 2 * rounds * 8


def test_agent_steps_on_a_single_agent_env_is_an_error():
    with pytest.raises(ValueError, match="agent_steps.*'CartPole-v1' is single-agent"):
        PPOConfig().updated({"multiagent": {"count_steps_by": "agent_steps"}})
    ok = PPOConfig().updated(
        {"env": "MultiAgentCartPole", "multiagent": {"count_steps_by": "agent_steps"}}
    )
    assert ok.multiagent.count_steps_by == "agent_steps"


# ---- results ------------------------------------------------------------------------------------
def test_multi_agent_result_keys():
    plan = _tag_plan()
    _, _, reports = _run(plan, 2)
    r = reports[-1]
    # every episode: a0 + a1 get (1 + 2) x 4 steps, a2 gets 5 x 4; the team return is the sum
    assert r["policy_reward_mean"] == {"p0": 12.0, "p1": 20.0}
    assert r["policy_reward_min"] == {"p0": 12.0, "p1": 20.0}
    assert r["policy_reward_max"] == {"p0": 12.0, "p1": 20.0}
    assert r["episode_reward_mean"] == 32.0 and r["episode_len_mean"] == T
    assert r["agent_timesteps_total"] == 3 * r["timesteps_total"]
    for pid in ("p0", "p1"):
        stats = r["info"]["learner"][pid]["learner_stats"]
        assert {"policy_loss", "vf_loss", "kl", "entropy", "cur_lr"} <= set(stats)
    # per-policy overrides reach the policy: p1 was configured with lr 5e-3
    assert r["info"]["learner"]["p0"]["learner_stats"]["cur_lr"] == pytest.approx(1e-3)
    assert r["info"]["learner"]["p1"]["learner_stats"]["cur_lr"] == pytest.approx(5e-3)


def test_policy_mapping_errors():
    env, pol = TagEnv(), PPOPolicy((2,), Discrete(2), PPOConfig())
    with pytest.raises(ValueError, match="need a policy_mapping"):
        WorkerSet(env, {"p0": pol, "p1": pol})
    with pytest.raises(ValueError, match=r"missing \['a2'\]"):
        WorkerSet(env, {"p0": pol}, policy_mapping={"a0": "p0", "a1": "p0"})
    with pytest.raises(ValueError, match="not a policy id"):
        WorkerSet(env, {"p0": pol}, policy_mapping={"a0": "p0", "a1": "p0", "a2": "px"})
    with pytest.raises(ValueError, match=r"'p1'\] have no agent"):
        WorkerSet(env, {"p0": pol, "p1": pol}, policy_mapping={a: "p0" for a in env.agents})
    with pytest.raises(ValueError, match="cannot differ per policy"):
        PPOConfig().updated({"multiagent": {"policies": {"p0": {"num_workers": 2}}}})
    # the config leaves policy ids to the WorkerSet (and the mapping to resolve_policy_mapping)
    ma = {"policies": {"p0": {}}, "policies_to_train": ["p9"]}
    with pytest.raises(ValueError, match=r"policies_to_train \['p9'\] not in policies"):
        ppo_plan(PPOConfig().updated({"multiagent": ma}))
    ma = {"policies": {"p0": {}, "p1": {}}}
    with pytest.raises(ValueError, match="need a policy_mapping"):
        ppo_plan(PPOConfig().updated({"multiagent": ma}))


# ---- async and multi-agent ----------------------------------------------------------------------
def test_async_multi_agent_has_lag_per_policy():
    plan = _tag_plan(
        extra={
            "num_workers": 2,
            "rollout_mode": "async",
            "train_batch_size": 8 * 2,
            "rollout_fragment_length": 8,
        },
    )
    _, _, reports = _run(plan, 6)
    for pid in ("p0", "p1"):
        lags = [r["info"]["learner"][pid]["policy_lag_max"] for r in reports]
        assert lags == [0, 1, 1, 1, 1, 1], (pid, lags)  # 2 groups: 1 train step behind
    assert reports[-1]["policy_reward_mean"] == {"p0": 12.0, "p1": 20.0}


# ---- learning -----------------------------------------------------------------------------------
def test_independent_ppo_learns_multi_agent_cartpole():
    """Two agents, two policies (each its own params, optimizer and kl_coeff). Random actions
    give a team return of about 2 x 14 (the episode ends when either pole falls); measured
    ~800 of 1000 after 51k env steps. Asserted: >= 300 within 60k env steps."""
    config = preset_config(
        "MultiAgentCartPole",
        {
            "multiagent": {
                "policies": {"p0": {}, "p1": {}},
                "policy_mapping": {"agent_0": "p0", "agent_1": "p1"},
            }
        },
    )
    plan = ppo_plan(config)
    _, _, reports = _run(plan, 118)  # 118 x 512 = 60,416 env steps
    r = reports[-1]
    assert r["episode_reward_mean"] >= 300, r["episode_reward_mean"]
    assert reports[0]["episode_reward_mean"] < 60
    assert set(r["policy_reward_mean"]) == {"p0", "p1"}
    assert r["policy_reward_mean"]["p0"] == pytest.approx(r["episode_reward_mean"] / 2)


def _random_team_return(env, iterations=48):
    workers = WorkerSet(
        env,
        {"random": RandomPolicy(env.observation_shapes["agent_0"], env.action_spaces["agent_0"])},
        num_workers=4,
        num_envs_per_worker=8,
        rollout_fragment_length=32,
        metrics_smoothing_episodes=1000,
    )
    _, _, reports = _run(sample_only_plan(workers, mode="bulk_sync"), iterations)
    return reports[-1]


def test_ippo_on_jaxmarl_mpe_simple_spread_beats_random():
    """JaxMARL MPE simple spread (3 agents, shared reward, 26-step episodes), one shared
    policy (IPPO with parameter sharing), preset config. Random actions: team return about
    -83 (measured over 1000 episodes); measured after 150k env steps: -58, -61, -60 (seeds
    0, 1, 2). Asserted: seeds 0 and 1 >= random + 15."""
    pytest.importorskip("jaxmarl")
    env = make_env("jaxmarl:MPE_simple_spread_v3")
    random = _random_team_return(env)
    assert random["episodes_total"] >= 1000
    plan = ppo_plan(preset_config("jaxmarl:MPE_simple_spread_v3"))
    assert plan.workers.agents == ("agent_0", "agent_1", "agent_2")
    _, results = train_seeds(plan, [0, 1], 148)  # 148 x 1024 = 151,552 env steps
    for seed in range(2):
        last = plan.reports(jax.tree.map(lambda x, s=seed: x[s, -1:], results))[0]
        assert last["agent_timesteps_total"] == 3 * last["timesteps_total"]
        assert last["episode_reward_mean"] >= random["episode_reward_mean"] + 15, (
            seed,
            last["episode_reward_mean"],
            random["episode_reward_mean"],
        )


def test_jaxmarl_adapter_marks_the_time_limit_as_truncation():
    pytest.importorskip("jaxmarl")
    env = make_env("jaxmarl:MPE_simple_spread_v3")
    obs, state = env.reset(jax.random.PRNGKey(0))
    assert {a: o.shape for a, o in obs.items()} == {a: (18,) for a in env.agents}
    step = jax.jit(env.step)
    actions = {a: jnp.int32(0) for a in env.agents}
    ends = []
    for t in range(60):
        obs, state, rewards, term, trunc, final = step(jax.random.PRNGKey(t), state, actions)
        assert not any(bool(v) for v in term.values())
        if bool(trunc["agent_0"]):
            ends.append(t)
            # the episode reset: new obs differ from the final observation kept for GAE
            assert not np.allclose(np.asarray(obs["agent_0"]), np.asarray(final["agent_0"]))
        else:
            np.testing.assert_array_equal(np.asarray(obs["agent_0"]), np.asarray(final["agent_0"]))
    assert len(ends) == 2 and ends[1] - ends[0] == ends[0] + 1  # fixed-length episodes


def test_missing_jaxmarl_is_a_one_line_cli_error(monkeypatch, capsys):
    import sys

    from jaxplan.cli import main

    monkeypatch.setitem(sys.modules, "jaxmarl", None)  # as if the extra were not installed
    assert main(["train", "ppo", "--env", "jaxmarl:MPE_simple_spread_v3", "--stop-iters", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'jaxplan[jaxmarl]'" in err
