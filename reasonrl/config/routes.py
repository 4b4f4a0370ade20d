"""The hybrid reward router's routing table: which reward source scores each ``task_type``, and the
rules a ``reward.routes`` override must keep (the router itself is ``reasonrl.reward.router``)."""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_ROUTES: dict[str, str] = {
    "math": "math",
    "code": "code",
    "reference": "genrm_reference",
    "open": "genrm_bon",
    "preference": "bt",
    "grounding": "grounding",  # a box, scored by IoU (reasonrl.reward.visual_verifiers)
    "pointing": "pointing",  # a point, scored by point-in-box
    "countdown": "countdown",  # an expression that reaches a target (reasonrl.reward.countdown_verifier)
}
VERIFIER_SOURCES = ("math", "code", "grounding", "pointing", "countdown")
MODEL_SOURCES = ("genrm_reference", "genrm_bon", "bt")
VERIFIABLE_TASKS = VERIFIER_SOURCES


class RoutingError(ValueError):
    """A task type without a route, or a route that would break the routing rules."""


def resolve_routes(overrides: Sequence[str] = ()) -> dict[str, str]:
    """The default table updated with ``task_type=source`` entries; checked against the routing rules."""
    routes = dict(DEFAULT_ROUTES)
    for entry in overrides:
        task_type, _, source = entry.partition("=")
        if not source:
            raise RoutingError(f"reward.routes entry {entry!r} is not 'task_type=source'")
        routes[task_type.strip()] = source.strip()
    for task_type, source in routes.items():
        if source not in VERIFIER_SOURCES + MODEL_SOURCES:
            raise RoutingError(
                f"route {task_type}={source}: unknown source; choose one of {VERIFIER_SOURCES + MODEL_SOURCES}"
            )
        if task_type in VERIFIABLE_TASKS and source not in VERIFIER_SOURCES:
            raise RoutingError(
                f"route {task_type}={source}: a verifiable task must be scored by a verifier, not a judge"
            )
    return routes
