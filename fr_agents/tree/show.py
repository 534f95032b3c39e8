"""Text rendering of a stored tree (``fr-agents store show``)."""

from __future__ import annotations

from fr_agents.tree.store import TrajectoryTree


def _ids(tokens: list[int], max_tokens: int) -> str:
    head = " ".join(map(str, tokens[:max_tokens]))
    return head + (f" … (+{len(tokens) - max_tokens})" if len(tokens) > max_tokens else "")


def render(tree: TrajectoryTree, root: int | None = None, *, max_tokens: int = 12) -> str:
    """One line per node, indented by depth: id, token ids, versions, and leaf outcome."""
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
            text = (
                f"{'  ' * depth}#{node} [{len(seg)} tok, {pol} policy, {ver}] {_ids(v.token_ids, max_tokens)}"
            )
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
