"""Choosing and opening a sandbox backend."""

from __future__ import annotations

import logging

from tools_sandbox.limits import SandboxLimits
from tools_sandbox.result import SandboxUnavailable
from tools_sandbox.session import Sandbox

log = logging.getLogger(__name__)

BACKENDS = ("auto", "docker", "bwrap")
HOW_TO_GET_ONE = (
    "install one: `apt-get install bubblewrap debootstrap && fr-agents sandbox "
    "build-image --rootfs-only` (no daemon), or `apt-get install docker.io && "
    "bash scripts/start_dockerd.sh && fr-agents sandbox build-image`"
)


def backend_status() -> dict[str, tuple[bool, str]]:
    """backend -> (usable here, detail or the reason it is not)."""
    from tools_sandbox.bwrap import bwrap_available
    from tools_sandbox.docker_backend import docker_available

    return {"docker": docker_available(), "bwrap": bwrap_available()}


def resolve_backend(backend: str = "auto", image: str | None = None) -> str:
    """The concrete backend for ``backend``: ``auto`` is Docker if its daemon answers (and the image is
    built), else bubblewrap, else :class:`SandboxUnavailable`. Never an unsandboxed fallback."""
    from tools_sandbox.bwrap import bwrap_available
    from tools_sandbox.docker_backend import docker_available

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "docker":
        ok, why = docker_available(image)
        if not ok:
            raise SandboxUnavailable(f"docker sandbox unavailable: {why}")
        return "docker"
    if backend == "bwrap":
        ok, why = bwrap_available()
        if not ok:
            raise SandboxUnavailable(f"bwrap sandbox unavailable: {why}")
        return "bwrap"
    d_ok, d_why = docker_available(image)
    if d_ok:
        return "docker"
    b_ok, b_why = bwrap_available()
    if b_ok:
        log.debug("sandbox backend auto -> bwrap (docker: %s)", d_why)
        return "bwrap"
    raise SandboxUnavailable(
        f"no sandbox backend is available. Docker: {d_why}. bubblewrap: {b_why}. {HOW_TO_GET_ONE}"
    )


def create_sandbox(
    backend: str = "auto",
    limits: SandboxLimits | None = None,
    *,
    image: str | None = None,
    start: bool = True,
) -> Sandbox:
    """A new session of ``backend`` (resolved as in :func:`resolve_backend`), started unless
    ``start=False``."""
    from tools_sandbox.reaper import reap_at_startup

    concrete = resolve_backend(backend, image)
    reap_at_startup(concrete)
    if concrete == "docker":
        from tools_sandbox.docker_backend import DockerSandbox

        sb: Sandbox = DockerSandbox(limits, image=image)
    else:
        from tools_sandbox.bwrap import BwrapSandbox

        sb = BwrapSandbox(limits)
    if start:
        try:
            sb.start()
        except BaseException:
            sb.close()
            raise
    return sb


def open_sandbox(
    backend: str = "auto", limits: SandboxLimits | None = None, *, image: str | None = None
) -> Sandbox:
    """Open a started sandbox session; use it as a context manager so it is closed::

    with open_sandbox(backend="auto", limits=SandboxLimits()) as sb:
        r = sb.run_python("print(1 + 1)", timeout=5.0)
    """
    return create_sandbox(backend, limits, image=image, start=True)
