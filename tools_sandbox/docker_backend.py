"""The Docker backend: one container per worker, driven through the Docker SDK.

Container settings (see :func:`container_spec`): ``network_mode=none`` (no interface but loopback),
read-only root file system with size-limited tmpfs ``/work`` and ``/tmp``, memory limit with swap
included (``memswap_limit == mem_limit``), a CPU quota, a pids limit, all capabilities dropped,
``no-new-privileges``, user 65534, an empty environment but for a few fixed variables, and labels
naming the owning process (host, pid, start time) so the reaper can remove containers whose owner is
gone.

The worker is the container's PID 1 (``python3 -c <worker source>``), so when it dies the container
stops and everything the code started dies with it. The host talks to it over the attach socket
(stdin in, multiplexed stdout/stderr out), attached *before* the container starts so nothing is lost.
A killed worker's container is removed in a background thread so a missed deadline returns at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import threading
import time
from typing import Any

from tools_sandbox.cgroups import CgroupCounters
from tools_sandbox.limits import SandboxLimits
from tools_sandbox.owner import LABEL, OWNER_LABEL, owner_id
from tools_sandbox.result import SandboxUnavailable
from tools_sandbox.session import SANDBOX_ENV, SANDBOX_UID, WORKER_SOURCE, Sandbox, SessionState, Transport

log = logging.getLogger(__name__)

_client_lock = threading.Lock()
_clients: dict[int, Any] = {}


def docker_client() -> Any:
    """The process-wide Docker SDK client (one per pid, so a fork gets its own)."""
    import docker

    pid = os.getpid()
    with _client_lock:
        if pid not in _clients:
            _clients[pid] = docker.from_env(timeout=60, max_pool_size=32)
        return _clients[pid]


def docker_available(image: str | None = None) -> tuple[bool, str]:
    """(usable, reason): the SDK imports, the daemon answers, and the sandbox image exists."""
    from tools_sandbox.image import default_image

    image = image or default_image()
    try:
        import docker
    except ImportError:
        return False, "the docker Python SDK is missing (pip install 'docker>=7')"
    try:
        client = docker.from_env(timeout=3)
        client.ping()
    except Exception as e:  # noqa: BLE001 - any failure means "no daemon"
        return False, (
            f"no Docker daemon answers ({type(e).__name__}); start one with "
            "`bash scripts/start_dockerd.sh` (apt-get install docker.io first)"
        )
    try:
        client.api.inspect_image(image)
    except Exception:  # noqa: BLE001
        return False, f"the sandbox image {image} is missing; build it with `fr-agents sandbox build-image`"
    finally:
        client.close()
    return True, image


def container_spec(limits: SandboxLimits, image: str, worker_cfg: str) -> dict:
    """Keyword arguments of ``APIClient.create_container`` (host config passed separately)."""
    return {
        "image": image,
        "command": ["python3", "-I", "-u", "-c", WORKER_SOURCE, worker_cfg],
        "stdin_open": True,
        "tty": False,
        "user": f"{SANDBOX_UID}:{SANDBOX_UID}",
        "working_dir": "/work",
        "environment": dict(SANDBOX_ENV),
        "hostname": "sandbox",
        "network_disabled": True,
        "labels": {LABEL: "1", OWNER_LABEL: owner_id(), "fr_agents.backend": "docker"},
    }


def host_config(api: Any, limits: SandboxLimits) -> dict:
    from docker.types import Ulimit

    tmpfs = f"rw,exec,nosuid,nodev,size={limits.tmpfs_mb}m,mode=1777"
    return api.create_host_config(
        network_mode="none",
        read_only=True,
        tmpfs={"/work": tmpfs, "/tmp": tmpfs},
        mem_limit=f"{limits.memory_mb}m",
        memswap_limit=f"{limits.memory_mb}m",
        nano_cpus=int(limits.cpus * 1e9),
        pids_limit=limits.pids,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        ulimits=[
            Ulimit(name="nofile", soft=limits.nofile, hard=limits.nofile),
            Ulimit(name="fsize", soft=limits.tmpfs_mb << 20, hard=limits.tmpfs_mb << 20),
            Ulimit(name="core", soft=0, hard=0),
        ],
        ipc_mode="private",
    )


class DockerTransport(Transport):
    """The hijacked attach connection: raw stdin out, Docker's 8-byte-header stream frames in."""

    def __init__(self, sock_obj: Any) -> None:
        self._keep = sock_obj  # holds the HTTP response alive
        self.sock = getattr(sock_obj, "_sock", sock_obj)
        self.sock.settimeout(None)
        self.poller = select.poll()
        self.poller.register(self.sock.fileno(), select.POLLIN)
        self.raw = bytearray()
        self.stderr_tail = bytearray()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, wait_s: float) -> bytes | None:
        if not self.poller.poll(max(0, int(wait_s * 1000) + 1)):
            return None
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            return b""
        self.raw += chunk
        out = bytearray()
        while len(self.raw) >= 8:
            size = int.from_bytes(self.raw[4:8], "big")
            if len(self.raw) < 8 + size:
                break
            kind, payload = self.raw[0], self.raw[8 : 8 + size]
            del self.raw[: 8 + size]
            if kind == 1:
                out += payload
            elif kind == 2:
                self.stderr_tail = (self.stderr_tail + payload)[-4096:]
        return bytes(out) if out else None

    def close(self) -> None:
        for obj in (self.sock, self._keep):
            with contextlib.suppress(Exception):
                obj.close()


class DockerState(SessionState):
    def __init__(self) -> None:
        self.container: str | None = None
        self.all_containers: list[str] = []
        self.threads: list[threading.Thread] = []

    @staticmethod
    def _remove(cid: str) -> None:
        try:
            docker_client().api.remove_container(cid, force=True)
        except Exception as e:  # noqa: BLE001 - "no such container" is fine; the final sweep retries
            log.debug("remove %s: %s", cid[:12], e)

    def kill_worker(self) -> None:
        cid, self.container = self.container, None
        if cid is None:
            return
        t = threading.Thread(target=self._remove, args=(cid,), name="fr-sandbox-rm", daemon=True)
        try:
            t.start()
            self.threads.append(t)
        except RuntimeError:  # interpreter shutting down: no new threads
            self._remove(cid)

    def release(self) -> None:
        for t in self.threads:
            t.join(timeout=30)
        self.threads.clear()
        try:
            api = docker_client().api
        except Exception:  # noqa: BLE001
            return
        for cid in self.all_containers:
            try:
                api.inspect_container(cid)
            except Exception:  # noqa: BLE001 - gone, as it should be
                continue
            self._remove(cid)
        self.all_containers.clear()


class DockerSandbox(Sandbox):
    """A session in a Docker container. See the module docstring."""

    backend = "docker"

    def __init__(self, limits: SandboxLimits | None = None, image: str | None = None) -> None:
        from tools_sandbox.image import default_image

        state = DockerState()
        super().__init__(limits, state)
        self._st = state
        self.image = image or default_image()
        self._cg: CgroupCounters | None = None
        self._last_transport: DockerTransport | None = None

    @property
    def container_id(self) -> str | None:
        return self._st.container

    def _spawn(self) -> Transport:
        api = docker_client().api
        cfg = json.dumps(self.worker_config())
        try:
            created = api.create_container(
                **container_spec(self.limits, self.image, cfg), host_config=host_config(api, self.limits)
            )
        except Exception as e:
            import docker.errors

            if isinstance(e, docker.errors.ImageNotFound):
                raise SandboxUnavailable(
                    f"the sandbox image {self.image} is missing; build it with "
                    "`fr-agents sandbox build-image`"
                ) from e
            raise
        cid = created["Id"]
        self._st.container = cid
        self._st.all_containers.append(cid)
        sock = api.attach_socket(cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
        transport = DockerTransport(sock)
        self._last_transport = transport
        api.start(cid)
        self._cg = CgroupCounters.for_docker(cid)
        return transport

    def _start_failure(self) -> str:
        t = self._last_transport
        return t.stderr_tail.decode(errors="replace").strip() if t is not None else ""

    def _death_cause(self) -> str | None:
        cid = self._st.container
        if cid is None:
            return None
        api = docker_client().api
        deadline = time.monotonic() + 0.5
        while True:
            try:
                state = api.inspect_container(cid)["State"]
            except Exception:  # noqa: BLE001
                return None
            if state.get("OOMKilled"):
                return "oom"
            if not state.get("Running") or time.monotonic() > deadline:
                return None
            time.sleep(0.01)

    def _counters(self) -> tuple[int, int]:
        return self._cg.read() if self._cg is not None else (0, 0)

    def __repr__(self) -> str:
        cid = (self._st.container or "-")[:12]
        return f"<DockerSandbox {cid} {'closed' if self.closed else 'open'}>"
