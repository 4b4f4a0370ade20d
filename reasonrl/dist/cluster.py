"""The Ray cluster: joining it (or starting a local one), placing workers on it, and waiting for them.

Ray is imported inside the functions, so importing this module never loads it.  Every wait on a
worker is bounded: a worker that dies, or stops answering within its timeout, raises
``WorkerDiedError`` naming it; a placement the cluster cannot satisfy raises ``ClusterError``
naming the missing resources.  Never a hang.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from reasonrl.config import ConfigError
from reasonrl.dist.cluster_errors import ClusterError, WorkerDiedError

log = logging.getLogger(__name__)

LOCAL_OBJECT_STORE_BYTES = 1 << 30
"""Object store of a local cluster: room for a small model's weights (SmolLM2-135M: 0.5 GB in fp32);
Ray spills larger objects to disk."""

_started_here = False  # whether start_ray connected this process (stop_ray undoes only that)


def import_ray() -> Any:
    """The ``ray`` module; a ConfigError naming the install command when Ray is not installed."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "dist.backend=ray needs Ray, which is not installed: pip install 'reasonrl[ray]', or use another "
            "dist.backend"
        ) from None
    return ray


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a ``host:port`` or ``ray://host:port`` address; None for ``auto`` and other forms."""
    address = address.removeprefix("ray://")
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)  # IPv6 addresses come bracketed


def _check_reachable(address: str, timeout_s: float) -> None:
    """Fail fast on an address nobody listens on: ray.init itself retries for minutes."""
    target = _host_port(address)
    if target is None:
        return
    try:
        socket.create_connection(target, timeout=timeout_s).close()
    except OSError as exc:
        raise ClusterError(
            f"cannot reach the Ray cluster at {address} ({exc}); start its head there with "
            "`ray start --head --port=PORT`, fix the address (RAY_ADDRESS), or unset RAY_ADDRESS to run a local cluster"
        ) from None


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    """Silence a logger's notices (below ERROR) for the duration."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def start_ray(
    address: str | None = None,
    num_cpus: int | None = None,
    *,
    num_gpus: int | None = None,
    object_store_memory: int = LOCAL_OBJECT_STORE_BYTES,
    connect_timeout_s: float = 10.0,
) -> None:
    """Join the Ray cluster at ``address`` (else ``$RAY_ADDRESS``), or start a local one for this process.

    ``address``: ``host:port`` of a head started with ``ray start --head``, ``ray://host:port`` (Ray
    Client) or ``auto`` (the latest ``ray start`` cluster on this machine).  With neither an address
    nor ``RAY_ADDRESS``, a new local cluster starts (no dashboard, ``num_cpus`` / ``num_gpus`` CPUs and
    GPUs, None = all of this machine's, an object store of ``object_store_memory`` bytes); it never
    attaches to a cluster it was not asked for.  Does nothing when this process is already connected.

    Raises ClusterError when the address does not answer within ``connect_timeout_s`` seconds.
    """
    global _started_here
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    quiet = {"logging_level": logging.WARNING, "log_to_driver": True}
    if address is None:
        # ray 2.60 turns token authentication on for a new local cluster and says so at WARNING level
        with _quiet("ray._private.authentication"):
            ray.init(
                address="local",
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                include_dashboard=False,
                object_store_memory=object_store_memory,
                **quiet,
            )
    else:
        _check_reachable(address, connect_timeout_s)
        try:
            ray.init(address=address, **quiet)
        except (ConnectionError, ray.exceptions.AuthenticationError) as exc:
            raise ClusterError(
                f"cannot join the Ray cluster at {address}: {exc}; if its head was started with token "
                "authentication, set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN to its token (`ray get-auth-token` there)"
            ) from None
    _started_here = True


def stop_ray() -> None:
    """Leave the cluster start_ray joined, or stop the local one it started; a no-op otherwise."""
    global _started_here
    if not _started_here:
        return
    import ray

    ray.shutdown()
    _started_here = False


# --- placement -----------------------------------------------------------------------------------


def _resources(gpus: float, cpus: float) -> dict[str, float]:
    return {name: amount for name, amount in (("GPU", gpus), ("CPU", cpus)) if amount > 0}


def _describe(resources: dict[str, float]) -> str:
    return ", ".join(f"{name} {amount:g}" for name, amount in resources.items()) or "nothing"


class Placement:
    """Where a group of ``count`` workers runs.

    Workers that need resources (``gpus`` and/or ``cpus`` > 0 each, fractions allowed) get one
    bundle each of a placement group ``{"GPU": gpus, "CPU": cpus}``, packed on as few nodes as
    possible (strategy PACK).  The group is reserved before any worker starts, and a cluster that
    cannot hold it within ``timeout_s`` seconds raises ClusterError naming what is missing (Ray
    would keep the workers pending forever).  Workers that need neither (the default) schedule on
    any node, even a full one.  Ray gives a worker one thread per whole CPU it holds, at least one.
    """

    def __init__(self, role: str, count: int, gpus: float = 0.0, cpus: float = 0.0, timeout_s: float = 300.0) -> None:
        import ray
        from ray.util import placement_group, remove_placement_group

        if count < 1:
            raise ValueError(f"need at least one {role} worker, not {count}")
        if gpus < 0 or cpus < 0:
            raise ValueError(f"{role} workers cannot take negative resources (gpus {gpus}, cpus {cpus})")
        self.role, self.count, self.gpus, self.cpus = role, count, gpus, cpus
        self.group = None
        bundle = _resources(gpus, cpus)
        if bundle:
            group = placement_group([bundle] * count, strategy="PACK", name=f"reasonrl-{role}")
            if not group.wait(timeout_s):
                remove_placement_group(group)
                total, free = ray.cluster_resources(), ray.available_resources()
                have = ", ".join(f"{name} {free.get(name, 0):g} free of {total.get(name, 0):g}" for name in bundle)
                raise ClusterError(
                    f"the cluster cannot place {count} {role} workers of {_describe(bundle)} each within "
                    f"{timeout_s:g} s: it has {have}; add nodes (`ray start --address=HEAD:PORT` on them), "
                    f"or ask for fewer {role} workers or fewer resources per worker"
                )
            self.group = group

    def actor_options(self, index: int) -> dict[str, Any]:
        """``ray.remote(...).options(**this)`` for worker ``index``."""
        options: dict[str, Any] = {"num_cpus": self.cpus, "num_gpus": self.gpus}
        if self.group is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                self.group, placement_group_bundle_index=index
            )
        return options

    def release(self) -> None:
        """Give the reserved resources back (after the workers are gone)."""
        if self.group is not None:
            from ray.util import remove_placement_group

            remove_placement_group(self.group)
            self.group = None


# --- workers -------------------------------------------------------------------------------------


class WorkerHost:
    """Base of the classes that run as Ray actors: says where it runs."""

    def where(self) -> tuple[str, str]:
        """(actor id, node: its IP and the start of its Ray node id)."""
        import ray

        context = ray.get_runtime_context()
        return context.get_actor_id() or "?", f"{ray.util.get_node_ip_address()} ({context.get_node_id()[:8]})"


@dataclass
class Worker:
    """One actor of a group of workers, named as errors name it."""

    actor: Any
    """The ray actor handle."""

    role: str
    index: int
    """0-based position in its group."""

    count: int
    actor_id: str
    node: str = "not placed yet"

    def __str__(self) -> str:
        return f"{self.role} worker {self.index} of {self.count} (actor id {self.actor_id}, node {self.node})"


def start_workers(
    host: type[WorkerHost], arguments: tuple, placement: Placement, timeout_s: float, setup: str | None = None
) -> list[Worker]:
    """``placement.count`` actors running ``host(*arguments)``; then each one's ``setup`` method, in parallel.

    Returns once every worker is placed and set up; a worker that dies or does not finish within
    ``timeout_s`` seconds raises WorkerDiedError, an exception in ``setup`` is raised as it is.
    The workers started are killed on any failure.
    """
    import ray

    remote = ray.remote(host)
    workers = []
    group = uuid.uuid4().hex[:8]
    for index in range(placement.count):
        name = f"reasonrl-{placement.role}-{index}-{group}"  # `ray list actors` shows who is who
        actor = remote.options(name=name, **placement.actor_options(index)).remote(*arguments)
        workers.append(Worker(actor, placement.role, index, placement.count, actor._actor_id.hex()))
    try:
        places = gather([(w, w.actor.where.remote()) for w in workers], timeout_s)
        for worker, (actor_id, node) in zip(workers, places, strict=True):
            worker.actor_id, worker.node = actor_id, node
        if setup is not None:
            gather([(w, getattr(w.actor, setup).remote()) for w in workers], timeout_s)
    except BaseException:
        kill_workers(workers)
        raise
    return workers


def kill_workers(workers: Sequence[Worker]) -> None:
    """Stop the actors now (a dead one is skipped)."""
    import ray

    for worker in workers:
        with contextlib.suppress(Exception):
            ray.kill(worker.actor)


def _reason(exc: BaseException) -> str:
    """The line of a Ray error that says why: its last non-empty line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def gather(calls: Sequence[tuple[Worker, Any]], timeout_s: float) -> list:
    """The results of remote calls (worker, ObjectRef), in order, each waited for at most ``timeout_s`` seconds.

    A worker that died (or whose node did) raises WorkerDiedError as soon as that is known, not
    after the others finish; one that has not answered when the time is up raises it too.  An
    exception raised by the remote method itself is raised here as it is (the worker lives on).
    """
    import ray
    from ray.exceptions import NodeDiedError, ObjectLostError, RayActorError, RayTaskError, WorkerCrashedError

    position = {ref: i for i, (_, ref) in enumerate(calls)}
    results: list = [None] * len(calls)
    pending = [ref for _, ref in calls]
    deadline = time.monotonic() + timeout_s
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            silent = ", ".join(str(calls[position[ref]][0]) for ref in pending)
            raise WorkerDiedError(f"{silent} did not answer within {timeout_s:g} s (the worker timeout)")
        for ref in ready:
            worker = calls[position[ref]][0]
            try:
                results[position[ref]] = ray.get(ref)
            except RayTaskError as exc:  # the method raised: that error, with the remote traceback as its cause
                raise (exc.cause if isinstance(exc.cause, Exception) else exc) from exc
            except (RayActorError, WorkerCrashedError, NodeDiedError, ObjectLostError) as exc:
                raise WorkerDiedError(f"{worker} died: {_reason(exc)}") from exc
    return results
