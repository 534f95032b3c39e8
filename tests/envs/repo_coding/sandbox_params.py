"""Backend parametrisation shared by the sandbox-backed tests."""

import pytest

from tools_sandbox.bwrap import bwrap_available
from tools_sandbox.docker_backend import docker_available

BACKENDS = [
    pytest.param("docker", marks=pytest.mark.docker, id="docker"),
    pytest.param("bwrap", marks=pytest.mark.bwrap, id="bwrap"),
]


def require(backend: str) -> str:
    ok, why = docker_available() if backend == "docker" else bwrap_available()
    if not ok:
        pytest.skip(f"{backend} backend unavailable: {why}")
    if backend == "bwrap":
        from tools_sandbox.bwrap import rootfs

        root = rootfs()
        if root is None or not (root / "usr/lib/python3/dist-packages/pytest").is_dir():
            pytest.skip(
                "the bwrap sandbox runs the image root file system's python3, which lacks pytest "
                "(`fr-agents sandbox build-image --rootfs-only`)"
            )
    return backend
