"""Shared fixtures for the env tests: one small verifier pool per test session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from envs.verifier import VerifierPool


@pytest.fixture(scope="session")
def verifier_pool() -> Iterator[VerifierPool]:
    p = VerifierPool(workers=2, timeout_s=10.0, eager=True)
    yield p
    p.close()
