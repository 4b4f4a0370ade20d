"""Reward functions (verifiers) and the process pool that runs them with timeouts."""
