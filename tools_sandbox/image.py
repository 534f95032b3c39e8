"""Build the Docker sandbox image offline: ``debootstrap`` a minimal Debian, then ``docker import`` it.

No registry is needed (or reachable from many training machines): the root file system comes from a
Debian mirror through ``debootstrap --variant=minbase``, with ``python3``, ``git`` and ``pytest`` (for
repository tasks), and is imported as an image with ``tar -c | docker import -``.

Everything is cached by a content hash of the *recipe* (suite, variant, packages, post-processing
version), so a second ``fr-agents sandbox build-image`` is a no-op that only checks the image is there:

* ``~/.cache/fr_agents/sandbox/rootfs-<hash>/`` holds the debootstrapped tree (kept so a re-import,
  e.g. after ``docker system prune``, needs no download);
* the image is tagged ``fr-agents-sandbox:<hash>``.

Set ``FR_AGENTS_CACHE`` to move the cache directory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

IMAGE_REPO = "fr-agents-sandbox"
# Bump when the post-processing below changes, so cached images are rebuilt.
_RECIPE_VERSION = 1


@dataclass(frozen=True)
class ImageRecipe:
    """What goes into the sandbox image. Its :meth:`digest` names both the rootfs dir and the tag."""

    suite: str = "bookworm"
    variant: str = "minbase"
    include: tuple[str, ...] = ("python3", "git", "python3-pytest")
    mirror: str = "http://deb.debian.org/debian"
    version: int = field(default=_RECIPE_VERSION)

    def digest(self) -> str:
        """A 12-hex content hash of everything that changes the image (the mirror does not)."""
        fields = asdict(self)
        fields.pop("mirror")
        blob = json.dumps(fields, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    @property
    def tag(self) -> str:
        return f"{IMAGE_REPO}:{self.digest()}"


DEFAULT_RECIPE = ImageRecipe()


def cache_dir() -> Path:
    """``$FR_AGENTS_CACHE`` or ``~/.cache/fr_agents``: where the sandbox rootfs is kept."""
    root = os.environ.get("FR_AGENTS_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "fr_agents")
    return Path(root) / "sandbox"


def default_image() -> str:
    """The tag the Docker backend runs: the default recipe's ``fr-agents-sandbox:<hash>``."""
    return os.environ.get("FR_AGENTS_SANDBOX_IMAGE") or DEFAULT_RECIPE.tag


def rootfs_dir(recipe: ImageRecipe = DEFAULT_RECIPE) -> Path:
    return cache_dir() / f"rootfs-{recipe.digest()}"


def _check_docker() -> None:
    if shutil.which("docker") is None:
        raise RuntimeError(
            "the docker CLI is not installed (apt-get install -y docker.io), or use --rootfs-only"
        )
    out = subprocess.run(
        ["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, timeout=60
    )
    if out.returncode != 0:
        raise RuntimeError(
            "no Docker daemon answers: run `bash scripts/start_dockerd.sh` (or use --rootfs-only)"
        )


def image_exists(tag: str) -> bool:
    """True when the Docker daemon has an image called ``tag``."""
    out = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, timeout=60)
    return out.returncode == 0


def _debootstrap(recipe: ImageRecipe, dest: Path) -> None:
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap is not installed: apt-get install -y debootstrap")
    if os.geteuid() != 0:
        raise RuntimeError("building the sandbox image needs root (debootstrap creates device nodes)")
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        "debootstrap",
        f"--variant={recipe.variant}",
        f"--include={','.join(recipe.include)}",
        recipe.suite,
        str(partial),
        recipe.mirror,
    ]
    log.info("debootstrap: %s (a few minutes on first build)", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        raise RuntimeError(f"debootstrap failed (exit {proc.returncode}):\n{tail}")
    # Post-processing (covered by _RECIPE_VERSION): drop package caches, add the work directory.
    for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for p in (partial / sub).glob("*"):
            if p.is_file():
                p.unlink()
    (partial / "work").mkdir(mode=0o1777, exist_ok=True)
    os.chmod(partial / "work", 0o1777)
    partial.rename(dest)


def _docker_import(src: Path, tag: str) -> None:
    log.info("docker import %s -> %s", src, tag)
    tar = subprocess.Popen(["tar", "-C", str(src), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
    imp = subprocess.run(["docker", "import", "-", tag], stdin=tar.stdout, capture_output=True, text=True)
    assert tar.stdout is not None
    tar.stdout.close()
    tar_rc = tar.wait()
    if tar_rc != 0 or imp.returncode != 0:
        raise RuntimeError(f"docker import failed (tar exit {tar_rc}): {imp.stderr.strip()}")


def build_image(recipe: ImageRecipe = DEFAULT_RECIPE, *, force: bool = False, docker: bool = True) -> str:
    """Make sure ``recipe``'s rootfs (and, with ``docker``, its image) exist; return the image tag.

    Fast and idempotent when cached. ``force`` rebuilds the rootfs from scratch and re-imports.
    """
    dest = rootfs_dir(recipe)
    if docker:
        _check_docker()
    if force:
        shutil.rmtree(dest, ignore_errors=True)
    if docker and not force and image_exists(recipe.tag):
        log.info("sandbox image %s is cached", recipe.tag)
        return recipe.tag
    if not (dest / "usr" / "bin" / "python3").exists():
        _debootstrap(recipe, dest)
    if docker:
        _docker_import(dest, recipe.tag)
    return recipe.tag
