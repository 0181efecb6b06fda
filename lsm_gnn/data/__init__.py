"""Datasets on disk: the format, the atomic writer, converters, the synthetic generator, static scores."""
from lsm_gnn.data.dataset import Dataset, NodeType
from lsm_gnn.data.format import DatasetError
from lsm_gnn.data.opening import open_dataset
from lsm_gnn.data.hetero_writer import HeteroDatasetWriter
from lsm_gnn.data.interactions import from_interactions
from lsm_gnn.data.writer import DatasetWriter

__all__ = ["Dataset", "DatasetError", "DatasetWriter", "HeteroDatasetWriter", "NodeType", "from_interactions",
           "open_dataset"]
