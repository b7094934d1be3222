"""The benchmark script runs end to end (scaled down) and prints its tables.

Timings are not asserted: this only guards against the benchmark rotting.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "turns.py"


def test_quick_sqlite_run_prints_the_ratio_table(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--backend", "sqlite", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if line.startswith("backend") and "ratio" in line)
    assert "histstore us" in header
    assert "raw us" in header
    assert any(line.startswith("sqlite") and "sequential" in line for line in lines)
    assert any(line.startswith("sqlite") and "16 tasks" in line for line in lines)
    assert any("ratio 5,000/100" in line for line in lines)
    assert not any(line.startswith("postgres") for line in lines)
    assert list(json.loads(out.read_text())["results"]) == ["sqlite"]
