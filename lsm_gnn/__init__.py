"""lsm-gnn: GNN training with node features on SSD behind a shared software cache."""
from lsm_gnn.version import __version__  # noqa: F401

from lsm_gnn.kernels import use_interpreter_without_gpu  # noqa: E402

use_interpreter_without_gpu()  # before anything imports triton (lsm_gnn.kernels)

from lsm_gnn.data import Dataset, DatasetError, DatasetWriter, open_dataset  # noqa: E402
from lsm_gnn.features import Features  # noqa: E402
from lsm_gnn.storage import FeatureStorage, open_storage  # noqa: E402
from lsm_gnn.utils.units import parse_bytes  # noqa: E402

__all__ = ["Dataset", "DatasetError", "DatasetWriter", "FeatureStorage", "Features", "open_dataset", "open_storage",
           "parse_bytes", "__version__"]
