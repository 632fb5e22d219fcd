"""Learning: PPO with the CartPole preset solves gymnax CartPole-v1 (mean return >= 475).

Budget: 150,000 env steps per seed (the preset solves in about 55k-66k steps on seeds 0-3).
"""

import numpy as np

import jaxplan
from jaxplan.counters import counter_value

BUDGET_STEPS = 150_000


def test_ppo_solves_cartpole_for_two_seeds():
    plan = jaxplan.ppo_plan(env="CartPole-v1")
    steps_per_iter = 512  # the preset's train batch
    assert plan.workers.round_env_steps == 512
    iters = BUDGET_STEPS // steps_per_iter
    _, results = jaxplan.train_seeds(
        plan, [0, 1], iters, stop=jaxplan.Stop(episode_reward_mean=475.0)
    )
    done = np.asarray(results["done"])
    reward = np.asarray(results["episode_reward_mean"])
    timesteps = counter_value(results["timesteps_total"])
    for seed in range(2):
        assert done[seed].any(), f"seed {seed} did not reach 475 in {BUDGET_STEPS} steps"
        first = int(np.argmax(done[seed]))
        assert reward[seed, first] >= 475.0
        assert timesteps[seed, first] <= BUDGET_STEPS
        # the state froze once done: later results repeat the stopping one
        assert (timesteps[seed, first:] == timesteps[seed, first]).all()
