"""The benchmark script runs end to end (scaled down) and prints its tables.

Timings are not asserted: this only guards against the benchmark rotting.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO

BENCH = REPO / "bench" / "turns.py"


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


def run_quick(
    script: str, tmp_path: Path, pg_url: str | None = None
) -> tuple[list[str], dict[str, Any]]:
    """Run ``bench/<script> --quick --backend sqlite`` (``postgres`` on ``pg_url``); its
    stdout lines and JSON document."""
    out = tmp_path / "results.json"
    backend = ["sqlite"] if pg_url is None else ["postgres", "--pg-url", pg_url]
    args = ["--quick", "--backend", *backend, "--sqlite-dir", str(tmp_path), "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, str(BENCH.parent / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout.splitlines(), json.loads(out.read_text())


def test_quick_processes_run_compares_layouts_and_stores_every_turn(tmp_path: Path) -> None:
    lines, doc = run_quick("processes.py", tmp_path)
    assert any(line.startswith("sqlite") and "1 process x 32 tasks" in line for line in lines)
    assert any(line.startswith("sqlite") and "4 processes x 8 tasks" in line for line in lines)
    assert any(line.startswith("sqlite") and "4x8 vs 1x32" in line for line in lines)
    assert not any(line.startswith("postgres") for line in lines)
    layouts = doc["results"]["sqlite"]["layouts"]
    assert [(r["processes"], r["tasks"]) for r in layouts] == [(1, 32), (4, 8)]
    for r in layouts:
        assert r["errors"] == {}
        assert r["turns"] == 32 * 5
        assert r["stored_ok"] is True


def test_quick_service_run_serves_both_variants_without_failures(tmp_path: Path) -> None:
    lines, doc = run_quick("service.py", tmp_path)
    assert any(line.startswith("sqlite") and "with_history" in line for line in lines)
    assert any(line.startswith("sqlite") and "serialize=True" in line for line in lines)
    assert not any(line.startswith("postgres") for line in lines)
    variants = doc["results"]["sqlite"]["variants"]
    assert [v["variant"] for v in variants] == ["with_history", "serialize=True"]
    for v in variants:
        assert v["failures"] == {}
        assert v["answered"] == v["requests"]
        assert v["stored_ok"] is True


def test_quick_search_run_times_both_stores_and_the_semantic_index(tmp_path: Path) -> None:
    lines, doc = run_quick("search.py", tmp_path)
    assert any(line.startswith("sqlite") and "rare word (5 hits)" in line for line in lines)
    assert any(line.startswith("sqlite") and "index maintained" in line for line in lines)
    assert any(line.startswith("sqlite") and "common word" in line for line in lines)
    assert any(line.startswith("sqlite: loaded 3,000 messages") for line in lines)
    assert any(line.startswith("sqlite") and "300 x 384" in line for line in lines)
    assert not any(line.startswith("postgres") for line in lines)
    result = doc["results"]["sqlite"]
    text = result["text"]
    assert (text["small"]["messages"], text["large"]["messages"]) == (1000, 3000)
    for store in (text["small"], text["large"]):
        assert store["rare"]["samples"] >= 5
        assert store["common"]["p50_us"] > 0
    assert result["semantic"]["vectors"] == 300
    assert result["semantic"]["alone_us"] > 0


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_quick_search_turns_run_compares_with_and_without_the_index(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    pg_url = request.getfixturevalue("pg_url") if backend == "postgres" else None
    lines, doc = run_quick("search_turns.py", tmp_path, pg_url)
    assert any(line.startswith(backend) and "sequential" in line for line in lines)
    assert any(line.startswith(backend) and "16 tasks" in line for line in lines)
    assert any(line.startswith(backend) and "bulk + search" in line for line in lines)
    result = doc["results"][backend]
    for scenario in ("1", "16", "bulk"):
        assert result[scenario]["indexed"] > 0
        assert result[scenario]["bare"] > 0


def test_quick_editable_run_times_commit_read_and_edit(tmp_path: Path) -> None:
    lines, doc = run_quick("editable.py", tmp_path)
    rows = [line for line in lines if line.startswith("sqlite ")]
    assert any("+ commit, p50 (300 vs 6,000)" in line for line in rows)
    assert any("read(limit=20), p50 (100 vs edited 5,697)" in line for line in rows)
    assert any("1,000 entries: read() vs edit()" in line for line in rows)
    assert not any(line.startswith("postgres") for line in lines)
    result = doc["results"]["sqlite"]
    commit = result["commit"]
    assert commit["sizes"] == {"small": 300, "large": 6000}
    for name in ("small", "large"):
        assert commit[name]["samples"] == 20
        assert commit[name]["p50_us"] > 0
        assert result["read"][name]["samples"] == 50
    assert result["read"]["entries"] == 6000 - 298 - 5  # the edits of (b)
    assert result["load"]["edit"]["p50_us"] > 0


def test_quick_frameworks_run_compares_both_savers_and_their_storage(tmp_path: Path) -> None:
    lines, doc = run_quick("frameworks.py", tmp_path)
    rows = [line for line in lines if line.startswith("sqlite ")]
    for op in ("aput+aput_writes", "aget_tuple", "alist(limit=10)"):
        assert sum(op in line for line in rows) == 2  # 10 and 100 checkpoints
    assert not any(line.startswith("postgres") for line in lines)
    result = doc["results"]["sqlite"]
    assert set(result["speed"]) == {"chat/10", "chat/100"}
    for by_saver in result["speed"].values():
        assert set(by_saver) == {"histstore", "langgraph"}
        for ops in by_saver.values():
            assert all(ops[op]["mean_us"] > 0 for op in ops)
    stored = result["bytes_per_thread"]
    assert 0 < stored["histstore"] < stored["langgraph"]


def test_quick_langgraph_turns_run_measures_bytes_and_reads(tmp_path: Path) -> None:
    lines, doc = run_quick("langgraph_turns.py", tmp_path)
    result = doc["results"]["sqlite"]
    assert set(result["histstore"]) == {"20", "100", "400"}
    assert set(result["langgraph"]) == {"20", "100", "400"}
    for by_size in result.values():
        assert all(r["bytes_per_turn"] > 0 and r["read_us"] > 0 for r in by_size.values())
    # The saver's storage per turn stays flat while LangGraph's grows with the turns.
    ours, theirs = result["histstore"], result["langgraph"]
    assert ours["400"]["bytes_per_turn"] < 1.3 * ours["20"]["bytes_per_turn"]
    assert theirs["400"]["bytes_per_turn"] > 5 * theirs["20"]["bytes_per_turn"]
    assert any(line.startswith("sqlite: bytes per turn") for line in lines)


def test_quick_sqlite_inserts_run_times_every_shape_beside_raw(tmp_path: Path) -> None:
    lines, doc = run_quick("sqlite_inserts.py", tmp_path)
    assert any(line.startswith("raw program") for line in lines)
    res = doc["results"]["sqlite"]
    # The schema as made has no INSERT trigger on the messages table (a2f6c8e4d0b3).
    assert res["insert_triggers"] == []
    cases = [(r["case"], r["rows_per_statement"]) for r in res["rows"]]
    assert cases == [
        ("raw program", 1),
        ("histstore schema", 1),
        ("with the INSERT triggers", 1),
        ("histstore schema", 8),
        ("with the INSERT triggers", 8),
    ]
    assert all(r["median_us"] > 0 for r in res["rows"])


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_quick_growth_run_times_every_operation_at_two_sizes(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    pg_url = request.getfixturevalue("pg_url") if backend == "postgres" else None
    lines, doc = run_quick("growth.py", tmp_path, pg_url)
    rows = doc["results"][backend]["rows"]
    names = {(r["axis"], r["op"]) for r in rows}
    for expected in [
        ("store", "conversations(metadata 3 keys)"),
        ("store", "scoped: search(word)"),
        ("store", "ADK list_sessions(user=me)"),
        ("store", "cli ls --user me"),
        ("history", "ADK add_memory(one)"),
        ("history", "write + SemanticIndex.update(c)"),
        ("history", "changes(since=rev-5, limit=5)"),
        ("history", "cli show h --last 3"),
        ("history", "LangGraph aget_tuple"),
    ]:
        assert expected in names
    for r in rows:
        assert r["small_us"] > 0
        assert r["big_us"] > 0
        assert r["sizes"][1] == 3 * r["sizes"][0]
    assert any(line.startswith(f"{backend}: ") and "above 2.0x" in line for line in lines)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_quick_session_bytes_run_compares_both_adapters_with_the_frameworks_stores(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    pg_url = request.getfixturevalue("pg_url") if backend == "postgres" else None
    lines, doc = run_quick("session_bytes.py", tmp_path, pg_url)
    comparisons = doc["results"][backend]["comparisons"]
    assert [c["label"] for c in comparisons] == ["OpenAI Agents", "ADK"]
    for c in comparisons:
        assert len(c["sides"]) == 2
        for side in c["sides"].values():
            assert side["bytes_per_turn"] > 0
            assert side["turn_mean_ms"] > 0
    assert sum(line.startswith(backend) for line in lines) == 4


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_quick_scale_run_compares_every_row_with_the_raw_programs(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    pg_url = request.getfixturevalue("pg_url") if backend == "postgres" else None
    lines, doc = run_quick("scale.py", tmp_path, pg_url)
    rows = doc["results"][backend]["rows"]
    for name in ("load", "bytes", "count", "search_rare"):
        assert rows[name]["histstore"] > 0
        assert rows[name]["raw"] > 0
    for name in ("search_conv", "listing", "listing_selective", "purge"):
        assert rows[name]["small"] > 0
        assert rows[name]["big"] > 0
    assert rows["search_rare"]["hits"] == 5
    for case in ("read", "export", "import"):
        for side in ("histstore", "raw"):
            assert rows[case][side]["seconds"] > 0
            assert rows[case][side]["rss_mb"] > 0
    assert rows["read"]["histstore"]["messages"] == rows["read"]["raw"]["messages"] == 2000
    stream = rows["stream"]["histstore"]
    assert "skipped" in stream or stream["messages"] == 2000
    assert any(line.startswith("read() long whole") and backend in line for line in lines)
