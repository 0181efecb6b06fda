"""Trainable node embeddings kept on SSD: the table's row format, the row-wise sparse optimizers, and
:class:`NodeEmbedding`, which reads and updates them through the feature path.

Only this package knows what a table row's bytes mean; storage and cache move them as opaque ``uint8`` rows.
"""
from lsm_gnn.embedding.node_embedding import NodeEmbedding, open_table
from lsm_gnn.embedding.rows import EMBEDDING_DTYPES, OPTIMIZERS, RowLayout, RowOptimizer, initial_rows

__all__ = ["EMBEDDING_DTYPES", "OPTIMIZERS", "NodeEmbedding", "RowLayout", "RowOptimizer", "initial_rows",
           "open_table"]
