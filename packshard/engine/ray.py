"""``--engine ray``: the same tasks as Ray core tasks, on a local or a remote cluster.

Ray is imported here only, when ``--engine ray`` is chosen (``pip install 'packshard[ray]'``).
Without ``--ray-address`` a private local cluster of ``--workers`` CPUs is started
(``address="local"``: a cluster left running by ``ray start`` is never picked up by accident)
and stopped at the end; with it, the job joins that cluster and leaves it running.

Across nodes nothing passes through the driver but plans and per-example integers: a task
gets the name of its work (an input's byte range, a shard's rows) and reads and writes it
itself, on whichever node runs it, where the caller's paths point (storage every node
reaches)::

    driver (plan only) ── MapTask(unit) ──► node A: read unit, tokenize, spill part ─┐
                       ◄─ lengths, codes ──                                          │ storage
                       ── WriteTask(rows) ─► node B: read parts, write shard ────────┘ all reach

A node that dies mid-job takes its running tasks and the results it held with it: Ray reruns
them on the nodes left (``max_retries``, the same bytes, since every task is idempotent and
its output is named by the plan), or, out of retries, the job stops with one line naming the
task and the node, and nothing is published (``tests/engine/test_ray_nodes.py`` kills a
raylet of a real two-node cluster to check both).

What keeps the usual Ray pitfalls away:

* only tasks, one CPU each, no actors: nothing holds a CPU that a task waits for, so the
  pipeline cannot starve itself;
* at most ``2 × CPUs`` tasks in flight (``ray.wait``), results put back in task order by
  index: completion order never reaches the output;
* every file a task writes is named by the caller from the plan (unit and shard names); Ray
  makes no file names;
* a task failing for good lets the others finish, then stops the job (as the local engine);
* worker crashes are retried by Ray (``max_retries``), other exceptions too
  (``retry_exceptions``); a :class:`~packshard.errors.PackshardError` comes back as a value
  and is never retried;
* the started cluster reports no usage statistics, needs no login token, keeps a small object
  store (results are small arrays) and a short temp folder (socket paths are limited to 107
  bytes);
* a joined cluster is asked first whether every node sees the folders its tasks read and
  write (:meth:`RayEngine.check_reach`: a marker the driver writes, read back by a probe
  pinned to each node): a node that does not stops the job in one line before any work,
  where it would otherwise fail half-way on a missing spill part, or write a shard where
  no other node looks.
"""

from __future__ import annotations

import os
import re
import tempfile
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from packshard.engine.base import TaskFailed, call, describe, raise_error
from packshard.errors import UsageError

OBJECT_STORE_BYTES = 256 * 1024 * 1024
QUIET = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def import_ray() -> Any:
    """Return the ``ray`` module, or stop with the install command."""
    try:
        import ray
    except ImportError:
        raise UsageError(
            "--engine ray needs Ray, which is not installed (pip install 'packshard[ray]')"
        ) from None
    return ray


NODE_ID = re.compile(r"node ID: ([0-9a-f]{8})")
NODE_IP = re.compile(r"Node IP: ([^,\s]+)")


def lost(ray: Any, exc: BaseException) -> str:
    """Say in a few words why a task came back with no result: its node, worker or object.

    Ray's own texts run to several lines of advice; the first line of the job's error names
    the task, the attempts and this.
    """
    text = str(exc)
    if isinstance(exc, ray.exceptions.NodeDiedError):
        ip, node = NODE_IP.search(text), NODE_ID.search(text)
        where = " ".join(m.group(1) for m in (ip, node) if m is not None)
        return f"its node {where} died" if where else "its node died"
    if isinstance(exc, ray.exceptions.ObjectLostError):
        return "its result was lost with the node that held it"
    return "its worker died" if "died" in text else describe(exc)


def sees(path: str, token: str) -> tuple[str, bool]:
    """Return this node's address and whether ``path`` holds ``token`` here (a probe task)."""
    import ray

    try:
        seen = Path(path).read_text(encoding="utf-8") == token
    except OSError:
        seen = False
    return ray.util.get_node_ip_address(), seen


class RayEngine:
    """Tasks on a Ray cluster (see the module docstring)."""

    name = "ray"
    starting = False  # a cluster is up once it is joined or started

    def __init__(
        self, workers: int, address: str | None, max_retries: int, env: dict[str, str]
    ) -> None:
        self._ray = ray = import_ray()
        self.max_retries = max_retries
        self._owned = False
        self._env = dict(env)
        if not ray.is_initialized():
            for key, value in QUIET.items():
                os.environ.setdefault(key, value)
            common: dict[str, Any] = {
                "include_dashboard": False,
                "log_to_driver": False,
                "logging_level": "ERROR",
            }
            if address is None:
                ray.init(
                    address="local",
                    num_cpus=workers,
                    object_store_memory=OBJECT_STORE_BYTES,
                    _temp_dir=os.path.join(tempfile.gettempdir(), "packshard-ray"),
                    **common,
                )
            else:
                ray.init(address=address, **common)
            self._owned = True
        self.workers = max(1, int(ray.cluster_resources().get("CPU", workers)))
        self._task = ray.remote(num_cpus=1, max_retries=max_retries, retry_exceptions=True)(call)
        self.joined = address is not None

    def unreached(self, folder: Path, expect: str | None = None) -> list[str]:
        """Return the nodes (their addresses) that do not see ``folder`` as the driver does.

        The driver writes a marker holding a random token into ``folder``; a probe pinned to
        each live node with CPUs reads it back.  ``expect`` (a control): the token the probes
        look for instead of the one written, so that every node misses it.
        """
        ray = self._ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        token = uuid.uuid4().hex
        marker = folder / f".packshard-reach-{token[:12]}"
        marker.write_text(token, encoding="utf-8")
        try:
            probe = ray.remote(num_cpus=0, max_retries=0)(sees)
            nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0]
            refs = [
                probe.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
                ).remote(str(marker), expect or token)
                for n in nodes
            ]
            found = ray.get(refs)
        finally:
            marker.unlink(missing_ok=True)
        return sorted(address for address, seen in found if not seen)

    def check_reach(self, folders: Sequence[Path]) -> None:
        """Stop in one line unless every node of a joined cluster sees each of ``folders``.

        A cluster this engine started is this machine alone: nothing to ask.
        """
        if not self.joined:
            return
        for folder in folders:
            if blind := self.unreached(folder):
                raise UsageError(
                    f"{folder}: not seen by node{'s' if len(blind) > 1 else ''} "
                    f"{', '.join(blind)} of the Ray cluster, whose tasks read and write their "
                    "work there: put it on storage every node mounts (for an s3:// OUT, TMPDIR "
                    "of the driver), or run with --engine local"
                )

    def run(
        self,
        fn: Callable[[Any], Any],
        args: Sequence[Any],
        keys: Sequence[str],
        on_result: Callable[[int, Any], None] | None = None,
        on_started: Callable[[], None] | None = None,
    ) -> list[Any]:
        """Return ``[fn(a) for a in args]`` in order, at most ``2 × CPUs`` in flight."""
        ray = self._ray
        results: dict[int, Any] = {}
        pending: dict[Any, int] = {}
        failed: dict[int, TaskFailed] = {}  # raised once every other task is done
        fn_ref = ray.put(fn)
        nxt = 0
        try:
            while nxt < len(args) or pending:
                while nxt < len(args) and len(pending) < 2 * self.workers:
                    pending[self._task.remote(fn_ref, args[nxt], self._env)] = nxt
                    nxt += 1
                if on_started is not None:
                    on_started()
                    on_started = None
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    i = pending.pop(ref)
                    try:
                        kind, value = ray.get(ref)
                    except ray.exceptions.RayTaskError as exc:
                        cause = exc.cause if exc.cause is not None else exc
                        failed[i] = TaskFailed(keys[i], self.max_retries + 1, describe(cause))
                        continue
                    except ray.exceptions.RayError as exc:  # its worker or node died each time
                        failed[i] = TaskFailed(keys[i], self.max_retries + 1, lost(ray, exc))
                        continue
                    if kind == "error":
                        raise_error(value)
                    results[i] = value
                    if on_result is not None:
                        on_result(i, value)
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        if failed:
            raise failed[min(failed)]
        return [results[i] for i in range(len(args))]

    def close(self) -> None:
        """Stop the cluster this engine started; leave a joined one running."""
        if self._owned:
            self._ray.shutdown()
            self._owned = False
