"""The viewer's HTTP server: a JSON API over :class:`StoreReader` plus the static page.

Standard library only (``http.server.ThreadingHTTPServer``); the page is plain HTML, CSS and
JavaScript shipped inside the package (no CDN: the machine may be offline).

Safety:

* it binds ``127.0.0.1`` unless told otherwise, and while bound to a loopback address it
  answers only requests whose ``Host`` header names that address (a web page elsewhere cannot
  reach it through DNS rebinding);
* it only reads: the store is opened read-only and nothing in the API writes;
* every text from the store (prompts, observations, model output, ``info``) is data in JSON;
  the page inserts it with ``textContent`` only, and the Content-Security-Policy forbids inline
  scripts, so markup inside an episode shows as text and never runs.

Routes (all ``GET``)::

    /                      the page              /api/tree/<root>?offset&limit   a chunk of one tree
    /static/<file>         its assets            /api/node/<id>                  one node in full
    /api/summary           what is open          /api/compare?a=<id>&b=<id>      two branches
    /api/poll              change counters       /api/run                        curves, config, checkpoints
    /api/roots?...         the filtered root list (reward_min, reward_max, status, env, version,
                           pruned=yes|no, sort, order=asc|desc, offset, limit)
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fr_agents.view.decode import TokenText
from fr_agents.view.layout import Target, checkpoints, locate, tokenizer_source
from fr_agents.view.reader import NotFound, StoreReader, finite
from fr_agents.view.run import config_text, curves, read_rows

log = logging.getLogger(__name__)

STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


class ViewApp:
    """What the handlers share: the target, its reader and the tokenizer."""

    def __init__(self, target: Target, decoder: TokenText) -> None:
        self.target = target
        self.decoder = decoder
        self._reader: StoreReader | None = None
        self._lock = threading.Lock()
        self.static = {
            p.name: p for p in resources.files("fr_agents.view").joinpath("static").iterdir() if p.is_file()
        }

    def reader(self) -> StoreReader | None:
        """The store reader, opened once the store file exists (a run may not have one yet)."""
        with self._lock:
            if self._reader is None and self.target.store.is_file():
                self._reader = StoreReader(self.target.store, self.target.ledger)
            return self._reader

    def need_reader(self) -> StoreReader:
        r = self.reader()
        if r is None:
            raise NotFound(f"store: {self.target.store} does not exist yet")
        return r

    # ------------------------------------------------------------------ API
    def summary(self) -> dict[str, Any]:
        r = self.reader()
        t = self.target
        return {
            "kind": t.kind,
            "path": str(t.run_dir or t.store),
            "name": (t.run_dir or t.store).name,
            "store": str(t.store),
            "tokenizer": self.decoder.source,
            "stats": r.stats() if r else None,
            "filters": r.filter_options() if r else None,
        }

    def poll(self) -> dict[str, Any]:
        r = self.reader()
        m = self.target.metrics
        return {
            "store": list(r.version()) if r else None,
            "metrics": m.stat().st_size if m and m.is_file() else 0,
        }

    def run(self) -> dict[str, Any]:
        r = self.reader()
        t = self.target
        return {
            "curves": curves(read_rows(t.metrics), r.sharing_by_batch() if r else []),
            "config": config_text(t.config),
            "checkpoints": checkpoints(t.run_dir),
            "stats": r.stats() if r else None,
        }

    def roots(self, q: dict[str, str]) -> dict[str, Any]:
        return self.need_reader().roots(
            self.decoder,
            reward_min=_opt(q, "reward_min", float),
            reward_max=_opt(q, "reward_max", float),
            status=q.get("status") or None,
            env=q.get("env") or None,
            version=_opt(q, "version", int),
            pruned=q.get("pruned") or None,
            sort=q.get("sort") or "id",
            order=q.get("order") or "asc",
            offset=_opt(q, "offset", int) or 0,
            limit=_opt(q, "limit", int) or 50,
        )

    def tree(self, root: int, q: dict[str, str]) -> dict[str, Any]:
        return self.need_reader().tree_page(
            root, self.decoder, offset=_opt(q, "offset", int) or 0, limit=_opt(q, "limit", int) or 200
        )

    def node(self, node: int) -> dict[str, Any]:
        return self.need_reader().node(node, self.decoder)

    def compare(self, q: dict[str, str]) -> dict[str, Any]:
        a, b = _opt(q, "a", int), _opt(q, "b", int)
        if a is None or b is None:
            raise ValueError("a, b: give two node ids")
        return self.need_reader().compare(a, b, self.decoder)


def _opt(q: dict[str, str], key: str, cast: type) -> Any:
    raw = q.get(key, "")
    if raw == "":
        return None
    try:
        return cast(raw)
    except ValueError:
        raise ValueError(f"{key}: expected {cast.__name__}, got {raw!r}") from None


def _int_tail(path: str, prefix: str) -> int:
    raw = path[len(prefix) :]
    if not raw.isdigit():
        raise NotFound(f"{prefix.strip('/').split('/')[-1]}: expected a numeric id, got {raw!r}")
    return int(raw)


class Handler(BaseHTTPRequestHandler):
    """Routes one request (see the module docstring)."""

    server: ViewServer
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("%s " + fmt, self.address_string(), *args)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if not self.server.host_allowed(self.headers.get("Host", "")):
            self._send(HTTPStatus.FORBIDDEN, b"host not allowed", "text/plain; charset=utf-8")
            return
        url = urlsplit(self.path)
        path = url.path
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        app = self.server.app
        try:
            if path in ("/", "/index.html"):
                self._static("index.html")
            elif path == "/favicon.ico":  # browsers ask; there is none
                self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
            elif path.startswith("/static/"):
                self._static(path.removeprefix("/static/"))
            elif path == "/api/summary":
                self._json(app.summary())
            elif path == "/api/poll":
                self._json(app.poll())
            elif path == "/api/run":
                self._json(app.run())
            elif path == "/api/roots":
                self._json(app.roots(q))
            elif path.startswith("/api/tree/"):
                self._json(app.tree(_int_tail(path, "/api/tree/"), q))
            elif path.startswith("/api/node/"):
                self._json(app.node(_int_tail(path, "/api/node/")))
            elif path == "/api/compare":
                self._json(app.compare(q))
            else:
                self._json({"error": f"no such page: {path}"}, HTTPStatus.NOT_FOUND)
        except NotFound as e:
            self._json({"error": str(e)}, HTTPStatus.NOT_FOUND)
        except ValueError as e:
            self._json({"error": str(e)}, HTTPStatus.BAD_REQUEST)
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as e:  # noqa: BLE001 - one bad request must not stop the server
            log.exception("viewer: %s failed", self.path)
            self._json({"error": f"{type(e).__name__}: {e}"}, HTTPStatus.INTERNAL_SERVER_ERROR)

    # ------------------------------------------------------------------ replies
    def _static(self, name: str) -> None:
        f = self.server.app.static.get(name)
        if f is None or Path(name).suffix not in STATIC_TYPES:
            self._json({"error": f"no such file: {name}"}, HTTPStatus.NOT_FOUND)
            return
        self._send(HTTPStatus.OK, f.read_bytes(), STATIC_TYPES[Path(name).suffix])

    def _json(self, obj: Any, status: HTTPStatus = HTTPStatus.OK) -> None:
        body = json.dumps(finite(obj), allow_nan=False).encode()
        self._send(status, body, "application/json")

    def _send(self, status: HTTPStatus, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)


class ViewServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` carrying the app; daemon threads so Ctrl-C ends it at once."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], app: ViewApp) -> None:
        self.app = app
        super().__init__(address, Handler)
        host, port = self.server_address[:2]
        self.loopback = _is_loopback(address[0])
        names = {address[0], str(host), "localhost", "127.0.0.1", "[::1]"} if self.loopback else set()
        self.allowed = {f"{n}:{port}" for n in names}

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return f"http://{shown}:{port}/"

    def host_allowed(self, host_header: str) -> bool:
        return not self.loopback or host_header in self.allowed


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def make_server(
    path: str | Path, *, host: str = "127.0.0.1", port: int = 8765, model: str | None = None
) -> ViewServer:
    """Resolve ``path``, load its tokenizer and bind (``port=0``: any free port). Does not serve yet."""
    target = locate(path)
    if target.kind == "store" and not target.store.is_file():
        raise ValueError(f"PATH: no trajectory store at {target.store}")
    decoder = TokenText.load(tokenizer_source(target, model))
    app = ViewApp(target, decoder)
    app.reader()  # a bad store fails now, before the URL is printed
    if not 0 <= port <= 65535:
        raise ValueError(f"--port: must lie in [0, 65535], got {port}")
    try:
        return ViewServer((host, port), app)
    except OSError as e:
        raise ValueError(
            f"--port: cannot listen on {host}:{port} ({e.strerror}); --port 0 picks a free port"
        ) from None


def serve(path: str | Path, *, host: str = "127.0.0.1", port: int = 8765, model: str | None = None) -> int:
    """``fr-agents view``: serve until interrupted; prints the URL first."""
    server = make_server(path, host=host, port=port, model=model)
    if not server.loopback:
        log.warning(
            "viewer: listening on %s, reachable from other machines; it serves without a password", host
        )
    print(f"fr-agents view: {server.app.target.kind} {server.app.summary()['path']}", flush=True)
    print(f"open {server.url}  (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
