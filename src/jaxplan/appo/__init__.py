"""APPO: RLlib's asynchronous PPO (IMPALA's plan with PPO's clipped surrogate, a target network
and an optional KL loss)."""
