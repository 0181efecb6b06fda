"""The schema-2 format: several node types and typed relations, as IGBH and MAG240M have.

Layout (every name is recorded in ``meta.json``; these are the defaults)::

    meta.json                                    schema 2: node types, relations, target type
    nodes/<type>/features.bin                    the type's feature rows, as in schema 1 (fixed
                                                 stride, small rows packed per 512-byte block,
                                                 page padded); optional
    nodes/<type>/labels.npy                      int64 class per node, -1 unlabeled (optional)
    nodes/<type>/{train,val,test}_idx.npy        int64 node ids of that type (optional)
    nodes/<type>/scores/<name>.npy               float32 static score per node (optional)
    relations/<src>__<name>__<dst>/indptr.npy    the relation's CSR: row v (a ``dst`` node) lists
    relations/<src>__<name>__<dst>/indices.npy   the ``src`` nodes v aggregates from

Node ids are local to their type, ``[0, num_nodes[type])``. A relation
``(src, name, dst)`` follows PyG's edge-type convention: messages flow from
``src`` nodes to ``dst`` nodes. Feature dims and dtypes may differ between
types, and a type may have no features. Labels and splits may live on any
type; ``target`` names the type a trainer classifies by default.

The global id space puts the types one after another in ``node_types``
order (:attr:`Dataset.offsets <lsm_gnn.data.dataset.Dataset>`); the cache
and the communication layer key rows by it. Both schemas open as the one
:class:`~lsm_gnn.data.dataset.Dataset`; a schema-1 dataset is the case of
one node type and one relation.
"""
from __future__ import annotations

# Both schemas are checked by one typed core in lsm_gnn.data.format (schema 1: one type, one relation).
from lsm_gnn.data.format import check_name, check_schema2

__all__ = ["check_name", "check_schema2"]
