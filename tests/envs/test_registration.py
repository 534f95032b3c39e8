"""Registration: every built-in id is made by ``gymnasium.make`` after ``import envs``; user envs
named ``module:Id`` work; ``fr-agents envs`` lists ids; the documented custom-env example runs."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import envs  # noqa: F401  (registers the built-in ids)
from fr_agents.registry import BUILTIN_ENVS

ROOT = Path(__file__).resolve().parents[2]


def test_builtin_ids_are_registered_by_import_envs() -> None:
    assert "fr_agents/MathVerifier-v0" in BUILTIN_ENVS
    for env_id in BUILTIN_ENVS:
        assert env_id in gymnasium.registry, env_id


@pytest.mark.parametrize("env_id", sorted(BUILTIN_ENVS))
def test_gymnasium_make_every_registered_id(env_id: str) -> None:
    try:
        env = gymnasium.make(env_id)
    except ImportError as e:  # an optional component (e.g. ALFWorld's extras) that is not installed here
        pytest.skip(f"{env_id}: optional dependency missing: {e}")
    try:
        assert isinstance(env.unwrapped, gymnasium.Env)
    finally:
        env.close()


def test_math_verifier_passes_gymnasium_env_checker(verifier_pool) -> None:  # noqa: ANN001
    env = gymnasium.make("fr_agents/MathVerifier-v0", pool=verifier_pool)
    check_env(env.unwrapped, skip_render_check=True)
    env.close()


def test_import_fr_agents_registers_without_importing_envs() -> None:
    import subprocess

    code = (
        "import sys, gymnasium, fr_agents; "
        "assert 'fr_agents/MathVerifier-v0' in gymnasium.registry; "
        "assert 'envs.math_verifier' not in sys.modules; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def test_cli_envs_lists_ids(capsys: pytest.CaptureFixture[str]) -> None:
    from fr_agents.cli import main

    assert main(["envs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("fr_agents/MathVerifier-v0") and "boxed" in line for line in lines)


def test_module_colon_id_imports_user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_user_envs.py").write_text(
        textwrap.dedent(
            """
            import gymnasium
            from fr_agents.spaces import AnyText

            class Echo(gymnasium.Env):
                def __init__(self):
                    self.observation_space, self.action_space = AnyText(), AnyText()
                def reset(self, *, seed=None, options=None):
                    super().reset(seed=seed)
                    return "say hi", {}
                def step(self, action):
                    return "", float(action == "hi"), True, False, {}

            gymnasium.register(id="me/Echo-v0", entry_point=Echo)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    env = gymnasium.make("my_user_envs:me/Echo-v0")
    assert env.reset(seed=0)[0] == "say hi"
    assert env.step("hi")[1] == 1.0
    check_env(env.unwrapped, skip_render_check=True)


def _custom_env_example() -> str:
    """The python block between the custom-env markers: README.md when it has one, else docs."""
    pattern = re.compile(r"<!-- custom-env:start -->\s*```python\n(.*?)```\s*<!-- custom-env:end -->", re.S)
    for path in (ROOT / "README.md", ROOT / "docs" / "custom_env.md"):
        if path.exists():
            m = pattern.search(path.read_text())
            if m:
                return m.group(1)
    raise AssertionError("no custom-env example between the markers in README.md or docs/custom_env.md")


def test_custom_env_example_runs_and_passes_checker(capsys: pytest.CaptureFixture[str]) -> None:
    code = _custom_env_example()
    namespace: dict = {"__name__": "custom_env_example"}
    try:
        exec(compile(code, "custom_env_example", "exec"), namespace)  # noqa: S102 - our own documentation
        assert "1.0" in capsys.readouterr().out
        ids = [k for k in gymnasium.registry if k not in BUILTIN_ENVS and k.startswith("me/")]
        assert ids, "the example must register an id with gymnasium.register"
        for env_id in ids:
            env = gymnasium.make(env_id)
            check_env(env.unwrapped, skip_render_check=True)
    finally:
        for k in [k for k in gymnasium.registry if k.startswith("me/")]:
            del gymnasium.registry[k]
