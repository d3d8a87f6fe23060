"""The reference log-probability sidecar is checked as a shard is, by ``verify`` and its reader.

Each corruption below is re-hashed into the manifest (the checksum holds, as a forger or a
buggy writer would leave it): a row missing, an ``example_id`` duplicated, the Parquet
metadata stripped, a NaN.  ``verify`` fails on each with a finding naming the file, and
:class:`~packshard.torch.pairs.reference.ReferenceLogps` refuses each by name, so no NaN ever
reaches the DPO loss.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from packshard.errors import FormatError  # noqa: E402
from packshard.torch.pairs.reference import (  # noqa: E402
    REFERENCE_NAME,
    ReferenceLogps,
    write_reference_logps,
)
from packshard.verify.model.forward import build_tiny_model  # noqa: E402
from tests.helpers import add_branch_column, rehash  # noqa: E402
from tests.hostile.test_out_folders import cli  # noqa: E402

pytestmark = pytest.mark.torch
FIX = "(score it again with write_reference_logps)"


@pytest.fixture(scope="module")
def scored(tmp_path_factory, packed_demo) -> Path:
    out = Path(shutil.copytree(packed_demo, tmp_path_factory.mktemp("sidecar") / "out"))
    add_branch_column(out)
    write_reference_logps(out, build_tiny_model(1024, seed=7))
    return out


def _missing(table: pa.Table) -> pa.Table:
    return table.slice(1)


def _duplicated(table: pa.Table) -> pa.Table:
    ids = table["example_id"].to_numpy().copy()
    ids[1] = ids[0]
    return table.set_column(0, "example_id", pa.array(ids, pa.int64()))


def _stripped(table: pa.Table) -> pa.Table:
    return table.replace_schema_metadata(None)


def _nan(table: pa.Table) -> pa.Table:
    logp = table["logp"].to_numpy().copy()
    logp[2] = np.nan
    return table.set_column(1, "logp", pa.array(logp, pa.float64()))


CORRUPTIONS: dict[str, tuple[Any, str]] = {
    "missing-row": (_missing, r"example \d+ has no row: each scored example needs one"),
    "duplicate": (_duplicated, r"example \d+ has more than one row \(one per example\)"),
    "no-metadata": (_stripped, "no packshard.format_version in its Parquet metadata"),
    "nan": (_nan, r"example \d+: logp is nan, not a finite number"),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_a_rehashed_corrupt_sidecar_fails_verify_and_is_refused(scored, tmp_path, kind):
    change, problem = CORRUPTIONS[kind]
    out = Path(shutil.copytree(scored, tmp_path / "out"))
    path = out / REFERENCE_NAME
    table = pq.read_table(path)
    pq.write_table(change(table), path)
    rehash(out, REFERENCE_NAME)
    with pytest.raises(FormatError) as err:
        ReferenceLogps(out)
    assert err.value.path == str(path)
    assert re.fullmatch(f"{problem} {re.escape(FIX)}", err.value.problem), err.value.problem
    result = cli("verify", out, "--model", "none", "--no-source")
    assert result.exit_code == 1, result.output
    line = next(x for x in result.stdout.splitlines() if REFERENCE_NAME in x)
    assert re.search(f"✗ \\[integrity\\] {REFERENCE_NAME}: {problem}", line), line


def test_a_sound_sidecar_passes_verify(scored):
    result = cli("verify", scored, "--model", "none", "--no-source")
    assert result.exit_code == 0, result.output
    assert len(ReferenceLogps(scored)) > 0
