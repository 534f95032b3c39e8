"""``fr-agents view``: a local web page over a run directory or a trajectory store.

* :mod:`fr_agents.view.layout`  what PATH is (run directory or bare store), its tokenizer (the run
                                directory's file names and ledger queries: :mod:`fr_agents.run_layout`)
* :mod:`fr_agents.view.reader`  read-only queries over the store (root list, tree chunks, nodes, compare)
* :mod:`fr_agents.view.shape`   one root's subtree structure (parents, offsets, leaves, demo spans)
* :mod:`fr_agents.view.decode`  token ids -> text runs of one kind (policy / env / demo), per-token pieces
* :mod:`fr_agents.view.run`     metrics curves, config and checkpoints of a run
* :mod:`fr_agents.view.server`  the HTTP server (standard library) and the JSON API
* ``static/``                   the page itself: HTML, CSS, vanilla JavaScript, inline SVG charts
"""

from __future__ import annotations

from fr_agents.view.server import make_server, serve

__all__ = ["make_server", "serve"]
