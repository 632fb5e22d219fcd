import os

# Keep XLA from grabbing every core's thread pool in odd ways on the 2-core CI machines, and make
# tests independent of a user's persistent compilation cache.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

TINY_PPO = {
    "num_workers": 2,
    "num_envs_per_worker": 2,
    "rollout_fragment_length": 16,
    "train_batch_size": 64,
    "sgd_minibatch_size": 16,
    "num_sgd_iter": 2,
    "model": {"fcnet_hiddens": [16, 16]},
}
