"""The pure algorithm core: torch functions of tensors and plain scalars, nothing else.

Modules: ``advantage_estimators`` (GAE, EGAE, group/RLOO/REINFORCE++ estimators), ``policy_loss`` (PPO clip,
positive-example NLL), ``aggregate`` (loss aggregation with global denominators), ``value_loss``,
``kl``, ``shaping`` (overlong penalty, group filter, reward placement, potential shaping),
``pag`` (PAG turn rewards), ``off_policy`` (decoupled PPO, truncated and masked importance sampling),
``masked`` (masked reductions), ``presets`` (AlgoSpec + named presets).
"""
