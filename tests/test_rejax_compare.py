"""benchmarks/rejax_compare.py without rejax (CI never installs it): the jaxplan side of the
DQN mapping is the work rejax's side does, and the summary's ratios and table."""

import sys
import types
from pathlib import Path

import jax
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
compare = pytest.importorskip("rejax_compare")

from jaxplan.dqn.config import DQNConfig, calculate_rr_weights  # noqa: E402


def test_dqn_mapping_is_the_same_work():
    config = DQNConfig().updated(compare.DQN_JAXPLAN)
    rejax = compare.DQN_REJAX
    assert config.round_env_steps == rejax["num_envs"]  # one step of each env per round
    assert calculate_rr_weights(config) == [1, rejax["num_epochs"]]  # updates per round
    assert config.train_batch_size == rejax["batch_size"]
    assert config.buffer_size == rejax["buffer_size"]
    assert config.learning_starts == rejax["fill_buffer"]
    assert config.target_network_update_freq == rejax["target_update_freq"]
    assert rejax["polyak"] == 0.0  # rejax's target update is then a copy, as jaxplan's
    assert config.lr == rejax["learning_rate"] and config.gamma == rejax["gamma"]
    assert config.double_q == rejax["ddqn"] and config.n_step == 1
    assert config.td_error_loss_fn == "mse" and not config.dueling
    eps = config.exploration_config
    assert (eps.initial_epsilon, eps.final_epsilon) == (rejax["eps_start"], rejax["eps_end"])
    for steps in (30_000, 100_000):  # rejax decays over a fraction of its run
        assert compare.dqn_rejax(steps)["exploration_fraction"] * steps == eps.epsilon_timesteps
    # rejax's QNetwork: Dense(64) - relu - Dense(64) - relu - Dense(2) on CartPole's 4 inputs
    plan = compare.jaxplan_plan("dqn", "CartPole-v1", compare.DQN_JAXPLAN, 100_000)[0]
    q = plan.init(jax.random.PRNGKey(0)).policies["default_policy"].params["q"]
    sizes = [x.size for x in jax.tree.leaves(q)]
    assert sum(sizes) == (4 * 64 + 64) + (64 * 64 + 64) + (64 * 2 + 2)


def test_summary_ratio_per_round_and_markdown():
    def row(lib, rnd, sps, r):
        return {
            "case": "dqn",
            "env": "CartPole-v1",
            "library": lib,
            "round": rnd,
            "compile_s": 3.0 if lib == "jaxplan" else 4.0,
            "run_s": 100.0 / sps,
            "env_steps": 100,
            "steps_per_s": sps,
            "final_R": r,
        }

    records = [
        row("jaxplan", 0, 30.0, 100.0),
        row("rejax", 0, 10.0, 50.0),
        row("jaxplan", 1, 20.0, 200.0),
        row("rejax", 1, 10.0, 70.0),
    ]
    (s,) = compare.summarize(records)
    assert s["jaxplan_steps_per_s"] == 25.0 and s["rejax_steps_per_s"] == 10.0
    assert s["ratio"] == 2.5 and s["per_round"] == "3.00 2.00"
    assert s["jaxplan_final_R"] == 150.0 and s["rejax_final_R"] == 60.0
    table = compare.markdown_table([s], [("algorithm", "case", ""), ("ratio", "ratio", ".2f")])
    assert table.splitlines() == ["| algorithm | ratio |", "|---|---|", "| dqn | 2.50 |"]


def test_sac_is_skipped_with_a_line_until_jaxplan_has_it(monkeypatch, capsys):
    monkeypatch.setattr(compare, "MODULES", {k: v for k, v in compare.MODULES.items()})
    compare.MODULES.pop("sac", None)
    args = types.SimpleNamespace(algorithms=["sac"], sac_steps=1000)
    assert compare.build_cases(args) == []
    assert "sac: skipped" in capsys.readouterr().out
