"""The GPU paths beyond the cache's lookups (those: tests/test_device_path.py), each against the CPU run:
node embeddings written back through a cache on the device, and full-neighbourhood evaluation on the device.

Each test takes the device it checks: ``cuda`` (skipped without a GPU; benchmarks/gpu_suite.sh runs it on one)
and ``cpu`` with the Triton kernels under the interpreter (kernels=triton), which runs the test's logic on any
machine. Sizes are small: a few seconds each on a GPU, most of it Triton compiling each kernel once.
"""
import numpy as np
import pytest
import torch

pytest.importorskip("torch_geometric")
# PyTorch's own sparse optimizers say on every step that they skip sparse checks.
pytestmark = pytest.mark.filterwarnings("ignore:Sparse invariant checks")

from lsm_gnn.cache import SoftwareCache, WindowBuffer  # noqa: E402
from lsm_gnn.config import load_config  # noqa: E402
from lsm_gnn.embedding import RowLayout, RowOptimizer, open_table  # noqa: E402
from lsm_gnn.tasks.inference import layerwise_inference  # noqa: E402
from lsm_gnn.testing import power_law_trace  # noqa: E402
from lsm_gnn.training.trainer import Trainer  # noqa: E402
from test_device_path import HAVE_CUDA, kernels_of, needs_interpreter  # noqa: E402
from test_node_embedding import overrides, table_bytes, table_layout  # noqa: E402

# The graph fixture (conftest.py) generates this once per module.
GRAPH = dict(num_nodes=600, avg_degree=5, feature_dim=8, num_classes=3, seed=4)
# What a trainer on ``device`` is told: on cpu the Triton kernels (the trainer sets the mode from its config).
KERNELS = {"cuda": "kernels=native", "cpu": "kernels=triton"}
DEVICES = [pytest.param("cuda", marks=pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA GPU and triton")),
           pytest.param("cpu", id="cpu_triton", marks=needs_interpreter)]
# A trainer on the interpreter takes 10-20 s: those cpu variants are slow.
TRAINER_DEVICES = [DEVICES[0], pytest.param("cpu", id="cpu_triton", marks=[needs_interpreter, pytest.mark.slow])]


@pytest.mark.parametrize("pvp", [{}, dict(pvp=True, pvp_queue_capacity=16)], ids=["no_pvp", "pvp"])
@pytest.mark.parametrize("device", DEVICES)
def test_a_device_cache_writes_embeddings_back_byte_for_byte(tmp_path, device, pvp):
    """Lookups and SGD updates through a write-back cache on ``device``, evicting dirty lines (and with PVP
    parking them and dropping stale copies): every batch reads, and the flushed table holds, the bytes of a
    dense table updated alike. The gradients are multiples of 1/4 and the rate 1/8, so each update rounds once
    whatever the device's arithmetic: the bytes must be equal."""
    num_rows, dim = 400, 6
    layout = RowLayout(dim, "float32", "sgd")
    table = open_table(str(tmp_path / "table"), layout, num_rows, seed=1, init_std=0.5)
    dense = table.read(torch.arange(num_rows)).clone()
    optimizer = RowOptimizer(layout, 0.125)
    cache = SoftwareCache(table, 60 * table.row_bytes, ways=4, policy="hybrid", window=3, period=1, device=device,
                          **pvp)
    batches = power_law_trace(7, 10, 40, num_rows, 0.8)
    rng = np.random.default_rng(0)
    with kernels_of(device):
        for k, batch in enumerate(batches):
            window = WindowBuffer(4, num_rows)
            for future in batches[k + 1:k + 4]:
                window.push(future)
            rows, _ = cache.lookup(batch, future=window)
            assert torch.equal(rows.cpu(), dense[batch]), f"batch {k}: rows differ from the dense table"
            ids = torch.from_numpy(np.unique(batch))
            grads = torch.from_numpy(rng.integers(-8, 9, (ids.numel(), dim)).astype(np.float32) / 4)
            cache.update(ids, grads, lambda rows, g, step=k + 1: optimizer.step(rows, g, step))
            dense[ids] = optimizer.step(dense[ids], grads, k + 1)
            cache.prefetch()
        cache.settle()
        cache.flush()
    assert cache.stats.evictions > 0, "the cache must evict (dirty) lines for the test to mean something"
    assert torch.equal(table.read(torch.arange(num_rows)), dense), "the table differs from the dense one"
    table.close()


@pytest.mark.parametrize("device", TRAINER_DEVICES)
def test_training_node_embeddings_on_the_device_gives_the_cpu_table(graph, tmp_path, device):
    """``model.node_embedding`` trained a few steps with the caches on ``device``: the table the CPU run writes.
    On the CPU (kernels=triton) byte for byte; a GPU computes the model's gradients with other float rounding,
    so there the table matches to float tolerance."""
    short = ["train.max_iterations=4", "train.epochs=1", "sampler.batch_size=40", "cache.capacity=60%",
             "model.node_embedding.capacity=60%",
             "checkpoint.every=0", "train.eval_splits=[]"]
    with Trainer(load_config(None, overrides(graph, tmp_path / "cpu", *short, "train.device=cpu"))) as trainer:
        trainer.fit()
    with Trainer(load_config(None, overrides(graph, tmp_path / "dev", *short, f"train.device={device}",
                                             KERNELS[device]))) as trainer:  # its kernel mode while it runs
        trainer.fit()
    want, got = table_bytes(tmp_path / "cpu"), table_bytes(tmp_path / "dev")
    if device == "cpu":
        assert np.array_equal(got, want), "the table's bytes differ"
    else:  # the rows' values (embedding, then adagrad's state), not their raw bytes, to float tolerance
        layout = table_layout(tmp_path / "cpu")
        for name, g, w in zip(("embeddings", "optimizer state"), layout.split(torch.from_numpy(got)),
                              layout.split(torch.from_numpy(want))):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("device", TRAINER_DEVICES)
def test_full_neighbourhood_evaluation_on_the_device_equals_the_cpus(graph, device):
    """``train.eval_mode=full`` with the model and the feature cache on ``device``: the same logits (to float
    rounding on a GPU) and the same accuracy as on the CPU, for the same weights."""
    common = [f"dataset={graph}", "model.kind=sage", "model.hidden=8", "sampler.fanouts=[3,2]",
              "sampler.batch_size=50", "cache.capacity=60%", "log.progress=false", "train.eval_mode=full",
              "train.eval_batch_size=64"]
    with Trainer(load_config(None, [*common, "train.device=cpu"])) as cpu:
        with Trainer(load_config(None, [*common, f"train.device={device}", KERNELS[device]])) as dev:
            dev.module.load_state_dict(cpu.module.state_dict())
            seeds = dev.task.labeled("val")
            got = layerwise_inference(dev.module, dev.dataset, dev.features, seeds, chunk_size=64, read_rows=64,
                                      device=dev.device)
            got_eval = dev.evaluate("val")
        # dev's kernel mode ended with it: the CPU's reference runs on the default kernels
        want = layerwise_inference(cpu.module, cpu.dataset, cpu.features, seeds, chunk_size=64, read_rows=64)
        want_eval = cpu.evaluate("val")
    if device == "cpu":
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    top2 = want.topk(2, dim=1).values
    clear = top2[:, 0] - top2[:, 1] > 1e-3  # no near tie that float rounding could flip
    assert torch.equal(got.argmax(1)[clear], want.argmax(1)[clear]), "predictions differ"
    if bool(clear.all()):
        assert got_eval == want_eval
    assert want_eval["count"] == seeds.size > 0


@pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA GPU and triton")
def test_a_gpu_cache_over_pinned_host_memory_returns_the_bytes_on_disk(tmp_path):
    """``cache.backend=pinned`` on a GPU: the table page-locked in place and its rows gathered by the GPU over UVA,
    for each dtype and an odd row width, then a cache on the GPU over it (the direct miss path) against the
    reference model; a pageable table is refused, never copied (the CPU twins: tests/test_pinned_storage.py)."""
    from cache_oracle import check_against_reference, id_batches
    from lsm_gnn import open_storage
    from lsm_gnn.cache import PolicyConfig
    from lsm_gnn.kernels.row_gather import gather_rows
    from lsm_gnn.testing import write_tiny_dataset

    ids = torch.tensor([199, 0, 5, 5, 199, 42])
    for dtype, dim in (("float32", 13), ("float16", 7), ("uint8", 5)):
        dataset, features = write_tiny_dataset(tmp_path / dtype, num_nodes=200, dim=dim, dtype=dtype)
        features = torch.from_numpy(np.asarray(features))
        with open_storage(dataset, "pinned") as storage:
            assert storage.device.type == "cuda" and storage._rows.is_pinned()
            rows = storage.read(ids)
            assert rows.device == storage.device
            assert torch.equal(rows.cpu().view(torch.uint8), features[ids].view(torch.uint8)), dtype
    config = PolicyConfig("hybrid", window=2, period=1)
    with open_storage(dataset, "pinned") as storage, open_storage(dataset, "memory") as host:
        cache = SoftwareCache(storage, num_sets=8, ways=4, policy=config, device="cuda", read_ahead=0)
        assert cache.miss_path == "direct" and storage.device == cache.device
        reference = check_against_reference(cache, host, features, config, id_batches(seed=1))
        assert storage.stats().rows == cache.stats.misses == reference.stats.misses > 0
    out = torch.empty((1, 3), device="cuda")
    with pytest.raises(ValueError, match="only from page-locked host memory"):
        gather_rows(torch.zeros((4, 3)), torch.tensor([1], device="cuda"), out)
