"""A Ray cluster of separate nodes on this machine, as ``ray start`` makes one on many machines.

Each node is its own ``ray start --block`` process with its own temp folder (sockets, logs,
session) and its own object store; the first is the head (``--head --port``), the others
join it with ``--address``::

    node 0: ray start --head --port P --num-cpus 1 --temp-dir /tmp/psr-…/n…  (GCS, raylet, store)
    node 1: ray start --address 127.0.0.1:P --num-cpus 1 --temp-dir /tmp/psr-…/n…  (raylet, store)

Nothing is shared between the nodes but the GCS address and this machine's files.  Every
process of a node is a descendant of its ``ray start --block`` process, so the cluster is
torn down by those process ids alone (``ray stop`` would stop every Ray process of the
machine, other people's clusters included); a watchdog process ends them too if the process
that started them dies first (a test run killed midway), finding them by their temp folder.
:meth:`RayNodes.kill_raylet` ends one node's raylet as a vanished machine would end it;
``--block`` then ends the rest of that node.
The workers import packshard from this checkout (``PYTHONPATH``), as a deployed cluster
imports it from its installed environment.  Used by ``tests/engine/test_ray_nodes.py`` and
``scripts/bench_cluster.py``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

ROOT = Path(__file__).resolve().parents[1]
STORE_BYTES = 80 << 20  # Ray's smallest object store is about 75 MiB
QUIET = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    # a dead raylet is noticed in ~1.5 s instead of ~15 s (5 health checks 3 s apart)
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_failure_threshold": "3",
}
START_SECONDS = 120.0


def ray_cli() -> str | None:
    """Return the ``ray`` command beside this interpreter (or on PATH); None without one."""
    beside = Path(sys.executable).parent / "ray"
    return str(beside) if beside.is_file() else shutil.which("ray")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RayNodes:
    """Start, watch and tear down nodes of one cluster (see the module docstring)."""

    def __init__(self, cpus: int = 1) -> None:
        cli = ray_cli()
        if cli is None:
            raise RuntimeError("the ray command is not installed")
        self.cli, self.cpus = cli, cpus
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = {**os.environ, **QUIET, "PYTHONPATH": str(ROOT)}
        self.nodes: list[subprocess.Popen[bytes]] = []
        self.temp: list[Path] = []
        self.root = Path(tempfile.mkdtemp(prefix="psr-", dir="/tmp"))  # sockets: ≤ 107 bytes
        # if this process dies before close() (a killed test run), the watchdog ends the nodes
        self.watchdog = subprocess.Popen(
            [sys.executable, __file__, "--watch", str(os.getpid()), str(self.root)],
            env=self.env,
        )
        self.orphans: list[psutil.Process] = []  # a killed raylet's workers, reparented

    def start(self, nodes: int = 2) -> RayNodes:
        """Start the head, then ``nodes - 1`` more; return once every node has joined."""
        try:
            for index in range(nodes):
                self._start_node(index)
            self._wait_for(nodes)
        except BaseException:
            self.close()
            raise
        return self

    def _start_node(self, index: int) -> None:
        temp = Path(tempfile.mkdtemp(prefix="n", dir=self.root))
        self.temp.append(temp)
        cmd = [self.cli, "start", "--num-cpus", str(self.cpus), "--temp-dir", str(temp)]
        cmd += ["--object-store-memory", str(STORE_BYTES), "--disable-usage-stats", "--block"]
        if index == 0:
            cmd += ["--head", "--port", str(self.port), "--include-dashboard", "false"]
        else:
            cmd += ["--address", self.address]
        log = open(temp / "ray-start.log", "wb")  # the node's log
        self.nodes.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT))
        log.close()
        deadline = time.monotonic() + START_SECONDS
        while b"Ray runtime started" not in (temp / "ray-start.log").read_bytes():
            if self.nodes[-1].poll() is not None or time.monotonic() > deadline:
                text = (temp / "ray-start.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"ray node {index} did not start:\n{text}")
            time.sleep(0.2)

    def _wait_for(self, nodes: int) -> None:
        probe = (
            "import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
            "print(sum(n['Alive'] for n in ray.nodes()), int(ray.cluster_resources()['CPU']))"
        )
        deadline = time.monotonic() + START_SECONDS
        while True:
            out = subprocess.run(
                [sys.executable, "-c", probe, self.address],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=START_SECONDS,
            )
            if out.stdout.split() == [str(nodes), str(nodes * self.cpus)]:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster has not {nodes} nodes: {out.stdout}{out.stderr}")
            time.sleep(0.5)

    def processes(self, index: int) -> list[psutil.Process]:
        """Every live process of node ``index`` (its ``ray start`` process's descendants)."""
        import psutil

        try:
            return psutil.Process(self.nodes[index].pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def busy(self, index: int) -> bool:
        """Whether a worker of node ``index`` runs a task now (Ray titles it ``ray::call``)."""
        import psutil

        for proc in self.processes(index):
            try:
                if proc.cmdline()[:1] == ["ray::call"]:
                    return True
            except psutil.Error:
                continue
        return False

    def kill_raylet(self, index: int) -> int:
        """SIGKILL node ``index``'s raylet, as a machine that vanishes would; return its pid."""
        for proc in self.processes(index):
            if proc.name() == "raylet":
                self.orphans += proc.children(recursive=True)
                proc.send_signal(signal.SIGKILL)
                return int(proc.pid)
        raise RuntimeError(f"node {index} has no raylet")

    def restart_node(self, index: int) -> None:
        """End what is left of node ``index`` (not the head) and start it again."""
        assert index > 0, "the head holds the cluster: restart it with a new RayNodes"
        self._end(index)
        shutil.rmtree(self.temp[index], ignore_errors=True)
        nodes, temps = self.nodes, self.temp
        self.nodes, self.temp = nodes[:index], temps[:index]
        self._start_node(index)
        self.nodes += nodes[index + 1 :]
        self.temp += temps[index + 1 :]
        self._wait_for(len(self.nodes))

    def _end(self, index: int) -> None:
        import psutil

        for proc in self.processes(index):
            try:
                proc.kill()
            except psutil.Error:
                continue
        try:  # it reaps its dead processes within a second, then exits
            self.nodes[index].wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.nodes[index].kill()
            self.nodes[index].wait()

    def close(self) -> None:
        """Kill every process of every node, by pid, and remove the temp folders."""
        import psutil

        for index in reversed(range(len(self.nodes))):
            self._end(index)
        for proc in self.orphans:
            try:
                proc.kill()
            except psutil.Error:
                continue
        self.watchdog.kill()
        self.watchdog.wait()
        shutil.rmtree(self.root, ignore_errors=True)
        self.nodes, self.temp, self.orphans = [], [], []

    def __enter__(self) -> RayNodes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def watch(owner: int, root: str) -> None:
    """Wait for process ``owner`` to end; then kill the processes of the nodes under ``root``.

    A node's processes name its temp folder, under ``root``, on their command lines (``ray
    start --temp-dir``, the raylet's and stores' sockets and logs) or descend from one that
    does (the agents and workers retitle themselves ``ray::…``): both are noted every second
    while the owner lives, with their start times, so that a reused pid is never killed.
    """
    import psutil

    seen: dict[int, float] = {}
    while psutil.pid_exists(owner) and psutil.Process(owner).status() != "zombie":
        for proc in psutil.process_iter(["cmdline", "create_time"]):
            if proc.pid != os.getpid() and any(root in a for a in proc.info["cmdline"] or ()):
                try:
                    family = [proc, *proc.children(recursive=True)]
                    seen.update({p.pid: p.create_time() for p in family})
                except psutil.Error:
                    continue
        time.sleep(1.0)
    for pid, started in seen.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == started:
                proc.kill()
        except psutil.Error:
            continue
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--watch"]:  # started by RayNodes
        watch(int(sys.argv[2]), sys.argv[3])
    else:  # a quick look: start two nodes, print the address, tear down
        with RayNodes().start(2) as cluster:
            print(cluster.address, [len(cluster.processes(i)) for i in range(2)])
