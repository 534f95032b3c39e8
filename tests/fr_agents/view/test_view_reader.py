"""The viewer's data side without a browser: read-only access, filters, chunks, nodes, compare,
the server's safety rules, and ``store show`` printing decoded text."""

from __future__ import annotations

import ast
import json
import re
import sqlite3
import urllib.error
import urllib.request
from fnmatch import fnmatch
from pathlib import Path

import numpy as np
import pytest

from fr_agents.cli import main as cli_main
from fr_agents.models import resolve_model
from fr_agents.tree import TrajectoryTree
from fr_agents.view import layout
from fr_agents.view.decode import TokenText
from fr_agents.view.reader import StoreReader

ROOT = Path(__file__).resolve().parents[3]
MODEL = "tiny-nano"


@pytest.fixture(scope="module")
def dec() -> TokenText:
    return TokenText.load(resolve_model(MODEL))


def _root_ids(page: dict) -> list[int]:
    return [r["id"] for r in page["rows"]]


def test_run_layout_names_agree_with_the_trainer() -> None:
    from trainer import checkpoint, metrics, parts

    assert layout.STORE_FILE == parts.STORE_FILE
    assert layout.LEDGER_FILE == parts.LEDGER_FILE
    assert layout.METRICS_FILE == metrics.METRICS_FILE
    assert layout.STATE_FILE == checkpoint.STATE_FILE


def test_root_filters_sorting_and_paging(text_store, dec) -> None:
    path, ids = text_store
    r = StoreReader(path)
    a, b, c = ids["a"], ids["b"], ids["c"]
    assert _root_ids(r.roots(dec)) == [a, b, c]
    assert _root_ids(r.roots(dec, env="me/Other-v0")) == [b]
    assert _root_ids(r.roots(dec, reward_min=0.9)) == [a, b]
    assert _root_ids(r.roots(dec, reward_max=0.3, reward_min=0.1)) == [b]
    assert _root_ids(r.roots(dec, status="truncated")) == [a]
    assert _root_ids(r.roots(dec, version=2)) == [b]
    assert _root_ids(r.roots(dec, version=1)) == [a]
    assert _root_ids(r.roots(dec, pruned="yes")) == [c]
    page = r.roots(dec, pruned="no")
    assert (
        _root_ids(page) == [a, b, c]
        and page["rows"][2]["leaves"] == 1
        and page["rows"][2]["leaves_total"] == 2
    )
    assert _root_ids(r.roots(dec, sort="reward_mean", order="desc")) == [b, c, a]
    assert _root_ids(r.roots(dec, sort="leaves", order="desc")) == [a, b, c]
    two = r.roots(dec, offset=1, limit=1)
    assert two["total"] == 3 and _root_ids(two) == [b]
    row = r.roots(dec)["rows"][0]
    assert row["env"] == "fr_agents/MathVerifier-v0" and row["leaves"] == 3 and row["versions"] == [0, 1]
    assert row["prompt_tail"] == dec.text(TrajectoryTree.open(path).node(a).token_ids)
    for bad, field in (
        ({"status": "done"}, "status"),
        ({"sort": "x"}, "sort"),
        ({"pruned": "maybe"}, "pruned"),
        ({"limit": 0}, "limit"),
    ):
        with pytest.raises(ValueError, match=field):
            r.roots(dec, **bad)


def test_tree_chunks_cover_every_node_once_in_depth_first_order(text_store, dec) -> None:
    path, ids = text_store
    r = StoreReader(path)
    whole = r.tree_page(ids["a"], dec, limit=100)
    chunks = [
        r.tree_page(ids["a"], dec, offset=o, limit=2)["nodes"] for o in range(0, whole["total_nodes"], 2)
    ]
    assert [n["id"] for ch in chunks for n in ch] == [n["id"] for n in whole["nodes"]]
    with TrajectoryTree.open(path) as t:
        want: list[tuple[int, int]] = []
        stack = [(ids["a"], 0)]
        while stack:
            node, depth = stack.pop()
            want.append((node, depth))
            stack.extend((ch, depth + 1) for ch in reversed(t.children(node)))
        leaves = {lf for lf in t.leaf_ids() if t.trajectory(lf).root_id == ids["a"]}
    assert [(n["id"], n["depth"]) for n in whole["nodes"]] == want
    assert whole["total_leaves"] == len(leaves) == 3
    assert whole["nodes"][0]["leaves_below"] == 3
    tool = next(n for n in whole["nodes"] if n["id"] == ids["tool"])
    assert tool["leaf"] == {
        **tool["leaf"],
        "reward": 0.0,
        "partial_score": 0.5,
        "status": "truncated",
        "state": "available",
    }


def test_node_detail_matches_the_store_token_for_token(text_store, dec) -> None:
    path, ids = text_store
    r = StoreReader(path)
    with TrajectoryTree.open(path) as t:
        for name in ("five", "tool", "demo", "hello"):
            node = t.node(ids[name])
            d = r.node(ids[name], dec)
            seg = node.segment
            assert [tk["id"] for tk in d["tokens"]] == node.token_ids
            assert [tk["lp"] for tk in d["tokens"]] == [
                float(x) if m else None for x, m in zip(seg.logprobs, seg.mask, strict=True)
            ]
            assert [tk["v"] for tk in d["tokens"]] == seg.versions.tolist()
            assert "".join(run["text"] for run in d["runs"]) == dec.text(node.token_ids)
            assert d["leaf"]["reward"] == t.trajectory(ids[name]).reward
            assert d["path"] == t.trajectory(ids[name]).path
    assert {tk["kind"] for tk in r.node(ids["demo"], dec)["tokens"]} == {"demo"}
    assert {tk["kind"] for tk in r.node(ids["hello"], dec)["tokens"]} == {"policy"}
    assert r.node(ids["demo"], dec)["info"]["agent"] == "expert"


def test_compare_starts_at_the_split_point(text_store, dec) -> None:
    path, ids = text_store
    r = StoreReader(path)
    with TrajectoryTree.open(path) as t:
        pa, pb = t.trajectory(ids["five"]).path, t.trajectory(ids["six"]).path
        pt = t.trajectory(ids["tool"]).path
    split = [x for x, y in zip(pa, pb, strict=False) if x == y][-1]
    d = r.compare(ids["five"], ids["six"], dec)
    assert d["split"]["id"] == split and split != ids["think"]  # " it is" is shared below "I think"
    assert [s["id"] for s in d["a"]["segments"]] == pa[pa.index(split) + 1 :]
    assert "".join(x["text"] for x in d["a"]["segments"][0]["runs"]).strip() == "5"
    assert "".join(x["text"] for x in d["b"]["segments"][0]["runs"]).strip() == "6"
    d2 = r.compare(ids["five"], ids["tool"], dec)
    assert d2["split"]["id"] == ids["a"] and [s["id"] for s in d2["b"]["segments"]] == pt[1:]
    with pytest.raises(ValueError, match="root"):
        r.compare(ids["five"], ids["hello"], dec)


def test_reader_never_blocks_a_writer(fast_dir: Path) -> None:
    """A writer that refuses to wait (busy timeout 0) appends and finishes while the viewer holds
    a read snapshot open: WAL readers take no lock a writer needs, and the viewer never writes."""
    path = fast_dir / "live.db"
    with TrajectoryTree.open(path) as t:
        t.finish(t.append(t.add_root([1, 2]), [3], [-0.1], True, 0), 1.0)
    reader = StoreReader(path)
    before = reader.version()
    with TrajectoryTree.open(path, busy_timeout_ms=0) as writer, reader.snapshot() as c:
        c.execute("SELECT COUNT(*) FROM nodes").fetchone()
        for k in range(20):
            writer.finish(writer.append(writer.add_root([5, k]), [6], [-0.2], True, 1), 0.5)
        writer.take_batch(4, max_per_root=1)
    assert reader.version() != before and reader.stats()["leaves"] == 21 and reader.stats()["consumed"] == 4
    with (
        pytest.raises(sqlite3.OperationalError, match="readonly|read-only|attempt to write"),
        reader.snapshot() as c,
    ):
        c.execute("DELETE FROM nodes")


def test_sharing_ratio_per_consumed_batch(fast_dir: Path) -> None:
    path = fast_dir / "share.db"
    with TrajectoryTree.open(path) as t:
        r = t.add_root([1, 2, 3, 4])
        for k in range(4):
            t.finish(t.append(r, [9, 9, k], [-0.1, -0.1, -0.1], True, 0), 1.0)
        assert t.take_batch(4, max_per_root=4) is not None
    (row,) = StoreReader(path).sharing_by_batch()
    # 4 paths of 7 tokens; stored: prompt 4 + shared "9 9" 2 + 4 tails = 10
    assert row == {"batch": 1, "leaves": 4, "logical": 28, "stored": 10, "ratio": 2.8}


def test_server_binds_loopback_checks_host_and_ships_its_assets(text_store, serving) -> None:
    from fr_agents.view import make_server

    path, _ = text_store
    s = make_server(path, port=0, model=MODEL)
    try:
        assert s.server_address[0] == "127.0.0.1" and s.loopback
    finally:
        s.server_close()
    with serving(path, MODEL) as url:
        html = urllib.request.urlopen(url).read().decode()
        assert "/static/app.js" in html
        req = urllib.request.Request(url + "api/summary", headers={"Host": "attacker.example:80"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req)
        assert e.value.code == 403
        resp = urllib.request.urlopen(url + "api/summary")
        assert "script-src 'self'" in resp.headers["Content-Security-Policy"]
        assert json.loads(resp.read())["stats"]["leaves"] == 7
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url + "api/roots?status=nope")
        assert e.value.code == 400 and "status" in json.loads(e.value.read())["error"]
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url + "static/..%2f__init__.py")
        assert e.value.code == 404


def declared_package_data() -> dict[str, list[str]]:
    """The ``package_data`` that ``setup.py`` hands to setuptools (read from its source, not run)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    (call,) = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup"]
    (kw,) = [k for k in call.keywords if k.arg == "package_data"]
    return ast.literal_eval(kw.value)


def test_static_assets_are_local_and_packaged() -> None:
    static = ROOT / "fr_agents" / "view" / "static"
    files = sorted(p.name for p in static.iterdir())
    assert files == ["app.js", "index.html", "style.css"]
    for name in files:
        text = (static / name).read_text()
        urls = set(re.findall(r"https?://[^\s\"')]+", text)) - {"http://www.w3.org/2000/svg"}
        assert not urls, f"{name} loads something from outside: {urls}"
    assert "innerHTML" not in (static / "app.js").read_text().replace(
        "Nothing here assigns\n// innerHTML", ""
    )
    data = declared_package_data()
    for name in files:
        assert any(fnmatch(f"static/{name}", pat) for pat in data.get("fr_agents.view", [])), name


def test_store_show_prints_decoded_text_and_ids_on_request(text_store, capsys) -> None:
    path, ids = text_store
    assert cli_main(["store", "show", str(path), "--root", str(ids["a"]), "--model", MODEL]) == 0
    out = capsys.readouterr().out
    assert "What is 2+3?" in out and "Tool says: ok⏎" in out and " 5" in out and "reward=1" in out
    assert cli_main(["store", "show", str(path), "--root", str(ids["a"]), "--ids"]) == 0
    ids_out = capsys.readouterr().out
    with TrajectoryTree.open(path) as t:
        first = " ".join(map(str, t.node(ids["a"]).token_ids[:12]))
    assert first in ids_out and "What is" not in ids_out


def test_large_tree_pages_stay_fast(big_store, dec) -> None:
    import time

    path, root = big_store
    r = StoreReader(path)
    r.tree_page(root, dec, limit=300)  # reads the shape once
    t0 = time.perf_counter()
    page = r.tree_page(root, dec, offset=5000, limit=300)
    assert time.perf_counter() - t0 < 1.0
    assert page["total_leaves"] == 10_000 and len(page["nodes"]) == 300
    assert np.all(np.diff([n["depth"] for n in page["nodes"]]) <= 1)


def test_cli_view_prints_the_url_and_serves(text_store, tmp_path: Path, capsys) -> None:
    import os
    import subprocess
    import sys

    path, _ = text_store
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fr_agents.cli", "view", str(path), "--port", "0", "--model", MODEL],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        lines = [proc.stdout.readline() for _ in range(2)]
        url = re.search(r"http://127\.0\.0\.1:\d+/", "".join(lines)).group(0)
        stats = json.loads(urllib.request.urlopen(url + "api/summary", timeout=30).read())["stats"]
        assert stats["roots"] == 3 and stats["leaves"] == 7
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert cli_main(["view", str(tmp_path / "nowhere.db")]) == 2
    assert "PATH:" in capsys.readouterr().err
    assert cli_main(["view", str(path), "--port", "70000", "--model", MODEL]) == 2
    assert "--port" in capsys.readouterr().err
