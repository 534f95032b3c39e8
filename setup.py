"""Which packages the wheel holds (everything else is in pyproject.toml).

The YAML presets live in one folder at the top of the repository, ``configs/``, and ship inside the
wheel as the package data ``fr_agents/configs/*.yaml``: ``package_dir`` maps that folder onto the
package ``fr_agents.configs``, so an installed ``fr-agents`` trains from any directory without a
checkout, and a checkout has a single copy of each preset.
"""

from setuptools import find_namespace_packages, setup

setup(
    packages=[
        *find_namespace_packages(
            include=["fr_agents*", "envs*", "tools_sandbox*", "trainer*"], exclude=["*__pycache__"]
        ),
        "fr_agents.configs",
    ],
    package_dir={"fr_agents.configs": "configs"},
    package_data={
        "": ["*.txt", "*.json", "*.jinja", "*.py.txt"],
        "fr_agents.configs": ["*.yaml"],
        "fr_agents.view": ["static/*.html", "static/*.js", "static/*.css"],
    },
)
