"""Shared fixtures for the env tests: one small verifier pool per test session, and ``backend``
(each sandbox backend in turn; a backend that is truly missing skips with the reason)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from envs.verifier import VerifierPool
from tools_sandbox.bwrap import bwrap_available
from tools_sandbox.docker_backend import docker_available

BACKENDS = [
    pytest.param("docker", marks=pytest.mark.docker, id="docker"),
    pytest.param("bwrap", marks=pytest.mark.bwrap, id="bwrap"),
]


@pytest.fixture(scope="session")
def verifier_pool() -> Iterator[VerifierPool]:
    p = VerifierPool(workers=2, timeout_s=10.0, eager=True)
    yield p
    p.close()


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    ok, why = docker_available() if request.param == "docker" else bwrap_available()
    if not ok:
        pytest.skip(f"{request.param} backend unavailable: {why}")
    return request.param
