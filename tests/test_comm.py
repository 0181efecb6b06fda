"""The communication layer over 2 and 4 CPU processes (gloo): exact bytes, one owner, shared beats isolated."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from lsm_gnn.cache import SoftwareCache, replay
from lsm_gnn.comm import hotness_owner, make_owner
from lsm_gnn.loader import NodeLoader
from lsm_gnn.sampling import sampled_access_counts
from lsm_gnn.testing import free_port, write_tiny_dataset

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "comm_worker.py")


def run_ranks(scenario, dataset, out, world, timeout=240, **extra_env):
    """Starts ``world`` worker processes as torchrun would; returns their exit codes and the seconds taken."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep +
                   os.environ.get("PYTHONPATH", ""), **extra_env)
        procs.append(subprocess.Popen([sys.executable, WORKER, scenario, dataset.path, str(out)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    start = time.monotonic()
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            p.kill()
    return [p.returncode for p in procs], logs, time.monotonic() - start


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    ds, _ = write_tiny_dataset(tmp_path_factory.mktemp("comm") / "ds", num_nodes=3000, dim=8, avg_degree=5)
    return ds


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory):
    """A third of ``dataset``'s nodes: a third of the batches, for the ranks that run the interpreter."""
    ds, _ = write_tiny_dataset(tmp_path_factory.mktemp("comm-small") / "ds", num_nodes=1000, dim=8, avg_degree=5)
    return ds


@pytest.mark.parametrize("world,kernels", [(2, "native"), (4, "native"), (2, "triton")])
@pytest.mark.slow
def test_every_rank_gets_the_file_bytes_and_each_id_is_served_once_by_its_owner(dataset, small_dataset, tmp_path,
                                                                                world, kernels):
    """With kernels=triton every rank's cache slice and sampler run the Triton kernels (interpreter)."""
    if kernels == "triton":
        pytest.importorskip("triton")
        dataset = small_dataset
    # One epoch of a smaller graph under the interpreter (two of the larger one took 3 minutes in CI, one took
    # 106 s); the native kernels run two.
    codes, logs, _ = run_ranks("correctness", dataset, tmp_path, world, timeout=600, LSM_GNN_KERNELS=kernels,
                               COMM_TEST_EPOCHS="1" if kernels == "triton" else "2")
    assert codes == [0] * world, "\n".join(logs)
    ranks = [np.load(tmp_path / f"rank{r}.npz", allow_pickle=True) for r in range(world)]
    iterations = len(ranks[0]["requested"])
    assert iterations > 0 and all(len(r["requested"]) == iterations for r in ranks)
    for t in range(iterations):
        wanted = np.unique(np.concatenate([r["requested"][t] for r in ranks]))
        served = np.concatenate([r["served"][t] for r in ranks])
        assert served.size == np.unique(served).size, f"iteration {t}: an id was served twice"
        assert np.array_equal(np.sort(served), wanted), f"iteration {t}: served ids differ from requested ones"
        for owner, r in enumerate(ranks):
            assert (r["served"][t] % world == owner).all(), f"iteration {t}: rank {owner} served ids it does not own"


def test_owners_apply_every_ranks_changes_and_write_them_back(dataset, tmp_path):
    """``SharedCache.update`` over 2 ranks: each row changes at its owner only, with the changes of every rank
    summed, and every later lookup sees them (the worker checks each against a dense table)."""
    codes, logs, _ = run_ranks("write_back", dataset, tmp_path, 2)
    assert codes == [0, 0], "\n".join(logs)


def single_cache_hit_ratio(dataset, world, lines):
    """One cache of ``lines`` lines fed every rank's batches of each iteration at once (same trace)."""
    from lsm_gnn import open_storage

    loaders = [NodeLoader(dataset, open_storage(dataset, "memory"), [4, 3], 64, window=8, rank=r, world_size=world,
                          seed=0) for r in range(world)]
    plans = [ld._epoch_plans(0) for ld in loaders]
    per_rank = [[np.unique(ld.sampler.input_nodes({"node": ld._plan_seeds(p[k])}, k)["node"].numpy())
                 for k in range(len(p))]
                for ld, p in zip(loaders, plans)]
    union = [np.unique(np.concatenate([r[k] for r in per_rank])) for k in range(len(per_rank[0]))]
    cache = SoftwareCache(open_storage(dataset, "memory"), num_sets=lines // 32, ways=32, policy="hybrid",
                          window=8, oversubscribe=True)
    hits = total = 0
    for k, (ids, window) in enumerate(replay(union, 8, dataset.num_nodes)):
        _, hit = cache.lookup(ids, future=window)
        hit_ids = set(ids[hit.numpy()].tolist())
        for r in per_rank:
            hits += sum(i in hit_ids for i in r[k].tolist())
            total += r[k].size
    return hits / total


def test_a_shared_cache_beats_isolated_ones_and_matches_one_big_cache(dataset, tmp_path):
    world = 2
    codes, logs, _ = run_ranks("hit_ratios", dataset, tmp_path, world)
    assert codes == [0] * world, "\n".join(logs)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    ratio = {mode: sum(r[mode][0] for r in results) / sum(r[mode][1] for r in results)
             for mode in ("shared", "isolated")}
    single = single_cache_hit_ratio(dataset, world, lines=world * 32 * 32)
    assert ratio["shared"] >= ratio["isolated"], ratio
    assert abs(ratio["shared"] - single) < 0.05, (ratio, single)


@pytest.mark.parametrize("exchange", ["shm", "collective"])
def test_the_exchange_returns_the_file_bytes_in_two_collectives(tmp_path, exchange):
    """Random and adversarial batches (one rank empty, all ids owned by one rank, duplicates), float16 and
    uint8 rows of odd widths: exactly the file's bytes, hit flags intact, 2 collectives per lookup with the
    rows sent as bytes of their dtype, or through shared memory with their places sent instead (3 only for a
    request longer than the agreed chunk), and through the loader on its background thread only."""
    rng = np.random.default_rng(0)
    f16, _ = write_tiny_dataset(tmp_path / "f16", num_nodes=500, dim=5, dtype="float16",
                                features=rng.standard_normal((500, 5)).astype(np.float16))
    u8, _ = write_tiny_dataset(tmp_path / "u8", num_nodes=400, dim=3, dtype="uint8",
                               features=rng.integers(0, 256, (400, 3), dtype=np.uint8))

    class Paths:
        path = f"{f16.path}{os.pathsep}{u8.path}"

    codes, logs, _ = run_ranks("protocol", Paths, tmp_path, 2, LSM_GNN_EXCHANGE=exchange)
    assert codes == [0, 0], "\n".join(logs)
    for rank in range(2):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for path in (f16.path, u8.path):
            assert report[path]["exchange"] == exchange
            assert report[path]["collectives"] == 2 * report[path]["lookups"]
            assert report[path]["by_kind"] == ["ids and future", "rows"]
            assert report[path]["spill"] == [3, 2]
        assert report["loader_threads"] == ["lsm-gnn-loader"]
        # 3 batches a rank: the first lookup's whole window (2 batches) fits the first chunk
        loader = report["loader"]
        assert loader["spills"] == 0 and loader["calls"] == 2 * loader["batches"] == 6, loader


@pytest.mark.parametrize("world,announce,exchange", [(2, False, "auto"), (3, False, "auto"), (2, True, "auto"),
                                                     (3, True, "auto"), (3, True, "collective")])
def test_every_owner_decides_as_a_single_process_reference_fed_the_union_would(dataset, tmp_path, world, announce,
                                                                               exchange):
    """Small evicting slices with windows, random and adversarial batches (one rank empty, all ids owned by one
    rank, duplicates, all empty): each rank's hit flags equal a per-owner SoftwareCache's in one process, with
    2 collectives a lookup, also when each lookup's request was announced during the one before; the rows
    through shared memory (auto, on one host) and in the rows collective."""
    codes, logs, _ = run_ranks("reference", dataset, tmp_path, world, COMM_TEST_ANNOUNCE=str(int(announce)),
                               LSM_GNN_EXCHANGE=exchange)
    assert codes == [0] * world, "\n".join(logs)


def test_rows_through_shared_memory_are_those_of_the_rows_collective(dataset, tmp_path):
    """Both paths side by side over random, adversarial and growing batches with windows and ``following``:
    byte-identical rows (an isolated cache's) and hit flags; the segments grow, their files are unlinked once
    every rank mapped them and at close, and a rank that reads late still reads its own lookup's rows."""
    codes, logs, _ = run_ranks("shm_matches_collective", dataset, tmp_path, 2)
    assert codes == [0, 0], "\n".join(logs)


def test_a_reader_maps_a_segment_its_owner_has_already_dropped(dataset, tmp_path):
    """An owner whose last lookup made a new segment may drop its cache before a slower rank has mapped it:
    that rank opens the segment by a name of its own and still reads its rows; no file is left."""
    codes, logs, _ = run_ranks("owner_gone_before_reader_maps", dataset, tmp_path, 2)
    assert codes == [0, 0], "\n".join(logs)


def test_auto_falls_back_to_the_collective_without_a_shared_dev_shm(dataset, tmp_path):
    """Ranks that cannot read each other's files in /dev/shm, or too little free there: auto sends the rows in
    the collective; shm without a shared /dev/shm is refused on every rank with the reason, and so are ranks
    that ask for different exchanges."""
    codes, logs, _ = run_ranks("exchange_choice", dataset, tmp_path, 2)
    assert codes == [0, 0], "\n".join(logs)


def test_a_lookup_other_than_the_announced_one_is_refused(dataset, tmp_path):
    codes, logs, _ = run_ranks("announce_misuse", dataset, tmp_path, 2)
    assert codes == [0, 0], "\n".join(logs)


def test_a_dead_rank_makes_the_others_fail_fast(dataset, tmp_path):
    codes, logs, seconds = run_ranks("killed", dataset, tmp_path, 2, timeout=120)
    assert codes[1] == 3
    assert codes[0] == 0, logs[0]
    message = (tmp_path / "rank0.txt").read_text()
    assert "rank 0" in message and "failed" in message and "rank 1" in message
    assert seconds < 60
    from lsm_gnn.comm.shm import PREFIX, SHM_DIR

    for rank in range(2):  # the survivor unlinked its segments and those the dead rank left
        token = (tmp_path / f"token{rank}.txt").read_text()
        assert not [f for f in os.listdir(SHM_DIR) if f.startswith(f"{PREFIX}-{token}-")], rank


def test_hashed_ownership_spreads_ids_and_fills_every_set_of_each_owner(dataset):
    from lsm_gnn.cache.geometry import set_of

    odd = np.arange(1, 200_001, 2)  # hot ids in one residue class: modulo gives them all to one rank
    assert np.bincount(make_owner("modulo", dataset, 2)(odd), minlength=2).min() == 0
    owners = make_owner("hashed", dataset, 2)(odd)
    assert abs(np.bincount(owners, minlength=2)[0] / odd.size - 0.5) < 0.01
    assert np.array_equal(owners, make_owner("hashed", dataset, 2)(odd))  # the same on every rank
    for rank in range(2):  # independent of the set index: each owner's ids use all of its sets
        assert np.bincount(set_of(odd[owners == rank], 64), minlength=64).min() > 0.8 * odd.size / 128


def test_ownership_functions(dataset, tmp_path):
    ids = np.arange(dataset.num_nodes)
    assert np.array_equal(make_owner("modulo", dataset, 3)(ids), ids % 3)
    counts = (np.random.default_rng(0).pareto(1.5, dataset.num_nodes) * 100).astype(np.int64)
    balanced = hotness_owner(counts, 4)
    loads = balanced.loads(counts)
    modulo_loads = np.bincount(ids % 4, weights=counts, minlength=4)
    assert loads.max() - loads.mean() <= min(counts.max(), modulo_loads.max() - modulo_loads.mean())
    hot = make_owner("hotness", dataset, 2, access_counts=lambda: sampled_access_counts(dataset, [4, 3], 64))
    assert set(np.unique(hot(ids))) == {0, 1}
    path = tmp_path / "parts.npy"
    np.save(path, (ids // 1000).astype(np.int32))
    assert np.array_equal(make_owner(str(path), dataset, 3)(ids[:5]), [0, 0, 0, 0, 0])
    with pytest.raises(ValueError, match="another world size"):
        make_owner(str(path), dataset, 2)
    np.save(path, np.zeros(5, np.int32))
    with pytest.raises(ValueError, match="must be"):
        make_owner(str(path), dataset, 2)
    with pytest.raises(FileNotFoundError):
        make_owner(str(tmp_path / "missing.npy"), dataset, 2)
    with pytest.raises(ValueError, match="unknown ownership"):
        make_owner("metis", dataset, 2)


def test_shared_cache_needs_torch_distributed(dataset):
    from lsm_gnn import open_storage
    from lsm_gnn.comm import ModuloOwner, SharedCache

    if torch.distributed.is_initialized():
        pytest.skip("a process group is already up")
    cache = SoftwareCache(open_storage(dataset, "memory"), num_sets=4, ways=32)
    with pytest.raises(RuntimeError, match="torch.distributed"):
        SharedCache(cache, ModuloOwner(2))
