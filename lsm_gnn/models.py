"""GNN models over the loader's sampled hops, built from PyG layers.

``model(batch)`` runs one layer per hop, outermost hop first: each layer maps
the features of a hop's nodes to its destination nodes (the previous hop's
nodes), ending at the seeds. PyG is imported lazily, so the rest of
lsm-gnn works without it.

Every layer keeps its PyG full-graph counterpart's self term, which a
sampled hop does not hold as an edge: destination ``i`` of a hop is source
``i`` (see :class:`~lsm_gnn.sampling.Hop`), so GAT attends to it through
self-loops ``i -> i`` (as ``GATConv(add_self_loops=True)`` does over the full
graph), SAGE adds it with its root weight, GCN aggregates it with the loop.
Over a hop holding every in-edge of its destinations, GAT and SAGE equal the
full-graph PyG layer; GCN does when the hop is the whole graph (it counts
degrees inside the hop, as DGL's GraphConv does on blocks).
"""
from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import nn

from lsm_gnn.config import ConfigError


class BlockGCNConv(nn.Module):
    """GCN over a sampled bipartite hop (PyG's GCNConv takes no bipartite input).

    Each destination node also aggregates itself (it is source ``i`` of the
    hop); messages are scaled by 1/sqrt(deg_src * deg_dst), the degrees
    counted inside the hop, as DGL's GraphConv(norm="both") does on blocks.
    """

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.lin = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim))

    def forward(self, x, edge_index, size, src_degree: torch.Tensor | None = None):
        """``src_degree``: the sources' degrees, loop included, counted elsewhere (the whole graph's, for
        layer-wise inference over hops of every in-edge); by default counted inside the hop."""
        x_src = x[0] if isinstance(x, tuple) else x
        num_src, num_dst = size
        # Loops already in the data are replaced by ours, so none counts twice (PyG's add_remaining_self_loops).
        edge_index = edge_index[:, edge_index[0] != edge_index[1]]
        loops = torch.arange(num_dst, device=edge_index.device)
        src = torch.cat([edge_index[0], loops])
        dst = torch.cat([edge_index[1], loops])
        ones = torch.ones(src.numel(), device=x_src.device)
        deg_src = (torch.zeros(num_src, device=x_src.device).index_add_(0, src, ones) if src_degree is None
                   else src_degree.to(x_src.device, torch.float32))
        deg_dst = torch.zeros(num_dst, device=x_src.device).index_add_(0, dst, ones)
        norm = (deg_src[src] * deg_dst[dst]).rsqrt()
        h = self.lin(x_src)
        out = torch.zeros(num_dst, h.shape[1], dtype=h.dtype, device=h.device)
        out.index_add_(0, dst, h[src] * norm.unsqueeze(1).to(h.dtype))
        return out + self.bias


MODEL_KINDS = ("gat", "sage", "gcn")


def _conv(kind: str, in_dim: int, out_dim: int, heads: int, last: bool):
    if kind == "gcn":
        return BlockGCNConv(in_dim, out_dim)
    import torch_geometric.nn as pyg

    if kind == "sage":
        return pyg.SAGEConv(in_dim, out_dim)
    if kind == "gat":
        # Hidden layers concatenate heads (out_dim = heads x per-head); the last averages them. Self-loops
        # i -> i over the (x_src, x_dst[:num_dst]) pair are each destination attending to itself.
        if last:
            return pyg.GATConv(in_dim, out_dim, heads=heads, concat=False, add_self_loops=True)
        if out_dim % heads:
            raise ValueError(f"GAT hidden size {out_dim} must be divisible by heads={heads}")
        return pyg.GATConv(in_dim, out_dim // heads, heads=heads, add_self_loops=True)
    raise ValueError(f"unknown model {kind!r}; valid names are {', '.join(MODEL_KINDS)}")


class LightGCN(nn.Module):
    """LightGCN (He et al., SIGIR 2020) over sampled hops: no weights and no nonlinearity; each layer is
    ``e_u <- sum over neighbours i of e_i / sqrt(d_u d_i)`` with ``d`` the nodes' degrees in the whole training
    graph, and a node's representation is the mean of its layers 0..K. Layer 0 is the nodes' trainable
    embeddings (``model.node_embedding``; with ``features`` also the dataset's features before them).

    Over a hop that holds ``c_u`` of u's ``d_u`` neighbours (a fanout below the degree, or the batch's own
    positive edges left out) the sum is scaled by ``d_u / c_u``, the unbiased estimate of the full sum; with
    every neighbour (fanouts -1) it is LightGCN's own propagation, restricted to what the seeds can reach."""

    def __init__(self, degree: torch.Tensor, num_layers: int):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        self.num_layers = num_layers
        self.register_buffer("degree", degree.float(), persistent=False)

    def forward(self, batch) -> torch.Tensor:
        if len(batch.hops) != self.num_layers:
            raise ValueError(f"the batch has {len(batch.hops)} hops but the model has {self.num_layers} layers; "
                             "use as many fanouts as layers")
        x = model_inputs(batch)
        degree = self.degree[batch.hops[-1].nodes.to(self.degree.device)].clamp(min=1)
        num_seeds = batch.hops[0].num_dst
        layers = [x[:num_seeds]]
        for hop in reversed(batch.hops):
            x = self.propagate(x, hop.edge_index, hop.num_dst, degree)
            layers.append(x[:num_seeds])  # the seeds lead every hop's node list
        return torch.stack(layers).mean(0)

    @staticmethod
    def propagate(x: torch.Tensor, edge_index: torch.Tensor, num_dst: int, degree: torch.Tensor) -> torch.Tensor:
        """One layer over one hop: ``out[u] = d_u / c_u * sum over the hop's edges i -> u of x[i] / sqrt(d_u d_i)``
        (``degree``: the hop's nodes', in their order; ``c_u``: u's edges in the hop). The edge weight
        ``1 / sqrt(d_u d_i)`` is split into a scale of the sources before the sum and of the destinations after
        it, so the sum itself is a product with the hop's unweighted adjacency."""
        src, dst = edge_index[0], edge_index[1]
        held = torch.bincount(dst, minlength=num_dst)
        sources = x * degree[:x.shape[0]].rsqrt().unsqueeze(1).to(x.dtype)
        scale = degree[:num_dst].sqrt() / held.clamp(min=1)
        return hop_sum(sources, src, dst, num_dst, held) * scale.unsqueeze(1).to(x.dtype)


def hop_sum(x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, num_dst: int,
            counts: torch.Tensor | None = None) -> torch.Tensor:
    """``out[d] = sum over the edges e with dst[e] == d of x[src[e]]`` (``[num_dst, x.shape[1]]``), differentiable
    in ``x``: the product of one hop's sparse ``num_dst x len(x)`` adjacency with ``x``. Several times faster than
    gathering a row per edge and adding them up (``index_add_``), backward included, on a hop with every
    neighbour (LightGCN's fanouts -1). ``counts``: each destination's edges, ``bincount(dst)``, if known."""
    if dst.numel() > 1 and not bool((dst[1:] >= dst[:-1]).all()):  # the sampler's order: by destination
        order = torch.sort(dst, stable=True).indices
        src, dst = src[order], dst[order]
    if counts is None:
        counts = torch.bincount(dst, minlength=num_dst)
    return _HopSum.apply(x, src, dst, counts)


# torch warns once per process, at the first CSR tensor, that they are "beta"; the two ops used here are long
# supported, so that one warning is spent here, silenced, rather than printed in a user's run.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state", category=UserWarning)
    torch.sparse_csr_tensor(torch.zeros(1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), torch.zeros(0),
                            (0, 0), check_invariants=False)


def _adjacency(counts: torch.Tensor, cols: torch.Tensor, num_cols: int, dtype: torch.dtype) -> torch.Tensor:
    """The sparse ``len(counts) x num_cols`` matrix (CSR) whose row r holds a 1 at each of the next ``counts[r]``
    entries of ``cols`` (repeats add up). Its indices are 32-bit where they fit: the product then runs about
    twice as fast as with 64-bit ones."""
    wide = max(cols.numel(), num_cols) >= 2 ** 31
    index = torch.int64 if wide else torch.int32
    crow = torch.zeros(counts.numel() + 1, dtype=index, device=counts.device)
    torch.cumsum(counts, 0, out=crow[1:])
    ones = torch.ones(cols.numel(), dtype=dtype, device=cols.device)
    return torch.sparse_csr_tensor(crow, cols.to(index), ones, (counts.numel(), num_cols), check_invariants=False)


class _HopSum(torch.autograd.Function):
    """:func:`hop_sum` with the edges sorted by destination. Its backward multiplies by the transposed adjacency,
    the edges sorted by source once (a radix sort of 32-bit ids where they fit), cheaper than torch's own
    backward of a CSR product; nothing is transposed when no gradient is asked for (evaluation)."""

    @staticmethod
    def forward(ctx, x, src, dst, counts):
        ctx.save_for_backward(src, dst)
        ctx.num_src, ctx.num_dst = x.shape[0], counts.numel()
        return _adjacency(counts, src, x.shape[0], x.dtype) @ x

    @staticmethod
    def backward(ctx, grad):
        src, dst = ctx.saved_tensors
        keys = src.int() if ctx.num_src < 2 ** 31 else src
        rows, order = torch.sort(keys, stable=True)
        transposed = _adjacency(torch.bincount(rows, minlength=ctx.num_src), dst[order], ctx.num_dst, grad.dtype)
        return transposed @ grad.contiguous(), None, None, None


def model_inputs(batch) -> torch.Tensor | dict[str, torch.Tensor]:
    """What a model reads for a batch's input nodes: their features, then their trainable embeddings
    (``batch.emb``: with ``model.node_embedding``, else None). Per node type on a typed batch, for the types
    with features or embeddings."""
    emb = getattr(batch, "emb", None)  # a batch made elsewhere (a benchmark's, a user's) may have none
    if not isinstance(batch.x, dict):
        return _features_then_embeddings(batch.x, emb)
    emb = emb or {}
    return {t: _features_then_embeddings(batch.x.get(t), emb.get(t)) for t in {**batch.x, **emb}}


def _features_then_embeddings(x: torch.Tensor | None, emb: torch.Tensor | None) -> torch.Tensor:
    if emb is None:
        return x.float()
    return emb if x is None or x.shape[1] == 0 else torch.cat([x.float(), emb], dim=1)


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
        x = model_inputs(batch)
        for i, hop in enumerate(reversed(batch.hops)):
            x = self.layer(i, x, hop.edge_index, (hop.num_src, hop.num_dst))
        return x

    def layer(self, i: int, x: torch.Tensor, edge_index: torch.Tensor, size: tuple[int, int], **kwargs):
        """Layer ``i`` over one hop: ``x`` holds the hop's sources, its first ``size[1]`` the destinations;
        ReLU and dropout follow every layer but the last. ``kwargs`` go to the conv
        (:mod:`lsm_gnn.tasks.inference` gives GCN the whole graph's degrees)."""
        x = self.convs[i]((x, x[:size[1]]), edge_index, size=size, **kwargs)
        if i < len(self.convs) - 1:
            x = nn.functional.dropout(torch.relu(x), self.dropout, self.training)
        return x


HETERO_MODEL_KINDS = ("sage", "gat")  # R-SAGE and R-GAT


def _relation_conv(kind: str, in_src: int, in_dst: int, out_dim: int, heads: int, last: bool):
    import torch_geometric.nn as pyg

    if kind == "sage":
        return pyg.SAGEConv((in_src, in_dst), out_dim)
    if kind == "gat":
        # No self-loops: across two node types there is no "self"; each type's own term is the layer's skip.
        if last:
            return pyg.GATConv((in_src, in_dst), out_dim, heads=heads, concat=False, add_self_loops=False)
        if out_dim % heads:
            raise ValueError(f"GAT hidden size {out_dim} must be divisible by heads={heads}")
        return pyg.GATConv((in_src, in_dst), out_dim // heads, heads=heads, add_self_loops=False)
    raise ValueError(f"unknown heterogeneous model {kind!r}; valid names are {', '.join(HETERO_MODEL_KINDS)}")


def _destination_messages(conv, x: dict, edges: dict, num_dst: dict) -> dict:
    """What ``conv(x, edges)`` (a PyG ``HeteroConv``, sum over relations) gives the hop's destinations, and
    nothing for the rows of the layer that are sources only: each relation's conv gets ``(x_src,
    x_dst[:num_dst])``. A whole layer's rows went through every relation's conv before, 4-6x the work on a
    real graph, most of it dropped after (issue 31)."""
    grouped: dict[str, list[torch.Tensor]] = {}
    for relation, relation_conv in conv.convs.items():  # HeteroConv's order, so the sums add alike
        if relation in edges:
            src, _, dst = relation
            grouped.setdefault(dst, []).append(relation_conv((x[src], x[dst][:num_dst[dst]]), edges[relation]))
    # HeteroConv's own sum: stacked, then reduced (the same arithmetic as before)
    return {t: ys[0] if len(ys) == 1 else torch.stack(ys).sum(0) for t, ys in grouped.items()}


class HeteroHopGNN(nn.Module):
    """R-SAGE / R-GAT over typed hops (:class:`~lsm_gnn.sampling.Hop` with dict fields): per hop one PyG ``HeteroConv``
    with a ``SAGEConv`` or ``GATConv`` per relation, summed per destination type, plus each type's own
    linear term (so a type no relation points to keeps a representation). A type's input is its features, then
    its node embeddings (``batch.emb``, with ``model.node_embedding``); types with neither start from a learned
    vector shared by their nodes (``in_dims[t] == 0``). Returns the logits of the target type's seeds.
    """

    #: a typed batch may lack a relation's edges, leaving its layer's parameters out of that loss (DDP must look)
    leaves_parameters_unused = True

    def __init__(self, kind: str, in_dims: dict[str, int], relations, target: str, hidden: int, out_dim: int,
                 num_layers: int, heads: int = 4, dropout: float = 0.0):
        super().__init__()
        import torch_geometric.nn as pyg

        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        if target not in in_dims:
            raise ValueError(f"target type {target!r} is not among the node types {sorted(in_dims)}")
        self.node_types, self.target, self.dropout = list(in_dims), target, dropout
        self.relations = [tuple(r) for r in relations]
        self.embedding = nn.ParameterDict({t: nn.Parameter(torch.randn(hidden) * 0.1)
                                           for t, d in in_dims.items() if d == 0})
        # Each layer computes only the types the next one reads (the last: the target), so every
        # parameter can take part in the loss (DDP requires it).
        outputs = [{target}]
        for _ in range(num_layers - 1):
            outputs.insert(0, outputs[0] | {r[0] for r in self.relations if r[2] in outputs[0]})
        dims = {t: (d if d else hidden) for t, d in in_dims.items()}
        self.outputs = [sorted(o, key=self.node_types.index) for o in outputs]
        self.convs, self.skips = nn.ModuleList(), nn.ModuleList()
        for layer, produced in enumerate(self.outputs):
            last = layer == num_layers - 1
            out = out_dim if last else hidden
            with warnings.catch_warnings():
                # PyG warns of types no relation of this layer points to: the skip term updates them.
                warnings.filterwarnings("ignore", message="There exist node types")
                self.convs.append(pyg.HeteroConv({r: _relation_conv(kind, dims[r[0]], dims[r[2]], out, heads, last)
                                                  for r in self.relations if r[2] in produced}, aggr="sum"))
            self.skips.append(nn.ModuleDict({t: nn.Linear(dims[t], out) for t in produced}))
            dims = {t: out for t in self.node_types}

    def forward(self, batch) -> torch.Tensor:
        if len(batch.hops) != len(self.convs):
            raise ValueError(f"the batch has {len(batch.hops)} hops but the model has {len(self.convs)} layers; "
                             "use as many fanouts as layers")
        nodes, inputs = batch.hops[-1].nodes, model_inputs(batch)
        x = {t: self.embedding[t].expand(nodes[t].numel(), -1) if t in self.embedding else inputs[t]
             for t in self.node_types}
        for i, (conv, skip, hop, produced) in enumerate(zip(self.convs, self.skips, reversed(batch.hops),
                                                            self.outputs)):
            edges = {r: e for r, e in hop.edge_index.items() if e.shape[1] and r[2] in produced}
            messages = _destination_messages(conv, x, edges, hop.num_dst)
            out = {}
            for t in produced:
                y = skip[t](x[t][:hop.num_dst[t]])
                if t in messages:
                    y = y + messages[t]
                out[t] = y if i == len(self.convs) - 1 else \
                    nn.functional.dropout(torch.relu(y), self.dropout, self.training)
            x = out
        return x[self.target]


# -- the model a run trains: the one place it is chosen by the graph -------------------------------------------

def build_model(cfg, dataset, features, task) -> torch.nn.Module:
    """The model of ``model.kind`` for the batches the loader makes: plain on a graph of one node type,
    per type on a graph of several."""
    m, layers = cfg.model, len(cfg.sampler.fanouts)
    if m.kind == "lightgcn":
        # (train.task=link takes a graph of one node type: make_task refuses others)
        if cfg.train.task != "link" or not m.node_embedding.dim:
            raise ConfigError("model.kind=lightgcn ranks items for users: it needs train.task=link and "
                              "model.node_embedding.dim (e.g. 64), on a user-item dataset")
        if m.node_embedding.features and dataset.feature_dim:
            raise ConfigError("model.kind=lightgcn has no weights to mix features with its embeddings: set "
                              "model.node_embedding.features=false")
        return LightGCN(torch.as_tensor(np.diff(np.asarray(dataset.indptr))), num_layers=layers)
    embedded = {t: source.dim for t, source in features.trainable.items()}  # node embeddings' widths
    if model_form(cfg, dataset) == "plain":
        in_dim = (dataset.feature_dim if m.node_embedding.features else 0) + sum(embedded.values())
        return HopGNN(m.kind, in_dim, m.hidden, task.out_dim, num_layers=layers,
                      heads=m.heads, dropout=m.dropout)
    dims = features.dims()
    return HeteroHopGNN(m.kind, {t: dims.get(t, 0) + embedded.get(t, 0) for t in dataset.node_types},
                        dataset.relations, dataset.target, m.hidden, task.out_dim, num_layers=layers, heads=m.heads,
                        dropout=m.dropout)


def model_form(cfg, dataset) -> str:
    """The form of the run's model on ``dataset``: ``plain`` on a graph of one node type and one relation (whose
    batches the loader hands over plain), else ``typed``. The one place the run's model is chosen by the graph:
    on a typed graph what has no typed form is refused (``train.task=link``, ``train.eval_mode=full``,
    ``model.node_embedding.features=false`` and a ``model.kind`` other than R-SAGE's and R-GAT's). The trainer and
    the planner call it before the task."""
    if dataset.is_homogeneous:
        return "plain"
    if cfg.train.task == "link":
        raise ConfigError(f"train.task=link needs a dataset of one node type (a user-item graph from lsm-gnn prepare "
                          f"interactions counts as one); {dataset.path} has {len(dataset.node_types)} node types: "
                          f"use train.task=node on it")
    if cfg.model.kind not in HETERO_MODEL_KINDS:
        raise ConfigError(f"model.kind={cfg.model.kind} has no heterogeneous form; use one of "
                          f"{', '.join(HETERO_MODEL_KINDS)} (R-SAGE, R-GAT)")
    if cfg.train.eval_mode == "full":
        raise ConfigError(f"train.eval_mode=full (layer-wise) supports one node type; {dataset.path} has "
                          f"several: use train.eval_mode=sampled")
    if not cfg.model.node_embedding.features:
        raise ConfigError("model.node_embedding.features=false takes a graph of one node type; on a heterogeneous "
                          "graph give the types to learn embeddings for (model.node_embedding.dim: every type "
                          "without features; model.node_embedding.<type>.dim: one type) and keep features=true")
    return "typed"
