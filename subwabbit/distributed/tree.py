"""The shape of the AllReduce tree: who is whose parent.

VW's AllReduce sums a vector up a binary tree and sends the result back
down. The tree is laid out *in order* over positions ``0 .. total - 1``: the
root of a range of ``n`` positions is the last position of the largest
complete subtree that fits on its left (``2**floor(log2(n)) - 1``), so that
every subtree is as deep as needed and no deeper (depth
``floor(log2(total)) + 1``). Each pass then moves the vector up and down
that depth.

A node with two children adds their vectors to its own in the order in
which their bytes arrive, so with three nodes or more the last bits of the
sums (and so of the weights) change from run to run: float addition is not
associative. A *chain* (:func:`chain_layout`), where every node has at most
one child, adds in one order only: the same shards then give the same
weights bit for bit, while the sums cross ``total - 1`` links instead of
about ``log2(total)``.

Pure arithmetic, no sockets: :mod:`subwabbit.distributed.rendezvous` places
the connected nodes on the positions.
"""

from typing import List, NamedTuple, Optional


class TreeLayout(NamedTuple):
    """A tree over positions ``0 .. total - 1``.

    :ivar parents: each position's parent position (``None`` for the root)
    :ivar kid_counts: how many children each position has (0, 1 or 2)
    :ivar root: the root's position
    """

    parents: List[Optional[int]]
    kid_counts: List[int]
    root: int


def tree_layout(total: int) -> TreeLayout:
    """Lay out a binary AllReduce tree over ``total`` positions.

    :param total: the number of nodes (at least 1)
    :returns: the parents, the child counts and the root
    :raises ValueError: for fewer than one node
    """
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
        raise ValueError(f"a tree needs at least one node, got {total!r}")
    parents: List[Optional[int]] = [None] * total
    kid_counts = [0] * total

    def place(first: int, count: int) -> int:
        """Lay out positions ``first .. first + count - 1``; return their root."""
        if count == 1:
            return first
        left_count = (1 << (count.bit_length() - 1)) - 1
        root = first + left_count
        kids = 0
        for start, size in ((first, left_count), (root + 1, count - left_count - 1)):
            if size:
                parents[place(start, size)] = root
                kids += 1
        kid_counts[root] = kids
        return root

    root = place(0, total)
    return TreeLayout(parents, kid_counts, root)


def chain_layout(total: int) -> TreeLayout:
    """Lay out a chain over ``total`` positions: each position's parent is the
    next one, the last is the root.

    :param total: the number of nodes (at least 1)
    :returns: the parents, the child counts and the root
    :raises ValueError: for fewer than one node
    """
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
        raise ValueError(f"a chain needs at least one node, got {total!r}")
    parents: List[Optional[int]] = [position + 1 for position in range(total - 1)] + [None]
    return TreeLayout(parents, [0] + [1] * (total - 1), total - 1)


def tree_depth(layout: TreeLayout) -> int:
    """The number of positions on the longest path from the root to a leaf."""
    depth = 0
    for position in range(len(layout.parents)):
        steps, current = 1, layout.parents[position]
        while current is not None:
            steps += 1
            current = layout.parents[current]
        depth = max(depth, steps)
    return depth
