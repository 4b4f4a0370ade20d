"""The step's rollouts: every ``RolloutStage`` (single-turn, T-PPO's windows, conversations, the asynchronous
producer) and what they score and report with."""
