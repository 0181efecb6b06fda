"""GNN models over the loader's sampled hops, built from PyG layers.

``model(batch)`` runs one layer per hop, outermost hop first: each layer maps
the features of a hop's nodes to its destination nodes (the previous hop's
nodes), ending at the seeds. PyG is imported lazily, so the rest of
lsm-gnn works without it.
"""
from __future__ import annotations

import torch
from torch import nn


def _conv(kind: str, in_dim: int, out_dim: int, heads: int, last: bool):
    import torch_geometric.nn as pyg

    if kind == "sage":
        return pyg.SAGEConv(in_dim, out_dim)
    if kind == "gat":
        # Hidden layers concatenate heads (out_dim = heads x per-head); the last averages them.
        if last:
            return pyg.GATConv(in_dim, out_dim, heads=heads, concat=False, add_self_loops=False)
        if out_dim % heads:
            raise ValueError(f"GAT hidden size {out_dim} must be divisible by heads={heads}")
        return pyg.GATConv(in_dim, out_dim // heads, heads=heads, add_self_loops=False)
    raise ValueError(f"unknown model {kind!r}; valid names are 'sage', 'gat'")


class HopGNN(nn.Module):
    """A stack of bipartite message-passing layers, one per sampled hop."""

    def __init__(self, kind: str, in_dim: int, hidden: int, out_dim: int, num_layers: int, heads: int = 4,
                 dropout: float = 0.0):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.convs = nn.ModuleList(_conv(kind, dims[i], dims[i + 1], heads, i == num_layers - 1)
                                   for i in range(num_layers))
        self.dropout = dropout

    def forward(self, batch) -> torch.Tensor:
        if len(batch.hops) != len(self.convs):
            raise ValueError(f"the batch has {len(batch.hops)} hops but the model has {len(self.convs)} layers; "
                             "use as many fanouts as layers")
        x = batch.x.float()
        for i, (conv, hop) in enumerate(zip(self.convs, reversed(batch.hops))):
            x = conv((x, x[:hop.num_dst]), hop.edge_index, size=(hop.num_src, hop.num_dst))
            if i < len(self.convs) - 1:
                x = nn.functional.dropout(torch.relu(x), self.dropout, self.training)
        return x
