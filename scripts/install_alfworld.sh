#!/usr/bin/env bash
# Install ALFWorld's text engine: alfworld + textworld + jericho (all --no-deps, their full dependency
# lists pull AI2-THOR, torch extras and a browser stack we do not need), Fast Downward for TextWorld's
# PDDL engine, and the small pure-Python dependencies they import.
#
# Wheels are built once into a cache (fast-downward-textworld compiles C++ for ~2.5 minutes, jericho
# compiles frotz) and installed from there afterwards. Idempotent: a second run with everything
# importable returns at once.
#
#   bash scripts/install_alfworld.sh            # uses ${FR_AGENTS_WHEELS:-~/.cache/fr_agents/wheels}
set -euo pipefail

PY=${PYTHON:-python3}
WHEELS=${FR_AGENTS_WHEELS:-$HOME/.cache/fr_agents/wheels}
SMALL_DEPS=(tqdm more_itertools "tatsu==5.8.3" hashids mementos termcolor prompt_toolkit wcwidth networkx)

if "$PY" -c "import alfworld, textworld, jericho, fast_downward, tatsu; from textworld.envs import PddlEnv; PddlEnv()" 2>/dev/null; then
  echo "alfworld: already installed"
  exit 0
fi

mkdir -p "$WHEELS"
have() { ls "$WHEELS"/"$1"-*.whl >/dev/null 2>&1; }

# 1. Wheels into the cache (only what is missing).
have fast_downward_textworld || "$PY" -m pip wheel --no-deps -w "$WHEELS" fast-downward-textworld
have jericho || "$PY" -m pip wheel --no-deps -w "$WHEELS" jericho
have alfworld || "$PY" -m pip download --no-deps -d "$WHEELS" alfworld
have textworld || "$PY" -m pip download --no-deps -d "$WHEELS" textworld
"$PY" -m pip wheel -q -w "$WHEELS" --find-links "$WHEELS" "${SMALL_DEPS[@]}"

# 2. Install from the cache only.
"$PY" -m pip install -q --no-index --find-links "$WHEELS" "${SMALL_DEPS[@]}"
"$PY" -m pip install -q --no-deps --no-index --find-links "$WHEELS" \
  alfworld textworld jericho fast-downward-textworld

"$PY" -c "from textworld.envs import PddlEnv; PddlEnv(); print('alfworld: ok')"
