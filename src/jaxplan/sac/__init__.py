"""SAC: RLlib 1.x soft actor-critic for continuous actions (config, loss, policy, plan)."""
