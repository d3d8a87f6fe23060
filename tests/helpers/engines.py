"""Work units and engines: inputs for scale tests, output digests, engine tasks."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.records import msg

# --- work units and engines --------------------------------------------------------------------


def scale_inputs(folder: Path) -> list[Path]:
    """Inputs that exercise every kind of unit: a JSONL cut into many byte ranges (with blank
    lines, broken lines, an overlong record and a BOM on its first line), a Parquet file of
    several row groups and a JSON array read whole."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packshard.demo import demo_data_path

    folder.mkdir(parents=True, exist_ok=True)
    demo = [line for line in demo_data_path().read_text(encoding="utf-8").splitlines() if line]
    long = {"messages": [msg("user", "hi " * 300), msg("assistant", "ok " * 300)]}
    lines = [*demo, "", "{broken", json.dumps(long), "", *demo, "[1, 2]", *demo]
    chat = folder / "chat.jsonl"
    chat.write_bytes(b"\xef\xbb\xbf" + "".join(x + "\n" for x in lines).encode())
    values = [json.loads(x) for x in demo if x.startswith("{") and _is_json(x)]
    rows = folder / "rows.parquet"
    table = pa.table({"messages": [v.get("messages") for v in values if "messages" in v]})
    pq.write_table(table, rows, row_group_size=4)
    array = folder / "array.json"
    array.write_text(json.dumps(values[:10]), encoding="utf-8")
    return [chat, rows, array]


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def output_digests(out: Path) -> dict[str, str]:
    """SHA-256 of every file of a packed folder except the manifest (which has a timestamp)."""
    import hashlib

    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.iterdir())
        if p.name != "manifest.json"
    }


def cores_task(_: object) -> int:
    """An engine task returning the cores its worker may use."""
    from packshard.engine import worker_cores

    return worker_cores()


def slow_square(value: int) -> int:
    """An engine task that finishes later the smaller its argument (completion order reversed)."""
    import time

    time.sleep(0.05 * (4 - value))
    return value * value


def flaky_task(arg: tuple[str, int, str]) -> str:
    """An engine task that fails its first ``times`` attempts (``kind``: crash, raise, usage).

    Attempts are counted in files under ``folder``, so the count holds across processes.
    """
    import os

    from packshard.errors import UsageError

    folder, times, kind = arg
    attempt = len(os.listdir(folder))
    Path(folder, f"attempt-{attempt}").touch()
    if attempt < times:
        if kind == "crash":
            os._exit(3)
        if kind == "usage":
            raise UsageError("bad option (use --good)")
        raise OSError(f"flaky disk, attempt {attempt + 1}")
    return f"done after {attempt + 1}"


class StartingEngine:
    """An engine double whose workers are starting for the first ``polls`` questions.

    Each question asked while they start waits a little, as the local engine's does; its
    tasks run in this process, and ``runs`` counts the calls to :meth:`run`.
    """

    name, workers = "local", 2

    def __init__(self, polls: int, wait: float = 0.05) -> None:
        self.polls, self.wait, self.runs = polls, wait, 0

    @property
    def starting(self) -> bool:
        import time

        self.polls -= 1
        if self.polls >= 0:
            time.sleep(self.wait)
        return self.polls >= 0

    def run(self, fn, args, keys, **kwargs):
        self.runs += 1
        return [fn(a) for a in args]
