"""What a trainer settles before any work: its device, the model, the settings every rank must share, the node
embeddings, and the checks that refuse a model or a cache too small with the config key to change, before an
epoch of training rather than at the batch that fails."""
from __future__ import annotations

import contextlib
import os
from functools import partial

import torch

from lsm_gnn.build import build_features
from lsm_gnn.config import ConfigError
from lsm_gnn.features import NoFeatures, TypedFeatures
from lsm_gnn.tasks.options import eval_batch_size


def run_device(name: str) -> torch.device:
    """``train.device`` resolved: ``auto`` is CUDA where torch sees it; on CUDA one GPU per rank of a node."""
    if name == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    elif name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device=cuda but torch sees no CUDA device; use train.device=cpu")
    else:
        device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        # One GPU per rank on a node: the launcher's local rank picks it.
        local = os.environ.get("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
        device = torch.device("cuda", int(local) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    return device


def build_run_features(cfg, spec, dataset, device, task, world_size: int) -> TypedFeatures:
    """The feature path the config describes (``spec``, resolved): none (node embeddings only), or the features
    by node type behind their caches (sized by ``spec``)."""
    if not cfg.model.node_embedding.features:
        return TypedFeatures.one_type(NoFeatures(dataset.num_nodes))
    return build_features(spec, dataset, device, world_size=world_size, num_threads=cfg.sampler.num_threads,
                          **feature_sampling(cfg, task))


def feature_sampling(cfg, task) -> dict:
    """The batches :func:`~lsm_gnn.build.build_features` pre-samples to rank nodes for hotness ownership: the
    run's fanouts, batch size and seed."""
    return {"fanouts": task.fanouts, "batch_size": cfg.sampler.batch_size, "seed": cfg.train.seed}


def agreed_settings(cfg, dataset) -> dict:
    """What every rank must share: the config (less logging and thread counts, which are local) and
    the dataset's identity (its path may differ between hosts, its contents may not)."""
    settings = cfg.to_dict()
    settings.pop("log")
    settings["sampler"].pop("num_threads")
    settings["dataset"] = {"checksums": dataset.meta.get("checksums", {}), "num_nodes": dataset.num_nodes,
                           "num_edges": dataset.num_edges,
                           "feature_dims": {t: dataset.node_type(t).feature_dim for t in dataset.node_types}}
    return settings


def check_model_fits(cfg, features, task, device: torch.device) -> None:
    """A model too large for memory is refused with its key before it is allocated (the kernel would kill
    the process without a word). A lower bound: each layer's hidden x hidden weights (the first layer's
    input x hidden), with their gradients and Adam's two moments."""
    from lsm_gnn.utils.memcap import available_memory
    from lsm_gnn.utils.units import format_bytes

    m, layers = cfg.model, len(cfg.sampler.fanouts)
    widest_input = max(features.dims().values())
    weights = m.hidden * (widest_input + m.hidden * (layers - 1) + task.out_dim)
    need = 4 * weights * 4  # float32 weights, gradients, two Adam moments
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        free = available_memory()
    if free is not None and need > free:
        raise ConfigError(f"model.hidden={m.hidden} makes a model of at least {weights:,} weights, "
                          f"{format_bytes(need)} with their gradients and optimizer state, more than the "
                          f"{format_bytes(free)} of memory free on {device}; lower model.hidden")


def open_node_embeddings(cfg, spec, dataset, device, ranks, saved: dict | None, checkpoint_path: str | None) -> dict:
    """The run's trainable node embeddings, per node type (:func:`lsm_gnn.build.embedding_tables`; empty without):
    each table opened (made on a fresh start) at the generation ``saved`` (the checkpoint resumed from) recorded,
    behind the cache the config describes."""
    from lsm_gnn.build import build_node_embedding, embedding_tables
    from lsm_gnn.training.checkpointing import saved_embeddings

    tables = embedding_tables(cfg, dataset)
    states = saved_embeddings(saved, dataset)
    if saved is not None and set(states) != set(tables):
        had = f"node embeddings of {sorted(states)}" if states else "no node embeddings"
        raise ConfigError(f"{checkpoint_path} was trained with {had}, this config asks for "
                          f"{sorted(tables) or 'none'}; resume with the settings it was trained with (model."
                          "node_embedding), or start fresh with checkpoint.resume=false or another checkpoint.dir")
    opened: dict = {}
    try:
        for t in tables:
            state, path = states.get(t), None
            if state is not None and state.get("snapshot"):  # best.pt: the copy of the table made beside it
                path = os.path.join(os.path.dirname(os.path.abspath(checkpoint_path)), state["snapshot"])
            opened[t] = build_node_embedding(spec, cfg, dataset, t, device, rank=ranks.rank,
                                             world_size=ranks.world_size, state=state, path=path,
                                             barrier=ranks.barrier)
    except BaseException:
        for embedding in opened.values():
            embedding.close()
        raise
    return opened


def _sizing_batches(cfg, loader, task, features, world_size: int) -> list:
    """(stage, every rank's sampled input nodes): training batches, then each evaluation split's in the order
    evaluation reads them (its batch size is train.eval_batch_size)."""
    from lsm_gnn.sizing import batches_per_rank

    count = batches_per_rank(world_size)
    checks = [("training", [loader.sample_input_nodes(count, rank=r) for r in range(world_size)])]
    for split in cfg.train.eval_splits:
        per_rank = [task.eval_input_nodes(features, split, r, world_size, count) for r in range(world_size)]
        if all(nodes for nodes in per_rank):
            checks.append((f"evaluating on {split}", per_rank))
    return checks


def check_cache_size(cfg, spec, loader, task, features, embeddings: dict, world_size: int) -> list:
    """Samples a few batches (every rank's, so every rank decides alike) and raises a ConfigError naming
    a capacity with headroom when the largest would not fit: before any training, not at that batch (nor after
    an epoch of it, at an evaluation). Returns the training batches' fits."""
    from lsm_gnn.build import cache_label, embedding_cache_name
    from lsm_gnn.sizing import store_fits, too_small_message

    c = cfg.cache
    if spec.source != "cache" or c.oversubscribe:
        return []
    checks = _sizing_batches(cfg, loader, task, features, world_size)
    fits = []
    dataset = loader.dataset
    # each cache: how its fits are found from every rank's input nodes per node type, and its size
    caches = [(lambda batches: store_fits(features, batches, partial(cache_label, dataset)), spec.size)]
    for t, embedding in embeddings.items():
        caches.append((partial(_table_fits, embedding.source, t, embedding_cache_name(dataset, t)),
                       spec.embedding_sizes[t]))
    for fits_of, size in caches:
        for stage, batches in checks:
            found = fits_of(batches)
            tight = _tightest(found)
            if tight is not None and not tight.fits:
                loader.close()
                smaller = "" if stage == "training" else _eval_batch_fix(
                    cfg, task, stage.rpartition(" ")[2], tight, lambda ids: _tightest(fits_of(ids)),
                    features, world_size)
                raise ConfigError(("" if stage == "training" else f"{stage}: ")
                                  + too_small_message(tight, size.text, c.ways, size.key) + smaller)
            if stage == "training":
                fits += found
    return fits


def _table_fits(source, node_type: str, what: str, batches: list) -> list:
    """The fits of a node embedding table's cache: its type's ids of every rank's input nodes."""
    from lsm_gnn.sizing import cache_fits

    return cache_fits(source, [[nodes[node_type] for nodes in per_rank] for per_rank in batches], what)


def _tightest(fits: list):
    """The fit with the least room (lines over the largest batch), or None."""
    return min(fits, key=lambda f: f.lines / max(f.largest, 1), default=None)


def _eval_batch_fix(cfg, task, split: str, tight, fit_of, features, world_size: int, tries: int = 8) -> str:
    """``; or set train.eval_batch_size=N or less``: an evaluation batch size whose sampled batches of ``split`` fit
    (``fit_of``: every rank's sampled input nodes to the tightest fit), found in at most ``tries`` samplings:
    from the size in proportion to the room ``tight`` found, halved until one fits, then bisected towards the
    smallest that did not. Without one, lower it at all; "" where even batches of one seed do not fit."""
    import copy

    from lsm_gnn.sizing import batches_per_rank, smaller_batch
    from lsm_gnn.tasks import make_task

    now = eval_batch_size(cfg)
    trial = copy.deepcopy(cfg)

    def fits(size: int) -> bool:
        trial.train.eval_batch_size = size
        other = make_task(trial, task.dataset)
        count = batches_per_rank(world_size)
        fit = fit_of([other.eval_input_nodes(features, split, r, world_size, count) for r in range(world_size)])
        return fit is None or fit.fits

    good, bad, size = 0, now, min(smaller_batch(now, tight.lines, tight.largest), now - 1)
    for _ in range(tries):
        if size < 1 or size >= bad or size <= good:
            break
        if fits(size):
            good = size
            size = (good + bad) // 2 if bad - good > max(1, good // 10) else 0  # within 10%: close enough
        else:
            bad = size
            size = size // 2 if not good else (good + bad) // 2
    if good:
        return f"; or set train.eval_batch_size={good} or less (now {now})"
    return "" if bad == 1 else f"; or lower train.eval_batch_size (now {now}; {bad} still does not fit)"


@contextlib.contextmanager
def sized(cfg, spec, where: str, checked: bool):
    """A batch a cache refuses mid-run (sampling missed one as large) names the config key of that cache's size
    (``spec``'s :class:`~lsm_gnn.build.CacheSize` of that key) and the value to set, where ``checked``
    (:func:`check_cache_size` sized the config's caches; a cache the caller built: its own keywords apply)."""
    from lsm_gnn.cache import CacheTooSmall
    from lsm_gnn.sizing import config_fix

    try:
        yield
    except CacheTooSmall as exc:
        size = next((s for s in (spec.size, *spec.embedding_sizes.values()) if s.key == exc.key), None)
        if not checked or size is None:
            raise
        from lsm_gnn.sizing import smaller_batch

        now = eval_batch_size(cfg)
        smaller = f"; or set train.eval_batch_size={smaller_batch(now, exc.lines, exc.distinct)} or less (now {now})" \
            if where.startswith("evaluating") else ""
        raise ConfigError(f"{where}, a batch has {exc.distinct:,} distinct nodes but the cache holds "
                          f"{exc.lines:,} lines ({size.key}={size.text}); "
                          + config_fix(size.text, exc.lines, exc.distinct, spec.ways, size.key) + smaller) from exc
