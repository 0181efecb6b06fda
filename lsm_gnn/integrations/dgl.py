"""DGL adapter: the loader's sampled hops as DGL blocks (message flow graphs).

DGL is imported on first use, so this module imports without it.
"""
from __future__ import annotations

import torch


def _import_dgl():
    try:
        import dgl
    except (ImportError, OSError) as exc:  # OSError: a DGL wheel whose native library does not load
        raise ImportError(f"lsm_gnn.integrations.dgl needs DGL, which could not be imported ({exc}); install it with: "
                          "pip install dgl==1.1.3 (DGL 2.x has no wheel for this torch)") from exc
    return dgl


def to_dgl_blocks(hops) -> list:
    """DGL blocks for a :class:`~lsm_gnn.loader.Batch` or a list of
    :class:`~lsm_gnn.sampling.Hop`, outermost hop first, as DGL models expect:
    ``blocks[0]`` takes the input features (``batch.x``), ``blocks[-1]`` ends
    at the seeds.

    ``blocks[i]`` is ``hops[-1 - i]``: its src nodes are ``hop.nodes``, its dst
    nodes ``hop.nodes[:hop.num_dst]`` (global ids in ``srcdata[dgl.NID]`` /
    ``dstdata[dgl.NID]``), and its edge e is column e of ``hop.edge_index``.
    Hence ``blocks[i].dstdata[dgl.NID]`` equals ``blocks[i + 1].srcdata[dgl.NID]``.
    """
    dgl = _import_dgl()
    blocks = []
    for hop in reversed(getattr(hops, "hops", hops)):
        src, dst = hop.edge_index
        block = dgl.create_block((src, dst), num_src_nodes=hop.num_src, num_dst_nodes=hop.num_dst,
                                 idtype=torch.int64, device=hop.edge_index.device)
        block.srcdata[dgl.NID] = hop.nodes
        block.dstdata[dgl.NID] = hop.nodes[:hop.num_dst]
        blocks.append(block)
    return blocks
