"""The communication layer: one cache over the slices of all ranks (paper section 4.1)."""
from lsm_gnn.comm.collectives import ExchangeError, ExchangeStats
from lsm_gnn.comm.group import ProgressBoard, RankMismatchError, check_agreement, collective_timeout
from lsm_gnn.comm.ownership import HashedOwner, MapOwner, ModuloOwner, hotness_owner, make_owner
from lsm_gnn.comm.shared_cache import SharedCache

__all__ = ["ExchangeError", "ExchangeStats", "HashedOwner", "MapOwner", "ModuloOwner", "ProgressBoard",
           "RankMismatchError", "SharedCache", "check_agreement", "collective_timeout", "hotness_owner", "make_owner"]
