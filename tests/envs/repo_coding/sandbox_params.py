"""Backend parametrisation shared by the sandbox-backed tests."""

import subprocess

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
        r = subprocess.run(["/usr/bin/python3", "-c", "import pytest"], capture_output=True)
        if r.returncode != 0:
            pytest.skip("the bwrap sandbox runs the host's /usr/bin/python3, which lacks pytest "
                        "(apt-get install python3-pytest)")
    return backend
