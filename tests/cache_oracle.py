"""A cache over some storage, checked batch by batch against the reference model and the bytes on disk: the
shared check of the miss-path tests (tests/test_gds_cache.py: a cache over gds; tests/test_pinned_storage.py: a
device-mode cache over pinned host memory)."""
from __future__ import annotations

import numpy as np
import torch

from lsm_gnn.cache import ReferenceCache


def id_batches(seed: int, below: int = 150) -> list[torch.Tensor]:
    """Random batches (ids below ``below``), then the adversarial ones: repeats out of order, all misses, empty."""
    rng = np.random.default_rng(seed)
    batches = [rng.integers(0, below, 24) for _ in range(6)]
    batches += [np.array([7, 7, 3, below - 1, 3, 0, 7]),  # repeats, out of order, both ends of the ids asked for
                np.arange(below, below + 24)[::-1],  # all misses: none of these ids was asked for yet
                np.array([], dtype=np.int64)]
    return [torch.from_numpy(np.ascontiguousarray(b, dtype=np.int64)) for b in batches]


def all_hits(cache, ids: torch.Tensor) -> torch.Tensor:
    """Those of ``ids`` the cache holds now, in reverse order and repeated: a batch of hits only."""
    held = ids[cache.lines_of(ids) >= 0].flip(0)
    return torch.cat([held, held[:3]])


def check_against_reference(cache, reference_storage, features: torch.Tensor, config, batches) -> ReferenceCache:
    """Looks ``batches`` up in ``cache`` (an all-hit batch made between the last two, as its turn comes) and in a
    reference model over ``reference_storage`` with the cache's geometry and ``config``: every batch's rows must be
    ``features[ids]`` and the reference's, its hits the reference's; the all-miss, all-hit and empty batches must
    be what they say. Returns the reference (its stats to compare)."""
    reference = ReferenceCache(reference_storage, cache.num_sets, cache.ways, config)
    batches = list(batches)
    batches.insert(-1, None)  # between the all-miss batch and the empty one: made when its turn comes
    hits = []
    for t in range(len(batches)):
        if batches[t] is None:
            batches[t] = all_hits(cache, batches[t - 1])
        ids, future = batches[t], [b for b in batches[t + 1:t + 3] if b is not None]
        rows, hit = cache.lookup(ids, future=future)
        ref_rows, ref_hit = reference.lookup(ids, future=future)
        rows, hit = rows.cpu(), hit.cpu()
        assert torch.equal(rows, features[ids]), f"batch {t}: not the bytes on disk"
        assert torch.equal(rows, ref_rows) and torch.equal(hit, ref_hit), f"batch {t}: not the reference's"
        hits.append(hit)
    all_miss, all_hit, empty = hits[-3:]
    assert not all_miss.any() and all_hit.all() and all_hit.numel() > 3 and empty.numel() == 0
    return reference
