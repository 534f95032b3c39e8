"""One stable-seed hash for the whole project.

A seed that must be the same in every process and on every run (a scheduled episode's sampling
seed, a branch's request seeds, an evaluation sample's seed, a generated game's random stream) is
a hash of printable parts, never Python's ``hash()`` (which changes with ``PYTHONHASHSEED``)::

    >>> stable_seed("fr-eval", 0, "math", "t1", 3)            # the evaluator's 31-bit seeds
    737406049
    >>> stable_seed("episode", 0, 5, sep="/", bits=63)        # the trainer's schedule
    1550039684152772504

Each caller keeps the separator, width and digest it has always used, so every seed a run drew
before this module existed is drawn again exactly (``tests/test_seeding.py`` pins values):

=====================================  =======  =====  =========  =========
caller                                 sep      bits   algorithm  byteorder
=====================================  =======  =====  =========  =========
``fr_agents.eval.runner`` samples      ``\\x1f``  31     blake2b    little
``trainer.batches.derive_seed``       ``/``    63     blake2b    little
``fr_agents.policy.seeded`` branches   ``/``    63     blake2b    little
``envs.alfworld.generate`` games       ``|``    64     sha256     big
=====================================  =======  =====  =========  =========
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal


def stable_seed(
    *parts: Any,
    sep: str = "\x1f",
    bits: int = 31,
    algorithm: Literal["blake2b", "sha256"] = "blake2b",
    byteorder: Literal["little", "big"] = "little",
) -> int:
    """A ``bits``-bit seed from printable ``parts``, independent of ``PYTHONHASHSEED``.

    The parts are joined with ``sep`` (``str`` of each), hashed with ``algorithm`` to 8 bytes
    (blake2b's 8-byte digest, or the first 8 bytes of sha256), read as an unsigned integer in
    ``byteorder`` and masked to its low ``bits`` bits (at most 64).
    """
    if not 1 <= bits <= 64:
        raise ValueError(f"bits: expected 1..64, got {bits}")
    text = sep.join(map(str, parts)).encode()
    if algorithm == "blake2b":
        digest = hashlib.blake2b(text, digest_size=8).digest()
    elif algorithm == "sha256":
        digest = hashlib.sha256(text).digest()[:8]
    else:
        raise ValueError(f"algorithm: expected blake2b or sha256, got {algorithm!r}")
    return int.from_bytes(digest, byteorder) & ((1 << bits) - 1)
