"""Shared fixtures for the sandbox tests.

Backends are real: the Docker tests need a daemon and the image (`bash scripts/start_dockerd.sh`,
`fr-agents sandbox build-image`), the bwrap tests need bubblewrap. A backend that is truly missing
skips its tests with the reason; everything else must pass.

The session-wide finalizer checks the guarantee "no sandbox outlives its owner": after the whole run no
container labelled with this process as owner, no labelled bwrap process and no session cgroup remains.
"""

from __future__ import annotations

import gc
import subprocess

import pytest

from tools_sandbox import SandboxLimits, live_sessions
from tools_sandbox.bwrap import bwrap_available
from tools_sandbox.docker_backend import docker_available
from tools_sandbox.owner import OWNER_LABEL, owner_id
from tools_sandbox.pool import close_shared_pools
from tools_sandbox.reaper import leftovers

# Small limits keep the hostile programs fast: an OOM at 160 MB comes quickly.
TEST_LIMITS = SandboxLimits(memory_mb=160, pids=32, nofile=128, tmpfs_mb=16, call_timeout=5.0)
BACKENDS = [
    pytest.param("docker", marks=pytest.mark.docker, id="docker"),
    pytest.param("bwrap", marks=pytest.mark.bwrap, id="bwrap"),
]


def require(backend: str) -> None:
    ok, why = docker_available() if backend == "docker" else bwrap_available()
    if not ok:
        pytest.skip(f"{backend} backend unavailable: {why}")


def docker_containers_of_this_process() -> list[str]:
    """Container ids labelled with this process as owner, asked through the docker CLI (independent
    of the SDK code under test)."""
    out = subprocess.run(
        ["docker", "ps", "-a", "-q", "--filter", f"label={OWNER_LABEL}={owner_id()}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.stdout.split() if out.returncode == 0 else []


@pytest.fixture(scope="session", autouse=True)
def no_sandbox_outlives_the_run():
    yield
    close_shared_pools()  # process-wide pools are closed at exit by design; do it now to check
    gc.collect()
    left = leftovers()
    left["open sessions"] = [repr(sb) for sb in live_sessions()]
    if docker_available()[0]:
        left["containers (docker ps by label)"] = docker_containers_of_this_process()
    assert not any(left.values()), f"sandboxes outlived the test run: {left}"


@pytest.fixture(scope="module", params=BACKENDS)
def sb(request):
    """One sandbox per backend, shared by a test module."""
    from tools_sandbox import create_sandbox

    require(request.param)
    s = create_sandbox(request.param, TEST_LIMITS)
    yield s
    s.close()
