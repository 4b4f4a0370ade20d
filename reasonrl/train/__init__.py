"""Training: the log-prob forward, the update step, the rollout stage, checkpoints, metrics, the loop."""
