"""Key paths of pytrees as plain names (one home for the weight-decay mask and checkpoint checks)."""

from __future__ import annotations


def path_names(path: tuple) -> tuple[str, ...]:
    """A `jax.tree_util` key path as plain names (dict key, attribute name or index), so paths of
    different container types (a saved list, a target tuple) compare equal."""
    names = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                names.append(str(getattr(key, attr)))
                break
        else:
            names.append(str(key))
    return tuple(names)
