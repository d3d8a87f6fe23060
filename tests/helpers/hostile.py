"""Hostile inputs: capped runs, untouched trees, canaries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# --- hostile inputs: capped runs, untouched trees, canaries ------------------------------------

CAPPED_MEMORY = 3 << 30
"""Address space a capped run may use: enough for packshard, far too little for any bomb."""
CLI = "import sys; from packshard.cli.commands import main; sys.argv[0] = 'packshard'; main()"


def run_capped(
    args: list[Any],
    cwd: Path,
    *,
    code: str = CLI,
    memory: int = CAPPED_MEMORY,
    seconds: float = 120,
    file_size: int | None = None,
) -> Any:
    """Run ``python -c code ARGS`` (the CLI by default) in a fresh process, capped.

    The address space is capped with ``RLIMIT_AS`` (a bomb fails with MemoryError instead of
    taking the machine), the run with a timeout (``subprocess.TimeoutExpired`` fails the test
    instead of hanging CI) and, with ``file_size``, every file written (``RLIMIT_FSIZE``: a
    write past it fails as on a full disk).
    """
    import os
    import resource
    import signal
    import subprocess
    import sys

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        if file_size is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))

    env = {**os.environ, "RAYON_NUM_THREADS": "2", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-c", code, *(str(a) for a in args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=seconds,
        preexec_fn=cap,
        check=False,
    )


def tree_state(root: Path) -> dict[str, tuple[str, int, int]]:
    """Every entry below ``root`` (hidden ones too): kind, size and mtime in nanoseconds."""
    import os
    import stat

    state = {}
    for path in sorted(root.rglob("*")):
        info = os.lstat(path)
        kind = "dir" if stat.S_ISDIR(info.st_mode) else "file"
        size = 0 if kind == "dir" else info.st_size
        state[str(path.relative_to(root))] = (kind, size, info.st_mtime_ns)
    return state


def changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Paths added, removed or modified between two :func:`tree_state` snapshots."""
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


class Canary:
    """A file outside OUT that nothing may read: its atime is set far in the past.

    ``read`` tells whether it was read since (file systems mounted ``noatime`` cannot tell:
    :attr:`works` is False there and the check is a no-op).
    """

    def __init__(self, path: Path, text: str = "canary\n") -> None:
        import os

        self.path = path
        path.write_text(text)
        os.utime(path, (0, path.stat().st_mtime))
        probe = path.with_name(path.name + ".probe")
        probe.write_text("probe")
        os.utime(probe, (0, probe.stat().st_mtime))
        probe.read_text()
        self.works = probe.stat().st_atime > 0
        probe.unlink()

    @property
    def read(self) -> bool:
        """True when the canary was read since it was made."""
        return self.works and self.path.stat().st_atime > 0
