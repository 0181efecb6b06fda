"""Trainable node embeddings kept on SSD: the table's row format and the row-wise sparse optimizers.

Only this package knows what a table row's bytes mean; storage and cache move them as opaque ``uint8`` rows.
"""
from lsm_gnn.embedding.rows import EMBEDDING_DTYPES, OPTIMIZERS, RowLayout, RowOptimizer, initial_rows

__all__ = ["EMBEDDING_DTYPES", "OPTIMIZERS", "RowLayout", "RowOptimizer", "initial_rows"]
