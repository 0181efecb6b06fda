"""Adapters to other GNN libraries. Each imports its library only when used,
so ``import lsm_gnn`` needs neither PyG nor DGL.

- :class:`LsmFeatureStore`, :class:`LsmGraphStore`: PyG ``FeatureStore`` /
  ``GraphStore`` over a dataset (:mod:`lsm_gnn.integrations.pyg`).
- :func:`to_dgl_blocks`: the loader's hops as DGL blocks (:mod:`lsm_gnn.integrations.dgl`).
"""
from __future__ import annotations

import importlib

# The one table of exported names and the submodule that defines each.
_EXPORTS = {"LsmFeatureStore": "pyg", "LsmGraphStore": "pyg", "to_dgl_blocks": "dgl"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
