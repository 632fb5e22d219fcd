"""The Jumanji adapter (`make_env("jumanji:...")`, the `jumanji` extra): flattened observations
against Jumanji's own, multi-discrete actions, auto-reset with the final observation, time
limit vs termination, errors, and PPO beating a random policy on Snake."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxplan
from jaxplan import RandomPolicy, WorkerSet, cli, run_iterations, sample_only_plan
from jaxplan.envs import Discrete, check_env
from jaxplan.multi_agent import make_env


def _jumanji():
    return pytest.importorskip("jumanji")


def _flat(observation) -> np.ndarray:
    """Jumanji's observation flattened field by field (numpy, the reference)."""
    return np.concatenate([np.asarray(x, np.float32).ravel() for x in jax.tree.leaves(observation)])


def test_snake_observations_are_jumanjis_fields_flattened():
    jumanji = _jumanji()
    env = make_env("jumanji:Snake-v1")
    check_env(env, env.name)
    fields = (("grid", (12, 12, 5)), ("step_count", ()), ("action_mask", (4,)))
    assert env.observation_fields == fields
    assert env.observation_shape == (12 * 12 * 5 + 1 + 4,)
    assert env.action_space == Discrete(4) and env.max_episode_steps == 4000
    ref_env = jumanji.make("Snake-v1")
    key = jax.random.PRNGKey(1)
    obs, state = jax.jit(env.reset)(key)
    ref_state, ref = jax.jit(ref_env.reset)(key)
    assert obs.dtype == jnp.float32
    np.testing.assert_array_equal(obs, _flat(ref.observation))
    action = int(np.flatnonzero(np.asarray(ref.observation.action_mask))[0])  # a legal move
    out = jax.jit(env.step)(jax.random.PRNGKey(2), state, jnp.int32(action))
    obs, state, reward, terminated, truncated, final_obs = out
    ref_state, ref = jax.jit(ref_env.step)(ref_state, action)
    assert [x.dtype for x in (reward, terminated, truncated)] == [jnp.float32, bool, bool]
    np.testing.assert_array_equal(obs, _flat(ref.observation))
    np.testing.assert_array_equal(final_obs, obs)
    assert float(reward) == float(ref.reward) and not terminated and not truncated


def _legal(obs) -> jax.Array:
    """The first legal Snake move in a flattened observation (its last 4 entries, the mask)."""
    return jnp.argmax(obs[-4:] > 0).astype(jnp.int32)


def test_time_limit_is_truncated_and_the_env_resets_with_the_final_obs():
    """Snake with time_limit=5 and legal moves: Jumanji ends the 5th step as a termination
    (discount 0), the adapter reports it truncated (the step counter is at the limit); obs is
    the next episode's first (reset with that step's key), final_obs what the step reached."""
    jumanji = _jumanji()
    env = make_env("jumanji:Snake-v1", {"time_limit": 5})
    ref_env = jumanji.make("Snake-v1", time_limit=5)
    ref_reset, ref_step = jax.jit(ref_env.reset), jax.jit(ref_env.step)
    step = jax.jit(env.step)
    obs, state = env.reset(jax.random.PRNGKey(0))
    ref_state, _ = ref_reset(jax.random.PRNGKey(0))
    ends = []
    for t in range(1, 11):
        key = jax.random.PRNGKey(50 + t)
        action = _legal(obs)
        obs, state, _, terminated, truncated, final_obs = step(key, state, action)
        ref_state, ref = ref_step(ref_state, action)
        assert not terminated
        np.testing.assert_array_equal(final_obs, _flat(ref.observation))
        if truncated:
            ends.append(t)
            assert bool(ref.last()) and float(ref.discount) == 0.0  # Jumanji: "termination"
            np.testing.assert_array_equal(obs, env.reset(key)[0])
            assert final_obs[-5] == 5 and obs[-5] == 0  # the step counters
            ref_state, _ = ref_reset(key)
        else:
            assert not bool(ref.last())
            np.testing.assert_array_equal(obs, final_obs)
    assert ends == [5, 10]


def test_leaving_the_grid_is_terminated_and_a_discount_one_end_is_truncated():
    """Moving up until the snake leaves the grid: terminated (discount 0, before the time
    limit). An env whose LAST step has discount 1 (Jumanji's `truncation`, here Snake's ends
    rewritten so) is truncated."""
    _jumanji()
    env = make_env("jumanji:Snake-v1")
    step = jax.jit(env.step)
    obs, state = env.reset(jax.random.PRNGKey(0))
    row = int(state.head_position.row)
    for t in range(row + 1):  # up: row - 1 each step; off the grid at the (row + 1)th
        obs, state, _, terminated, truncated, _ = step(jax.random.PRNGKey(t), state, jnp.int32(0))
        assert bool(terminated) == (t == row) and not truncated

    class DiscountOne:  # Snake, with every end a Jumanji truncation (discount 1)
        def __init__(self, inner):
            self.inner = inner

        def reset(self, key):
            return self.inner.reset(key)

        def step(self, state, action):
            state, ts = self.inner.step(state, action)
            return state, ts.replace(discount=jnp.ones_like(ts.discount))

    env._env = DiscountOne(env._env)
    step = jax.jit(env.step)
    obs, state = env.reset(jax.random.PRNGKey(0))
    for t in range(row + 1):
        obs, state, _, terminated, truncated, _ = step(jax.random.PRNGKey(t), state, jnp.int32(0))
        assert bool(truncated) == (t == row) and not terminated


def test_minesweeper_multi_discrete_actions_are_one_discrete_index():
    """Minesweeper's [row, col] action is Discrete(100), index 10 * row + col: stepping index
    37 reveals cell (3, 7) (unrevealed cells are -1 on the board)."""
    jumanji = _jumanji()
    env = make_env("jumanji:Minesweeper-v0")
    assert env.action_space == Discrete(100) and env.max_episode_steps is None
    assert env.observation_shape == (100 + 100 + 1 + 1,)
    _, state = env.reset(jax.random.PRNGKey(0))
    assert (np.asarray(state.board) == -1).all()
    _, stepped, *_ = jax.jit(env.step)(jax.random.PRNGKey(1), state, jnp.int32(37))
    ref_env = jumanji.make("Minesweeper-v0")
    ref_state, _ = ref_env.reset(jax.random.PRNGKey(0))
    ref_state, ref = ref_env.step(ref_state, jnp.array([3, 7], jnp.int32))
    assert not bool(ref.last())  # no mine there (else the adapter would show the next episode)
    board = np.asarray(stepped.board)
    assert board[3, 7] != -1 and (board == -1).sum() == 99
    np.testing.assert_array_equal(board, np.asarray(ref_state.board))


def test_env_states_round_trip_through_a_checkpoint(tmp_path):
    """Jumanji's states are chex dataclasses flax's msgpack does not know; the adapter
    registers them, so a run's checkpoint (its env states included) saves and restores."""
    _jumanji()
    from jaxplan import checkpoint

    env = make_env("jumanji:Snake-v1")
    _, state = env.reset(jax.random.PRNGKey(0))
    _, state, *_ = jax.jit(env.step)(jax.random.PRNGKey(1), state, jnp.int32(1))
    target = env.reset(jax.random.PRNGKey(7))[1]  # another state of the same structure
    restored = checkpoint.restore(checkpoint.save(tmp_path / "s.msgpack", state), target)
    assert type(restored) is type(state)
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(target.key, state.key)


def test_unknown_names_and_keys_are_errors_naming_the_valid_ones():
    _jumanji()
    with pytest.raises(ValueError, match="Did you mean jumanji:Snake-v1") as e:
        make_env("jumanji:Snake-v2")
    assert "jumanji:Game2048-v1" in str(e.value) and "jumanji:Maze-v0" in str(e.value)
    with pytest.raises(ValueError, match="Did you mean 'num_rows'") as e:
        make_env("jumanji:Snake-v1", {"num_row": 6})
    assert "time_limit" in str(e.value)
    # a reward per agent: multi-agent, not this adapter's
    with pytest.raises(ValueError, match=r"rewards of shape \(2,\) \(one per agent\)"):
        make_env("jumanji:LevelBasedForaging-v0")
    # JobShop's action: a job (or none) per machine, 21^10 combinations, beyond one int32
    with pytest.raises(ValueError, match="16679880978201 combinations"):
        make_env("jumanji:JobShop-v0")


def test_missing_jumanji_is_a_one_line_cli_error(monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "jumanji", None)  # as if the extra were not installed
    assert cli.main(["train", "ppo", "--env", "jumanji:Snake-v1", "--stop-iters", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'jaxplan[jumanji]'" in err


SNAKE_6X6 = {"num_rows": 6, "num_cols": 6}


@pytest.mark.slow
def test_ppo_on_snake_beats_a_random_policy():
    """Snake on a 6 x 6 grid (+1 per fruit; leaving the grid or biting itself ends the
    episode), the jumanji:Snake-v1 preset. Random moves: about 0.2 fruits per episode
    (measured here over >= 1000 episodes). Measured after 150k env steps (seeds 0 and 1
    vmapped): 2.6 and 6.7; asserted: both >= random + 1.5."""
    _jumanji()
    env = make_env("jumanji:Snake-v1", SNAKE_6X6)
    workers = WorkerSet(
        env,
        {"default_policy": RandomPolicy(env.observation_shape, env.action_space)},
        num_workers=4,
        num_envs_per_worker=8,
        rollout_fragment_length=32,
        metrics_smoothing_episodes=1000,
    )
    plan = sample_only_plan(workers, mode="bulk_sync")
    state = jax.jit(plan.init)(jax.random.PRNGKey(0))
    _, results = jax.jit(lambda s: run_iterations(plan, s, 16))(state)
    random = plan.reports(jax.tree.map(lambda x: x[-1:], results))[0]
    assert random["episodes_total"] >= 1000
    assert 0.05 < random["episode_reward_mean"] < 0.5

    config = jaxplan.preset_config("jumanji:Snake-v1", {"env_config": SNAKE_6X6})
    plan = jaxplan.ppo_plan(config)
    assert plan.workers.round_env_steps == 1024
    _, results = jaxplan.train_seeds(plan, [0, 1], 146)  # 149,504 env steps
    last = np.asarray(results["episode_reward_mean"])[:, -1]
    assert (last >= random["episode_reward_mean"] + 1.5).all(), (last, random)
