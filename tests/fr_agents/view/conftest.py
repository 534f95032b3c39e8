"""Fixtures for the viewer tests: stores, a short real training run, a live server, a browser.

The browser is Debian's ``chromium`` driven by Playwright (``executable_path``; Playwright's own
browser download cannot work offline). ``bash scripts/setup.sh --viewer`` (part of ``--all``)
installs both; without them the browser tests skip and say so.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("FR_AGENTS_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "view"  # tests/artifacts/view (git-ignored)
MODEL = "tiny-nano"  # the tokenizer bare test stores are written with

# the short training run: GRPO groups of 4 so that roots branch, a few held-out tasks for the curve
TRAIN_OVERRIDES = [
    "model.tiny_size=nano",
    "tasks.params={digits: 1}",
    "env.kwargs={answer_format: plain, format_reward: 0.1}",
    "objective.algo=grpo",
    "objective.grpo_group_size=4",
    "trainer.batch_size=8",
    "rollout.concurrency=8",
    "trainer.steps=3",
    "trainer.checkpoint_every=1",
    "trainer.max_minutes=0",
    "trainer.eval_episodes=8",
    "trainer.plot_every=1",
    "trainer.collapse_guard=false",
    "warm_start.examples=0",
    "trainer.threads=1",
]


@pytest.fixture(scope="session")
def encode():
    """``text -> token ids`` with the tokenizer of ``MODEL``."""
    from tokenizers import Tokenizer

    from fr_agents.models import resolve_model

    tok = Tokenizer.from_file(str(Path(resolve_model(MODEL)) / "tokenizer.json"))
    return lambda text: tok.encode(text, add_special_tokens=False).ids


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory made by ``fr-agents train`` (3 steps of the tiny model, ~30 s)."""
    import torch

    from trainer.loop import main_train

    torch.set_num_threads(1)
    run = tmp_path_factory.mktemp("view-run") / "run"
    assert main_train("math-tiny", TRAIN_OVERRIDES, run_dir=str(run)) == 0
    return run


@pytest.fixture
def fast_dir() -> Iterator[Path]:
    """A scratch folder on tmpfs when there is one: every ``finish`` fsyncs, and 10k of them on a
    disk take a minute."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    d = Path(tempfile.mkdtemp(prefix="fr-view-", dir=base))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@contextmanager
def _serving(path: Path, model: str | None = None) -> Iterator[str]:
    """Serve ``path`` on a free loopback port in a thread; yields the URL."""
    from fr_agents.view import make_server

    server = make_server(path, port=0, model=model)
    th = threading.Thread(target=server.serve_forever, daemon=True)
    th.start()
    try:
        yield server.url
    finally:
        server.shutdown()
        server.server_close()
        th.join(timeout=10)


def _missing(why: str) -> None:
    """Skip with the reason; under CI (``CI`` set, where ``setup.sh --all`` ran) fail instead, so a
    broken install step cannot turn the browser tests into silent skips."""
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI runs setup.sh --all, which must install it)")
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser():
    """Headless Debian chromium through Playwright (skips, saying why, when either is missing).

    Module-scoped: Playwright's sync API keeps an asyncio loop running in the main thread until it
    stops, and later tests of the session call ``asyncio.run`` there."""
    if not Path(CHROMIUM).exists():
        _missing(f"chromium not found at {CHROMIUM}: bash scripts/setup.sh --viewer installs it")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed: bash scripts/setup.sh --viewer installs it")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


def _watch(pg):
    """Record a page's console errors, page errors and dialogs (an XSS would open one) in
    ``pg.problems``."""
    pg.set_default_timeout(20_000)
    pg.problems = []
    pg.on("pageerror", lambda e: pg.problems.append(f"pageerror: {e}"))
    pg.on("console", lambda m: m.type == "error" and pg.problems.append(f"console: {m.text}"))

    def on_dialog(d):
        pg.problems.append(f"dialog: {d.message}")
        d.dismiss()

    pg.on("dialog", on_dialog)
    return pg


@pytest.fixture
def watch():
    """``watch(page)``: start recording the page's problems (see ``page``)."""
    return _watch


@pytest.fixture
def page(browser):
    """A fresh page in its own context, its problems recorded in ``page.problems``."""
    ctx = browser.new_context(viewport={"width": 1500, "height": 950})
    yield _watch(ctx.new_page())
    ctx.close()


def _screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    out = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(out), full_page=False)
    assert out.stat().st_size > 5_000
    return out


@pytest.fixture
def serving():
    """``with serving(path, model=None) as url:`` a live viewer on a free loopback port."""
    return _serving


@pytest.fixture
def screenshot():
    """``screenshot(page, name)``: keep a PNG under tests/artifacts/view/ (git-ignored); returns its path."""
    return _screenshot


XSS_PROMPT = '<script>window.__xss=1;alert(1)</script><img src=x onerror="window.__xss=2;alert(2)">'
XSS_REPLY = "<img src=x onerror=alert(4)><svg onload=alert(5)>"
XSS_OBS = "</pre><script>alert(6)</script>"


@pytest.fixture
def text_store(fast_dir: Path, encode):
    """A small bare store written with ``MODEL``'s tokenizer; returns ``(path, ids)``.

    root ``a``: "What is 2+3?" -> policy "I think" (v0) -> " it is 5" (reward 1) | " it is 6" (0);
                and -> policy "Answer" (v1) + env "\\nTool says: ok\\n" + policy " 5" (truncated, partial 0.5)
    root ``b`` (env me/Other-v0): a scripted demo reply (reward 1, demo_spans) and a policy reply (0.2)
    root ``c``: two replies with the same actions but other log-probs; pruning marks the younger one
    """
    from fr_agents.tree import TrajectoryTree

    path = fast_dir / "text.db"
    ids: dict[str, int] = {}
    with TrajectoryTree.open(path) as t:
        math = {"env": "fr_agents/MathVerifier-v0", "seed": 1}
        a = ids["a"] = t.add_root(encode("What is 2+3?"), meta=math)
        think = ids["think"] = t.append(a, encode("I think"), [-0.5] * len(encode("I think")), True, 0)
        for name, text, reward in (("five", " it is 5", 1.0), ("six", " it is 6", 0.0)):
            tok = encode(text)
            ids[name] = t.finish(
                t.append(think, tok, [-0.25 - 0.5 * k for k in range(len(tok))], True, 0), reward
            )
        ans = t.append(a, encode("Answer"), [-1.0] * len(encode("Answer")), True, 1)
        obs = t.append(ans, encode("\nTool says: ok\n"), None, False, -1)
        tok = encode(" 5")
        ids["tool"] = t.finish(
            t.append(obs, tok, [-0.1] * len(tok), True, 1), 0.0, partial_score=0.5, status="truncated"
        )
        b = ids["b"] = t.add_root(encode("Say hi"), meta={"env": "me/Other-v0", "seed": 2})
        plen, demo = len(encode("Say hi")), encode("hi there")
        ids["demo"] = t.finish(
            t.append(b, demo, None, False, -1),
            1.0,
            info={"agent": "expert", "demo_spans": [[plen, plen + len(demo)]]},
        )
        tok = encode("hello")
        ids["hello"] = t.finish(t.append(b, tok, [-0.3] * len(tok), True, 2), 0.2)
        c = ids["c"] = t.add_root(encode("dup"), meta=math)
        tok = encode("same")
        ids["keep"] = t.finish(t.append(c, tok, [-0.1] * len(tok), True, 0), 0.5)
        ids["pruned"] = t.finish(t.append(c, tok, [-0.2] * len(tok), True, 0), 0.5)
        assert t.prune() == 1
    return path, ids


@pytest.fixture
def xss_store(fast_dir: Path, encode):
    """A store whose prompt, observation, model reply, root meta and leaf info all hold markup
    that would run if inserted as HTML; returns ``(path, leaf_id)``."""
    from fr_agents.tree import TrajectoryTree

    path = fast_dir / "xss.db"
    with TrajectoryTree.open(path) as t:
        r = t.add_root(
            encode(XSS_PROMPT),
            meta={"env": "<b onmouseover=alert(8)>evil</b>", "task": "<script>alert(3)</script>"},
        )
        reply = encode(XSS_REPLY)
        n = t.append(r, reply, [-0.2] * len(reply), True, 0)
        n = t.append(n, encode(XSS_OBS), None, False, -1)
        leaf = t.finish(
            t.append(n, encode("ok"), [-0.1] * len(encode("ok")), True, 0),
            1.0,
            info={"note": "<script>alert(7)</script>"},
        )
    return path, leaf


@pytest.fixture(scope="session")
def big_store() -> Iterator[tuple[Path, int]]:
    """One root with 10,000 leaves (100 branches of 100), written through the store's API;
    returns ``(path, root)``. 10-45 s on tmpfs here (2 shared cores), about a minute on a disk."""
    from fr_agents.tree import TrajectoryTree

    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    d = Path(tempfile.mkdtemp(prefix="fr-view-big-", dir=base))
    path = d / "big.db"
    with TrajectoryTree.open(path) as t:
        root = t.add_root([1, 2, 3])
        for i in range(100):
            mid = t.append(root, [10, 100 + i], [-0.5, -0.5], True, 0)
            for j in range(100):
                t.finish(t.append(mid, [20 + j % 50, 5 + j // 50, 7], [-0.1, -0.2, -0.3], True, 1), j / 100)
    yield path, root
    shutil.rmtree(d, ignore_errors=True)
