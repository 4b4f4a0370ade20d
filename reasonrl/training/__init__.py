"""The RL run: ``loop.fit`` composes the stages that ``setup`` builds, on the ``backend`` that places them.

Sub-packages, bottom to top (``tests/test_layers.py`` holds them to it):

- ``placement``: the data-parallel process group and the CPU threads a run takes;
- ``record``: the run directory, checkpoints, metrics and trackers, the report, Ctrl-C, the run's health;
- ``update``: the step's update: log-probs, advantages, the policy and critic losses, offline batches;
- ``rollouts``: the step's rollouts: single-turn, T-PPO's windows, conversations, the asynchronous producer;
- this package's own modules: ``setup`` (what a run is made of), ``backend`` (one process or FSDP2 ranks), the
  stages composed of the others (``value_pretrain``, ``offline_steps``) and ``loop``.
"""
