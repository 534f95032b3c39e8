"""Text rendering of a stored tree (``fr-agents store show``).

By default each node shows its decoded text (``decode`` turns token ids into text; newlines are
shown as ``⏎`` so one node stays one line); without ``decode`` it shows the raw token ids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fr_agents.tree.store import TrajectoryTree

Decode = Callable[[Sequence[int]], str]


def _ids(tokens: list[int], max_tokens: int) -> str:
    head = " ".join(map(str, tokens[:max_tokens]))
    return head + (f" … (+{len(tokens) - max_tokens})" if len(tokens) > max_tokens else "")


def _text(tokens: list[int], decode: Decode, max_chars: int) -> str:
    text = decode(tokens).replace("\r", "").replace("\n", "⏎")
    if len(text) > max_chars:
        text = text[:max_chars] + f"… (+{len(text) - max_chars} chars)"
    return repr(text)[1:-1] if any(ch < " " for ch in text) else text


def render(
    tree: TrajectoryTree,
    root: int | None = None,
    *,
    max_tokens: int = 12,
    decode: Decode | None = None,
    max_chars: int = 160,
) -> str:
    """One line per node, indented by depth: id, sizes, versions, text (or ids), leaf outcome."""
    roots = tree.roots() if root is None else [root]
    leaves = set(tree.leaf_ids())
    lines: list[str] = []
    for r in roots:
        stack = [(r, 0)]
        while stack:
            node, depth = stack.pop()
            v = tree.node(node)
            seg = v.segment
            pol = int(seg.mask.sum())
            ver = f"v={seg.version}" if pol else "env"
            body = _ids(v.token_ids, max_tokens) if decode is None else _text(v.token_ids, decode, max_chars)
            text = f"{'  ' * depth}#{node} [{len(seg)} tok, {pol} policy, {ver}] {body}"
            if depth == 0:
                meta = tree.root_meta(node)
                text += f"  root{' ' + str(meta) if meta else ''}"
            if node in leaves:
                t = tree.trajectory(node)
                score = "" if t.partial_score is None else f" partial={t.partial_score:g}"
                text += f"  ← leaf {t.status} reward={t.reward:g}{score}"
            lines.append(text)
            stack.extend((c, depth + 1) for c in reversed(tree.children(node)))
    return "\n".join(lines)
