"""The step's update: log-probs, advantages, the policy and critic losses, offline batches."""
