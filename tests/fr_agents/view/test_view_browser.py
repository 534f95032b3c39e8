"""``fr-agents view`` in a real headless browser (Debian chromium driven by Playwright).

Each test serves a store or a run with the real server, clicks through the page like a person
and checks what is shown against the store itself. Screenshots are kept under
tests/artifacts/view/.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from fr_agents.tree import TrajectoryTree
from fr_agents.view.layout import CHECKPOINT_DIR

MODEL = "tiny-nano"


def _fmt(x: float) -> str:
    """The page's number format (app.js fmt, 3 decimals for non-integers)."""
    return str(int(x)) if float(x).is_integer() else f"{x:.3f}"


def _hf_decode(tokenizer_dir: Path):
    """An independent decoder (transformers) to check the page's text against."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    return lambda ids: tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _no_problems(page) -> None:
    assert page.problems == [], page.problems
    assert page.evaluate("window.__xss") is None


# ====================================================================== a real training run
def test_run_page_shows_curves_config_and_checkpoints(trained_run: Path, page, serving, screenshot) -> None:
    from playwright.sync_api import expect

    from trainer.metrics import read_metrics

    rows = read_metrics(trained_run)
    steps = [r for r in rows if r["kind"] == "step"]
    evals = [r for r in rows if r["kind"] == "eval"]
    with serving(trained_run) as url:
        page.goto(url + "#run")
        page.wait_for_selector("#chart-reward svg")
        assert page.inner_text("#card-steps .v") == str(len(steps)) == "3"
        assert page.inner_text("#card-reward .v") == _fmt(steps[-1]["reward"])
        # batch reward + held-out success points, acceptance, lag histogram, tokens/s, sharing ratio
        assert int(page.get_attribute("#chart-reward", "data-points")) == len(steps) + len(evals) and evals
        assert int(page.get_attribute("#chart-acceptance", "data-points")) == len(steps)
        assert int(page.get_attribute("#chart-tokens", "data-points")) == len(steps)
        assert int(page.get_attribute("#chart-sharing", "data-points")) == len(steps)
        lag_bars = sum(int(n) for r in steps for n in r["lag_hist"].values())
        assert lag_bars == 3 * 8 and page.locator("#chart-lag rect").count() == len(
            {k for r in steps for k in r["lag_hist"]}
        )
        assert "grpo_group_size: 4" in page.inner_text("#config")
        ckpts = sorted(p.name for p in (trained_run / CHECKPOINT_DIR).glob("step_*"))
        assert page.locator("#checkpoints tbody tr").count() == len(ckpts) >= 2
        assert ckpts[-1] in page.inner_text("#checkpoints")
        screenshot(page, "run_page")
        # live: a step row appended to metrics.jsonl (as the trainer appends it) shows up by polling
        row = {**steps[-1], "step": 4, "reward": 0.5}
        with open(trained_run / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        expect(page.locator("#card-steps .v")).to_have_text("4", timeout=15_000)
        expect(page.locator("#card-reward .v")).to_have_text("0.500")
        _no_problems(page)


def test_tree_page_matches_the_store_and_compares_siblings(
    trained_run: Path, page, serving, screenshot
) -> None:
    store = trained_run / "store.sqlite"
    ckpt = sorted((trained_run / CHECKPOINT_DIR).glob("step_*"))[-1]
    decode = _hf_decode(ckpt)
    with TrajectoryTree.open(store) as t:
        leaves = t.leaf_ids()
        by_root: dict[int, list[int]] = {}
        for lf in leaves:
            by_root.setdefault(t.trajectory(lf).root_id, []).append(lf)
        root = max(by_root, key=lambda r: (len(by_root[r]), -r))  # a GRPO group: one prompt, several samples
        group = by_root[root]
        assert len(group) >= 2
        a, b = group[0], group[1]
        ta, tb = t.trajectory(a), t.trajectory(b)
        split = [x for x, y in zip(ta.path, tb.path, strict=False) if x == y][-1]
        node_a = t.node(a)
        state = t._db.conn().execute("SELECT consumed_seq FROM leaves WHERE id = ?", (a,)).fetchone()[0]
    from fr_agents.ledger import EpisodeLedger

    ledger = EpisodeLedger(trained_run / "episodes.sqlite")
    batches = {r[1]: k for k in range(3) for r in ledger.batch_rows(k)}
    ledger.close()

    with serving(trained_run) as url:
        page.goto(url + "#trees")
        page.click(f"#roots tbody tr[data-root='{root}']")
        page.wait_for_selector(f"#tree .node[data-node='{a}']")
        assert page.inner_text("#tree-leaves") == str(len(group))
        assert page.locator("#tree .node[data-leaf='1']").count() == len(group)
        # a leaf: its decoded text, reward, and the batch that consumed it
        page.click(f"#tree .node[data-node='{a}'] .box")
        page.wait_for_selector(f"#detail[data-node='{a}'] #detail-text")
        assert page.inner_text("#detail-text") == decode(node_a.token_ids)
        assert page.inner_text("#detail-reward") == _fmt(ta.reward)
        assert page.inner_text("#detail-batch") == f"store batch {state}"
        assert f"learner batch {batches[a]}" in page.inner_text("#detail-ledger")
        # the heat map: one span per token, with the stored behaviour log-prob and policy version
        spans = page.locator("#heat .tok")
        assert spans.count() == len(node_a.token_ids)
        seg = node_a.segment
        for i in range(len(node_a.token_ids)):
            ds = spans.nth(i).evaluate("e => ({lp: e.dataset.lp, v: e.dataset.v, kind: e.dataset.kind})")
            assert ds["kind"] == ("policy" if seg.mask[i] else "env")
            assert int(ds["v"]) == int(seg.versions[i])
            if seg.mask[i]:
                assert abs(float(ds["lp"]) - float(seg.logprobs[i])) < 1e-6
                assert page.evaluate("e => e.style.background", spans.nth(i).element_handle()) != ""
        page.select_option("#heat-mode", "v")
        # two siblings side by side from their split point
        page.check(f"#tree .node[data-node='{a}'] input.cmp")
        page.check(f"#tree .node[data-node='{b}'] input.cmp")
        page.click("#compare-btn")
        page.wait_for_selector("#compare .side-b")
        assert page.get_attribute("#compare-split", "data-node") == str(split)
        side_a = page.inner_text("#compare .side-a")
        side_b = page.inner_text("#compare .side-b")
        with TrajectoryTree.open(store) as t:
            for side, traj in ((side_a, ta), (side_b, tb)):
                for nid in traj.path[traj.path.index(split) + 1 :]:
                    assert decode(t.node(nid).token_ids).strip() in side
        assert f"reward {_fmt(ta.reward)}" in side_a and f"reward {_fmt(tb.reward)}" in side_b
        shot = screenshot(page, "tree_page")
        assert shot.exists()
        _no_problems(page)


def test_forks_indent_their_branches_and_a_chain_of_turns_stays_in_line(text_store, page, serving) -> None:
    """The tree indents by forks, not by nodes: root ``a`` forks into "I think" and "Answer" (one step
    in), "I think" forks again (two steps); "Answer", the tool's feedback and " 5" are a chain, each
    its parent's only child, so they stand in one line (a 30-turn episode reads as a list, not as 60
    nested columns)."""
    path, ids = text_store
    with serving(path, model=MODEL) as url:
        page.goto(url + "#trees")
        page.click(f"#roots tbody tr[data-root='{ids['a']}']")
        page.wait_for_selector(f"#tree .node[data-node='{ids['tool']}']")
        nodes = page.locator("#tree .node")
        shown = {
            int(nodes.nth(i).get_attribute("data-node")): (
                int(nodes.nth(i).get_attribute("data-indent")),
                nodes.nth(i).locator(".guide").count(),
            )
            for i in range(nodes.count())
        }
    with TrajectoryTree.open(path) as t:
        tool_path = t.trajectory(ids["tool"]).path
    want = {ids["a"]: 0, ids["think"]: 1, ids["five"]: 2, ids["six"]: 2}
    want |= {node: 1 for node in tool_path[1:]}  # "Answer", the feedback, " 5": a chain under the fork
    assert {node: shown[node] for node in want} == {node: (n, n) for node, n in want.items()}


# ====================================================================== untrusted text
XSS_PROMPT = '<script>window.__xss=1;alert(1)</script><img src=x onerror="window.__xss=2;alert(2)">'
XSS_REPLY = "<img src=x onerror=alert(4)><svg onload=alert(5)>"


@pytest.mark.parametrize("csp", ["enforced", "bypassed"])
def test_markup_in_episodes_renders_as_text(xss_store, browser, watch, serving, screenshot, csp) -> None:
    """Prompt, observation, model reply, root meta and leaf info all carry markup (xss_store):
    the page shows it as text; no script runs, no dialog opens, no element is created from it.
    Run twice: with the server's Content-Security-Policy, and with the browser told to ignore it,
    so the escaping itself is what is shown to hold."""
    path, leaf = xss_store
    ctx = browser.new_context(viewport={"width": 1500, "height": 950}, bypass_csp=csp == "bypassed")
    page = watch(ctx.new_page())
    with serving(path, MODEL) as url:
        page.goto(url + "#trees")
        row = page.locator("#roots tbody tr").first
        assert "<img src=x onerror=" in row.inner_text()  # the prompt's tail, as text
        row.click()
        page.wait_for_selector(f"#tree .node[data-node='{leaf}']")
        assert "<script>window.__xss=1;alert(1)</script>" in page.inner_text("#tree")
        assert XSS_REPLY in page.inner_text("#tree")
        page.click(f"#tree .node[data-node='{leaf}'] .box")
        page.wait_for_selector("#detail-info")
        assert "<script>alert(7)</script>" in page.inner_text("#detail-info")
        root_row = page.locator("#tree .node").first
        root_row.locator(".box").click()
        page.wait_for_selector("#detail-meta")
        assert XSS_PROMPT in page.inner_text("#detail-text")
        assert "<b onmouseover=alert(8)>evil</b>" in page.inner_text("#detail-meta")
        # nothing from the store became an element
        assert page.locator("main img, main svg:not(.chart svg), main b[onmouseover]").count() == 0
        assert page.evaluate("document.querySelectorAll('script').length") == 1  # app.js only
        page.wait_for_timeout(500)  # give any injected handler a chance to fire
        screenshot(page, f"xss_as_text_csp_{csp}")
        _no_problems(page)
    ctx.close()


def test_page_sees_new_roots_while_a_writer_appends(text_store, page, serving, encode) -> None:
    from playwright.sync_api import expect

    """A writer that never waits (busy timeout 0) appends during the session; the open page
    picks the new root up by polling, and the open tree offers to reload with the new leaf."""
    path, ids = text_store
    with serving(path, MODEL) as url:
        page.goto(url + "#trees")
        page.click(f"#roots tbody tr[data-root='{ids['a']}']")
        page.wait_for_selector("#tree-leaves")
        assert page.inner_text("#tree-leaves") == "3"
        assert page.locator("#roots tbody tr").count() == 3
        with TrajectoryTree.open(path, busy_timeout_ms=0) as w:
            for k in range(10):  # writes while the page polls and the server reads
                new_root = w.add_root(
                    encode(f"fresh task {k}"), meta={"env": "fr_agents/MathVerifier-v0", "seed": 100 + k}
                )
                tok = encode(" reply")
                w.finish(w.append(new_root, tok, [-0.4] * len(tok), True, 3), 0.75)
                time.sleep(0.1)
            tok = encode(" also")
            w.finish(w.append(ids["a"], tok, [-0.6] * len(tok), True, 3), 0.25)
        page.wait_for_selector(f"#roots tbody tr[data-root='{new_root}']", timeout=15_000)
        assert page.locator("#roots tbody tr").count() == 13
        page.wait_for_selector("#tree-reload:not([hidden])")
        page.click("#tree-reload")
        expect(page.locator("#tree-leaves")).to_have_text("4")
        _no_problems(page)


def test_demo_tokens_and_pruned_leaves_are_marked(text_store, page, serving) -> None:
    path, ids = text_store
    with serving(path, MODEL) as url:
        page.goto(url + "#trees")
        page.select_option("#filters select[name='pruned']", "yes")
        page.click("#filters button[type='submit']")
        page.wait_for_selector("#roots-count:text('1–1 of 1 roots')")
        page.click(f"#roots tbody tr[data-root='{ids['c']}']")
        page.wait_for_selector(f"#tree .node[data-node='{ids['pruned']}']")
        assert page.locator("#tree .node.pruned").count() == 1
        assert (
            page.locator(f"#tree .node.pruned[data-node='{ids['pruned']}'] .badge.pruned").inner_text()
            == "pruned"
        )
        page.click("#filters-reset")
        page.wait_for_selector(f"#roots tbody tr[data-root='{ids['b']}']")
        page.click(f"#roots tbody tr[data-root='{ids['b']}']")
        page.click(f"#tree .node[data-node='{ids['demo']}'] .box")
        page.wait_for_selector(f"#detail[data-node='{ids['demo']}'] #detail-text")
        assert page.locator("#detail-text span[data-kind='demo']").inner_text() == "hi there"
        assert page.locator("#heat .tok.demo").count() == page.locator("#heat .tok").count() > 0
        bg = page.locator("#detail-text span[data-kind='demo']").evaluate(
            "e => getComputedStyle(e).backgroundColor"
        )
        page.click(f"#tree .node[data-node='{ids['hello']}'] .box")
        page.wait_for_selector(f"#detail[data-node='{ids['hello']}'] #detail-text")
        policy_bg = page.locator("#detail-text span[data-kind='policy']").evaluate(
            "e => getComputedStyle(e).backgroundColor"
        )
        assert bg != policy_bg  # demo and policy tokens look different
        _no_problems(page)


# ====================================================================== answers out of order
def _hold_first(page, pattern: str, want) -> list:
    """Route ``pattern`` through the browser: the first request for which ``want(url)`` holds is
    kept unanswered (returned in the list) until the test continues it; every other one goes on."""
    held: list = []

    def route(r) -> None:
        if not held and want(r.request.url):
            held.append(r)
        else:
            r.continue_()

    page.route(pattern, route)
    return held


def _wait_held(page, held: list) -> None:
    for _ in range(100):
        if held:
            return
        page.wait_for_timeout(100)
    raise AssertionError("the page never made the request the test holds")


def test_a_late_answer_to_the_unfiltered_list_does_not_replace_the_filtered_one(
    text_store, page, serving
) -> None:
    """The page asks for the unfiltered root list on load; a filter submitted before that answer
    arrives asks again. Whatever order the answers come in, the list shows the latest request."""
    path, ids = text_store
    held = _hold_first(page, "**/api/roots?*", lambda u: "pruned=" not in u)
    with serving(path, MODEL) as url:
        page.goto(url + "#trees")
        _wait_held(page, held)
        page.select_option("#filters select[name='pruned']", "yes")
        page.click("#filters button[type='submit']")
        page.wait_for_selector("#roots-count:text('1–1 of 1 roots')")
        with page.expect_response(lambda r: "/api/roots?" in r.url and "pruned=" not in r.url):
            held[0].continue_()
        page.wait_for_timeout(500)  # let the page handle the late answer
        assert page.inner_text("#roots-count") == "1–1 of 1 roots"
        assert [
            int(x)
            for x in page.locator("#roots tbody tr").evaluate_all("rs => rs.map((r) => r.dataset.root)")
        ] == [ids["c"]]
        _no_problems(page)


def test_opening_a_root_while_another_still_loads_shows_the_one_opened_last(
    text_store, page, serving
) -> None:
    """A click on a second root while the first root's tree is still on its way: the second tree
    loads (it does not wait behind the first), and the first one's late answer draws nothing."""
    path, ids = text_store
    held = _hold_first(page, "**/api/tree/*", lambda u: f"/api/tree/{ids['a']}?" in u)
    with serving(path, MODEL) as url:
        page.goto(url + "#trees")
        page.click(f"#roots tbody tr[data-root='{ids['a']}']")
        _wait_held(page, held)
        page.click(f"#roots tbody tr[data-root='{ids['b']}']")
        page.wait_for_selector(f"#tree .node[data-node='{ids['demo']}']", timeout=10_000)
        with page.expect_response(lambda r: f"/api/tree/{ids['a']}?" in r.url):
            held[0].continue_()
        page.wait_for_timeout(500)  # let the page handle the late answer
        assert page.inner_text("#tree-title").startswith(f"root #{ids['b']} ")
        with TrajectoryTree.open(path) as t:
            b_nodes = {
                n
                for lf in t.leaf_ids()
                if t.trajectory(lf).root_id == ids["b"]
                for n in t.trajectory(lf).path
            }
        shown = {
            int(x) for x in page.locator("#tree .node").evaluate_all("rs => rs.map((r) => r.dataset.node)")
        }
        assert shown == b_nodes
        _no_problems(page)


def test_a_late_answer_to_an_earlier_compare_does_not_replace_the_latest(text_store, page, serving) -> None:
    """Compare two leaves, then, before that answer arrives, pick another pair and compare again:
    the panel ends up showing the pair asked for last."""
    path, ids = text_store
    held = _hold_first(page, "**/api/compare?*", lambda u: True)
    with serving(path, MODEL) as url:
        page.goto(url + "#trees")
        page.click(f"#roots tbody tr[data-root='{ids['a']}']")
        for leaf in ("five", "six"):
            page.check(f"#tree .node[data-node='{ids[leaf]}'] input.cmp")
        page.click("#compare-btn")
        _wait_held(page, held)
        page.check(f"#tree .node[data-node='{ids['tool']}'] input.cmp")  # drops "five", the oldest pick
        page.click("#compare-btn")
        page.wait_for_selector(f"#compare .side-b[data-node='{ids['tool']}']")
        with page.expect_response(lambda r: "/api/compare?" in r.url):
            held[0].continue_()
        page.wait_for_timeout(500)  # let the page handle the late answer
        assert page.get_attribute("#compare .side-a", "data-node") == str(ids["six"])
        assert page.get_attribute("#compare .side-b", "data-node") == str(ids["tool"])
        assert page.get_attribute("#compare-split", "data-node") == str(ids["a"])
        _no_problems(page)


# ====================================================================== 10k leaves
def test_ten_thousand_leaves_load_in_chunks(big_store, page, serving, screenshot) -> None:
    path, root = big_store
    with serving(path, MODEL) as url:
        page.goto(url + "#trees")
        t0 = time.perf_counter()
        page.click(f"#roots tbody tr[data-root='{root}']")
        page.wait_for_selector("#tree-leaves")
        page.wait_for_selector("#tree .node:nth-child(300)")  # (no wait_for_function: the CSP forbids eval)
        first = time.perf_counter() - t0
        assert page.inner_text("#tree-leaves") == "10000"
        shown = page.locator("#tree .node").count()
        assert shown < 1000, f"the page drew {shown} rows at once; it should page in chunks"
        assert first < 10, f"first chunk took {first:.1f}s"
        # scrolling to the end of the chunk loads the next one; the page stays responsive
        page.locator("#tree-more").scroll_into_view_if_needed()
        page.wait_for_selector(f"#tree .node:nth-child({shown + 1})")
        t1 = time.perf_counter()
        last = page.locator("#tree .node[data-leaf='1']").last
        last.locator(".box").click()
        page.wait_for_selector("#detail #detail-reward")
        assert time.perf_counter() - t1 < 5
        screenshot(page, "big_tree")
        _no_problems(page)
