"""Full-neighbourhood (layer-wise) inference: every layer over every in-edge, for all nodes, in chunks.

Sampled evaluation sees ``sampler.fanouts`` neighbours per hop, so its
numbers differ from the full-graph ones papers report. Running the sampled
model over all neighbours at once would touch the whole multi-hop
neighbourhood of every batch; instead, as PyG's SAGE examples do with
``inference``, each layer is computed for all nodes before the next: layer
``l`` of a chunk of destination nodes reads layer ``l - 1``'s output of the
chunk and of all its in-neighbours. The first layer reads the features
through the same :class:`~lsm_gnn.features.Features` as training (a
storage, a cache, a shared cache), a bounded number of rows at a time, so
the features stay out of core; the outputs of one layer (``num_nodes x
hidden`` floats) are held in memory until the next is done.

With several ranks each computes every ``world_size``-th chunk of a layer
and the layer's rows are summed over ranks, so every rank ends with all of
them; the feature reads are padded to the same count on every rank (a
shared cache's gather is collective).
"""
from __future__ import annotations

import numpy as np
import torch

from lsm_gnn.loader import keyed_features
from lsm_gnn.sampling import Hop


def row_entries(indptr, indices, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(j, v)`` for every entry ``v`` of CSR row ``rows[j]``, in row order."""
    starts = np.asarray(indptr[rows], dtype=np.int64)
    lengths = np.asarray(indptr[rows + 1], dtype=np.int64) - starts
    local = np.repeat(np.arange(rows.size), lengths)
    positions = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths - starts, lengths)
    return local, np.asarray(indices[positions], dtype=np.int64)


def full_hop(indptr, indices, dst: np.ndarray) -> Hop:
    """The hop holding every in-edge of the distinct nodes ``dst`` (CSR row v lists v's in-neighbours, as the
    sampler reads it): ``nodes`` is ``dst`` followed by its other in-neighbours, as a sampled hop's."""
    local_dst, src = row_entries(indptr, indices, dst)
    order = np.argsort(dst, kind="stable")
    sorted_dst = dst[order]
    at = np.minimum(np.searchsorted(sorted_dst, src), dst.size - 1)
    inside = sorted_dst[at] == src
    extra, extra_local = np.unique(src[~inside], return_inverse=True)
    local_src = np.empty(src.size, dtype=np.int64)
    local_src[inside] = order[at[inside]]
    local_src[~inside] = dst.size + extra_local
    return Hop(nodes=torch.from_numpy(np.concatenate([dst, extra])), num_dst=int(dst.size),
               edge_index=torch.from_numpy(np.stack([local_src, local_dst])))


def source_degrees(indptr, indices, num_nodes: int, chunk: int = 1 << 24) -> torch.Tensor:
    """Each node's out-degree in the whole graph, self-loops left out, plus one (its own loop): what
    :class:`~lsm_gnn.models.BlockGCNConv` counts over a hop that is the whole graph."""
    degree = np.ones(num_nodes, dtype=np.int64)
    rows = np.arange(num_nodes)
    for first in range(0, num_nodes, chunk):  # the topology may be far larger than memory
        local, src = row_entries(indptr, indices, rows[first:first + chunk])
        degree += np.bincount(src[src != local + first], minlength=num_nodes)
    return torch.from_numpy(degree).float()


def _sum_over_ranks(t: torch.Tensor, world_size: int) -> torch.Tensor:
    if world_size > 1:
        import torch.distributed as dist

        dist.all_reduce(t)
    return t


def _max_over_ranks(value: int, world_size: int) -> int:
    if world_size == 1:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t)


@torch.no_grad()
def layerwise_inference(model, dataset, features, nodes, *, chunk_size: int = 1024, read_rows: int = 4096,
                        device=None, rank: int = 0, world_size: int = 1) -> torch.Tensor:
    """``model``'s output for ``nodes`` with every neighbour of every hop (see the module docstring).

    ``model`` is a :class:`~lsm_gnn.models.HopGNN` (its ``layer(i, ...)``);
    it is put in eval mode and restored. ``chunk_size`` destination nodes
    are computed at a time; ``features.gather`` is asked for at most
    ``read_rows`` rows at a time (a cache must hold that many lines).
    Returns ``(len(nodes), out_dim)`` float32 on the CPU, equal on every rank.
    """
    if chunk_size < 1 or read_rows < 1:
        raise ValueError(f"chunk_size and read_rows must be >= 1, got {chunk_size} and {read_rows}")
    from lsm_gnn.models import BlockGCNConv

    features = keyed_features(features, dataset.target).only  # a graph of one node type: its one source, by plain ids
    nodes = np.asarray(nodes, dtype=np.int64)
    indptr, indices, num_nodes = dataset.indptr, dataset.indices, dataset.num_nodes
    gcn = isinstance(model.convs[0], BlockGCNConv)
    src_degree = source_degrees(indptr, indices, num_nodes) if gcn else None
    was_training = model.training
    model.eval()
    try:
        h = None  # the previous layer's output for every node (None: read the features)
        num_layers = len(model.convs)
        for layer in range(num_layers):
            targets = nodes if layer == num_layers - 1 else np.arange(num_nodes)
            starts = range(0, targets.size, chunk_size)[rank::world_size]
            hops = [(s, full_hop(indptr, indices, targets[s:s + chunk_size])) for s in starts]
            if h is None:  # as many gathers on every rank (a shared cache's gather is collective): agreed first
                reads = sum(-(-hop.num_src // read_rows) for _, hop in hops)
                padding = _max_over_ranks(reads, world_size) - reads
            outputs = []
            for start, hop in hops:
                x = _read(features, hop.nodes, read_rows) if h is None else h[hop.nodes]
                kwargs = {} if src_degree is None else {"src_degree": src_degree[hop.nodes].to(device)}
                y = model.layer(layer, x.to(device).float(), hop.edge_index.to(device), (hop.num_src, hop.num_dst),
                                **kwargs)
                outputs.append((start, y.float().cpu()))
            if h is None:
                for _ in range(padding):
                    features.gather(torch.empty(0, dtype=torch.int64))
            width = _max_over_ranks(outputs[0][1].shape[1] if outputs else 0, world_size)  # a rank may have none
            out = torch.zeros(targets.size, width)
            for start, y in outputs:
                out[start:start + y.shape[0]] = y
            h = _sum_over_ranks(out, world_size)
        return h
    finally:
        model.train(was_training)


def _read(features, ids: torch.Tensor, read_rows: int) -> torch.Tensor:
    """The feature rows of ``ids`` (distinct), ``read_rows`` at a time."""
    parts = [features.gather(ids[i:i + read_rows])[0] for i in range(0, ids.numel(), read_rows)]
    return torch.cat(parts) if parts else torch.empty(0, features.dim)
