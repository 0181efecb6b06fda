"""PyG adapters: a dataset's features and topology as ``torch_geometric``
``FeatureStore`` and ``GraphStore``.

Code written against PyG's remote-backend interface (``store[group, attr,
index]``, ``get_tensor``, PyG's loaders) then reads node features through
lsm-gnn's software cache or storage engine. Both stores are read-only: the
data is the dataset on disk.
"""
from __future__ import annotations

import numpy as np
import torch

try:
    from torch_geometric.data import EdgeAttr, FeatureStore, GraphStore, TensorAttr
    from torch_geometric.data.graph_store import EdgeLayout
except ImportError as exc:
    raise ImportError(f"lsm_gnn.integrations.pyg needs PyG ({exc}); install it with: "
                      "pip install 'torch_geometric>=2.4'") from exc

from lsm_gnn.utils.ids import as_id_tensor
from lsm_gnn.utils.units import format_bytes, parse_bytes

LABEL_BYTES = 8  # labels are int64


def _read_only(store) -> TypeError:
    return TypeError(f"{type(store).__name__} is read-only: it serves the dataset on disk. To change the data, "
                     "write a new dataset (lsm_gnn.DatasetWriter or 'lsm-gnn prepare') and open a store over it")


class LsmFeatureStore(FeatureStore):
    """Node attributes of ``dataset`` by node id: ``x`` (features) and ``y`` (labels, if the dataset has them).

    ``features`` is any :class:`~lsm_gnn.features.Features` (a storage, a
    :class:`~lsm_gnn.cache.SoftwareCache` whose rows come through the cache,
    one ``gather`` per read without a future window, or a shared cache). Feature rows keep the file's dtype
    unless ``dtype`` is given (e.g. ``torch.float32`` for models).

    ``index`` may be node ids (a tensor or list: PyG's own key check fails
    on numpy arrays), a slice, an int (one row, 1-D) or None (all nodes).
    A read whose result would exceed ``max_read_bytes`` (default 1 GiB)
    raises ValueError instead of pulling a whole SSD-sized file into RAM;
    read mini-batches or raise it.
    """

    def __init__(self, dataset, features, *, group_name=None, dtype: torch.dtype | None = None,
                 max_read_bytes="1G"):
        super().__init__()
        if (features.num_rows, features.dim) != (dataset.num_nodes, dataset.feature_dim):
            raise ValueError(f"features hold {features.num_rows} rows of dim {features.dim} but the dataset has "
                             f"{dataset.num_nodes} nodes of dim {dataset.feature_dim}; open them from the same dataset")
        self.dataset, self.features, self.group_name, self.dtype = dataset, features, group_name, dtype
        self.max_read_bytes = parse_bytes(max_read_bytes)
        self._row_bytes = {"x": features.row_bytes}
        if dataset.labels() is not None:
            self._row_bytes["y"] = LABEL_BYTES

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dataset={self.dataset.name!r}, attrs={list(self._row_bytes)})"

    def _name(self, attr: TensorAttr) -> str | None:
        """The attribute's name if this store holds it, else None."""
        if attr.group_name == self.group_name and attr.attr_name in self._row_bytes:
            return attr.attr_name
        return None

    def _ids(self, index, name: str) -> torch.Tensor:
        n = self.dataset.num_nodes
        if index is None:
            index = slice(None)
        ids = torch.arange(*index.indices(n)) if isinstance(index, slice) else as_id_tensor(index)
        size = ids.numel() * self._row_bytes[name]
        if size > self.max_read_bytes:
            raise ValueError(f"reading {ids.numel()} rows of '{name}' ({format_bytes(size)}) exceeds max_read_bytes="
                             f"{format_bytes(self.max_read_bytes)}; pass the node ids you need, read in chunks, or "
                             f"open the store with a larger max_read_bytes")
        return ids

    def _get_tensor(self, attr: TensorAttr) -> torch.Tensor:
        name = self._name(attr)
        if name is None:
            held = [(self.group_name, a) for a in self._row_bytes]
            raise KeyError(f"no tensor ({attr.group_name!r}, {attr.attr_name!r}) in {type(self).__name__}; it holds "
                           f"(group_name, attr_name) {held}")
        single = isinstance(attr.index, (int, np.integer))
        ids = self._ids(attr.index, name)
        if name == "y":
            # Fancy indexing a memory-mapped array reads only the rows asked for.
            out = torch.from_numpy(np.asarray(self.dataset.labels()[ids.numpy()], dtype=np.int64))
        else:
            out = self.features.gather(ids)[0]
            if self.dtype is not None:
                out = out.to(self.dtype)
        return out[0] if single else out

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...] | None:
        name = self._name(attr)
        if name is None:
            return None
        return (self.dataset.num_nodes, self.dataset.feature_dim) if name == "x" else (self.dataset.num_nodes,)

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        # Fresh objects: PyG's loaders set .index on the attrs they get back.
        return [TensorAttr(self.group_name, name) for name in self._row_bytes]

    def _put_tensor(self, tensor, attr: TensorAttr) -> bool:
        raise _read_only(self)

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        raise _read_only(self)


class LsmGraphStore(GraphStore):
    """The topology of ``dataset`` as one edge type (``edge_type``, default None).

    The dataset's CSR lists, for each node, the nodes it aggregates from, so
    it is PyG's CSC layout: ``colptr`` = ``indptr`` over destinations, ``row``
    = ``indices`` (sources). ``graph_store.coo()`` / ``.csr()`` convert it.
    The arrays are loaded into memory as int64 on first use.
    """

    def __init__(self, dataset, edge_type=None):
        super().__init__()
        self.dataset, self.edge_type = dataset, edge_type
        self._csc: tuple[torch.Tensor, torch.Tensor] | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dataset={self.dataset.name!r}, num_edges={self.dataset.num_edges})"

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        n = self.dataset.num_nodes
        return [EdgeAttr(self.edge_type, EdgeLayout.CSC, is_sorted=True, size=(n, n))]

    def _get_edge_index(self, edge_attr: EdgeAttr) -> tuple[torch.Tensor, torch.Tensor] | None:
        if edge_attr.edge_type != self.edge_type:
            return None
        if edge_attr.layout != EdgeLayout.CSC:
            raise KeyError(f"{type(self).__name__} stores edges in the CSC layout only; ask for layout='csc', or "
                           f"convert with graph_store.coo() / graph_store.csr()")
        if self._csc is None:
            # A copy, not the read-only memory map: a caller writing into it would crash the process.
            self._csc = (torch.from_numpy(np.array(self.dataset.indices, dtype=np.int64)),
                         torch.from_numpy(np.array(self.dataset.indptr, dtype=np.int64)))
        return self._csc

    def _put_edge_index(self, edge_index, edge_attr: EdgeAttr) -> bool:
        raise _read_only(self)

    def _remove_edge_index(self, edge_attr: EdgeAttr) -> bool:
        raise _read_only(self)
