"""Scale-out on a Ray cluster: rollout engines and reward scorers as Ray workers.

The only package that imports ray, and only inside functions: importing it loads no ray.
"""

from reasonrl.dist.cluster import Placement, start_ray, stop_ray
from reasonrl.dist.engines import EngineSettings, RayRolloutEngines
from reasonrl.dist.cluster_errors import ClusterError, WorkerDiedError
from reasonrl.dist.scoring import RayScorer

__all__ = [
    "ClusterError",
    "EngineSettings",
    "Placement",
    "RayRolloutEngines",
    "RayScorer",
    "WorkerDiedError",
    "start_ray",
    "stop_ray",
]
