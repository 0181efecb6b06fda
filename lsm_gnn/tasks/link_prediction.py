"""Link prediction for recommendation: user-item edge batches, BPR loss, recall@k.

A user-item dataset (see ``docs/dataset_format.md``) has users at nodes
``[0, num_users)`` and items after them; its CSR holds the training
interactions in both directions and ``dataset.edge_split("test")`` the
held-out ``(user, item)`` pairs. :class:`LinkLoader` walks the training
edges in shuffled batches, each with uniformly drawn negative items, and
samples hops around the batch's distinct nodes through the same cache as
node classification; a model embeds those nodes and :func:`bpr_loss` ranks
each positive above its negatives. :func:`recall_at_k` embeds users and
items through the same sampled-hop path and ranks every item for each user.
See ``docs/link_prediction.md``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lsm_gnn.data.format import DatasetError
from lsm_gnn.tasks.inference import row_entries
from lsm_gnn.loader import Batch, NodeLoader
from lsm_gnn.comm.distributed import all_reduce_sum, batch_to
from lsm_gnn.sampling import Hop
from lsm_gnn.tasks.options import eval_batch_size, eval_fanouts, loader_options, relation_fanouts

SCORE_CHUNK = 1 << 24  # user x item scores held at once in recall_at_k (64 MiB of float32)


def user_item_sizes(dataset) -> tuple[int, int]:
    """``(num_users, num_items)`` of a user-item dataset; a clear error for any other."""
    if dataset.num_users is None:
        raise DatasetError(f"{dataset.path}: not a user-item dataset (meta.json has no num_users / num_items). "
                           "Link prediction needs users at nodes [0, num_users) and items after them: generate one "
                           "with lsm_gnn.data.bipartite.generate_bipartite, or write one with "
                           "DatasetWriter.set_bipartite() and write_edge_split()")
    return int(dataset.num_users), int(dataset.num_items)


@dataclass(kw_only=True)
class LinkBatch(Batch):
    """A batch of training edges (a :class:`~lsm_gnn.loader.Batch` without labels, ``y`` is None).
    ``model(batch)`` embeds ``seeds`` (= ``hops[0].nodes[:len(seeds)]``, sorted, distinct); edge
    ``j`` is ``(seeds[user[j]], seeds[pos[j]])`` and its negatives are ``seeds[neg[j]]``."""

    user: torch.Tensor  # (B,) int64 index into seeds
    pos: torch.Tensor   # (B,) int64 index into seeds
    neg: torch.Tensor   # (B, num_negatives) int64 index into seeds


@dataclass
class _Plan:
    """A batch before sampling: CSR positions of its training edges (user rows come first, so
    position p is the edge (user owning p, indices[p])); resolved lazily in the loader's thread."""

    epoch: int
    index: int
    positions: np.ndarray
    resolved: tuple | None = None


class LinkLoader(NodeLoader):
    """Iterates batches of ``batch_size`` training (user, item) edges with ``num_negatives`` negative items each.

    One epoch visits every training edge once (the user rows of the CSR),
    in an order shuffled with ``(seed, epoch)``; negatives are uniform over
    all items, drawn with ``(seed, epoch, batch)``, so a batch is the same
    on resume (:meth:`state_dict`). A negative may, rarely, be one of the
    user's training items (probability ``degree / num_items``), as in most
    BPR implementations; ``negatives_exclude_positives=True`` draws each
    negative uniformly from the items the user has no training edge with
    instead (LightGCN's sampler redraws such hits, which amounts to the
    same). ``options`` are :class:`NodeLoader`'s (``shuffle``,
    ``drop_last``, ``window``, ``prefetch``, ``seed``, ``rank``,
    ``world_size``, ``num_threads``); with ``world_size > 1`` each rank gets
    an equal share of the edges.

    ``exclude_positives`` (default) removes each batch's own training edges,
    both directions, from its sampled hops. Otherwise a model learns to find
    the positive among the user's neighbours (matching its exact features),
    which scores training edges well and held-out ones, never neighbours,
    badly: DGL's ``exclude="reverse_id"`` guards against the same leak.
    """

    def __init__(self, dataset, features, fanouts, batch_size: int, *, num_negatives: int = 1,
                 exclude_positives: bool = True, negatives_exclude_positives: bool = False, **options):
        num_users, num_items = user_item_sizes(dataset)
        if num_negatives < 1:
            raise ValueError(f"num_negatives must be >= 1, got {num_negatives}")
        user_indptr = np.array(dataset.indptr[:num_users + 1], dtype=np.int64)
        num_train = int(user_indptr[-1])
        if num_train == 0:
            raise DatasetError(f"{dataset.path}: the CSR holds no training interactions")
        chunk = 1 << 24  # scanned in chunks: the topology may be far larger than memory
        lowest = min(int(np.min(dataset.indices[s:min(s + chunk, num_train)])) for s in range(0, num_train, chunk))
        if lowest < num_users:
            raise DatasetError(f"{dataset.path}: a user's CSR row lists user {lowest}; a user-item dataset's user "
                               "rows must list only items (its training interactions). Re-create the dataset")
        self.num_users, self.num_items, self.num_negatives = num_users, num_items, int(num_negatives)
        self.exclude_positives = exclude_positives
        self.negatives_exclude_positives = bool(negatives_exclude_positives)
        self.num_train_edges, self._user_indptr = num_train, user_indptr
        # NodeLoader's seeds: the users that have training edges (only its sharing checks use them).
        super().__init__(dataset, features, fanouts, batch_size, np.flatnonzero(np.diff(user_indptr)), **options)

    def __del__(self):
        if hasattr(self, "_stop"):  # a constructor that failed before NodeLoader.__init__ started nothing
            super().__del__()

    @property
    def edges_per_rank(self) -> int:
        """Every rank gets the same number of edges (the remainder of each epoch's shuffle is left out)."""
        return self.num_train_edges // self.world_size

    def __len__(self) -> int:
        full, rest = divmod(self.edges_per_rank, self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    # -- NodeLoader hooks ------------------------------------------------------------------------------------------

    def _epoch_plans(self, epoch: int, rank: int | None = None) -> list:
        order = (np.random.default_rng([self.seed, epoch]).permutation(self.num_train_edges) if self.shuffle
                 else np.arange(self.num_train_edges))
        if self.world_size > 1:  # the same permutation on every rank, dealt out in turn
            rank = self.rank if rank is None else rank
            order = order[:self.edges_per_rank * self.world_size][rank::self.world_size]
        return [_Plan(epoch, i, order[i * self.batch_size:(i + 1) * self.batch_size]) for i in range(len(self))]

    def _resolve(self, plan: _Plan) -> tuple:
        if plan.resolved is None:
            users = np.searchsorted(self._user_indptr, plan.positions, side="right") - 1
            items = np.asarray(self.dataset.indices[plan.positions], dtype=np.int64)
            rng = np.random.default_rng([self.seed, plan.epoch, plan.index])
            if self.negatives_exclude_positives:
                neg = self._draw_unknown_items(users, rng)
            else:
                neg = rng.integers(self.num_users, self.num_users + self.num_items, (users.size, self.num_negatives))
            nodes, local = np.unique(np.concatenate([users, items, neg.reshape(-1)]), return_inverse=True)
            b = users.size
            plan.resolved = nodes, local[:b], local[b:2 * b], local[2 * b:].reshape(b, self.num_negatives)
        return plan.resolved

    def _draw_unknown_items(self, users: np.ndarray, rng) -> np.ndarray:
        """``num_negatives`` items per entry of ``users``, each uniform over the items that user has no
        training edge with: one draw, no rejection loop.

        With the user's training items sorted, ``p_0 < p_1 < ...`` (relative to the first item), the r-th
        item that is not among them is ``r + #{j : p_j - j <= r}``; ``p_j - j`` is non-decreasing, so a
        binary search finds the count. Rows are offset by ``row * num_items`` to search all at once.
        """
        distinct, row = np.unique(users, return_inverse=True)
        local, items = row_entries(self._user_indptr, self.dataset.indices, distinct)
        keys = np.unique(local * self.num_items + (items - self.num_users))  # sorted; repeated edges once
        local, items = keys // self.num_items, keys % self.num_items
        known = np.bincount(local, minlength=distinct.size)
        starts = np.cumsum(known) - known
        free = self.num_items - known
        if not free.all():
            raise DatasetError(f"{self.dataset.path}: user {int(distinct[np.argmin(free)])} has a training edge "
                               "with every item, so it has no negative; set negatives_exclude_positives=False "
                               "(train.negatives_exclude_positives=false)")
        draws = rng.integers(0, free[row][:, None], (users.size, self.num_negatives))
        shifted = local * self.num_items + (items - (np.arange(keys.size) - starts[local]))
        below = np.searchsorted(shifted, row[:, None] * self.num_items + draws, side="right") - starts[row][:, None]
        return self.num_users + draws + below

    def _plan_nodes(self, plan: _Plan) -> np.ndarray:
        return self._resolve(plan)[0]

    def _make_batch(self, iteration: int, plan: _Plan, hops: list[Hop], x: torch.Tensor, hit: torch.Tensor):
        nodes, user, pos, neg = (torch.from_numpy(a) for a in self._resolve(plan))
        plan.resolved = None  # the batch owns the arrays now
        if self.exclude_positives:
            _drop_pairs(hops, nodes.numel(), user, pos)
        return LinkBatch(iteration, nodes, hops, x, None, hit, user=user, pos=pos, neg=neg)

    # -- resumable position ------------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {**super().state_dict(), "num_train_edges": self.num_train_edges, "num_negatives": self.num_negatives,
                "negatives_exclude_positives": self.negatives_exclude_positives}

    def load_state_dict(self, state: dict) -> None:
        for key, have in (("num_train_edges", self.num_train_edges), ("num_negatives", self.num_negatives),
                          ("negatives_exclude_positives", self.negatives_exclude_positives)):
            if state.get(key, have) != have:
                raise ValueError(f"the saved loader state has {key}={state[key]} but this loader has {key}={have}; "
                                 "resume with the same dataset and loader settings")
        super().load_state_dict(state)


def _drop_pairs(hops: list[Hop], num_seeds: int, a: torch.Tensor, b: torch.Tensor) -> None:
    """Removes the edges between seeds ``a[j]`` and ``b[j]``, both directions, from every hop (keyed, as the
    loader samples them: a user-item graph's one relation).

    Seeds keep their index in every hop (a hop's destinations are the
    previous hop's nodes), so one set of keys serves all hops. With every
    neighbour (fanout -1) a hop begins with the previous hop's edges (the
    rows of the same destinations, in the same order): the decisions made
    there are kept, checked by comparing the edges, and only the rest is
    looked up.
    """
    keys = torch.cat([a * num_seeds + b, b * num_seeds + a]).unique()  # sorted
    (relation,) = hops[0].edge_index
    previous = previous_kept = None  # the previous hop's edges, and what was kept of them
    for hop in hops:
        edges = hop.edge_index[relation]
        if previous is not None and edges.shape[1] >= previous.shape[1] and \
                torch.equal(edges[:, :previous.shape[1]], previous):
            rest = edges[:, previous.shape[1]:]
            kept = torch.cat([previous_kept, _kept(rest, _not_between(rest, keys, num_seeds))], dim=1)
        else:
            kept = _kept(edges, _not_between(edges, keys, num_seeds))
        previous, previous_kept = edges, kept
        hop.edge_index[relation] = kept


def _kept(edges: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``edges[:, keep]``, or ``edges`` itself when every edge is kept (a row at a time: faster than a 2-d mask)."""
    if bool(keep.all()):
        return edges
    return torch.stack([edges[0].masked_select(keep), edges[1].masked_select(keep)])


def _not_between(edges: torch.Tensor, keys: torch.Tensor, num_seeds: int) -> torch.Tensor:
    """Which ``edges`` join no pair of ``keys`` (sorted ``src * num_seeds + dst`` of two seeds)."""
    src, dst = edges
    # Only edges between two seeds can be dropped, and only those are looked up: with every neighbour, a hop
    # holds tens of times more edges than the batch has pairs.
    between = torch.nonzero((src < num_seeds) & (dst < num_seeds)).squeeze(1)
    keep = torch.ones(src.numel(), dtype=torch.bool, device=src.device)
    if between.numel() and keys.numel():
        pair = src[between] * num_seeds + dst[between]
        keep[between[keys[torch.searchsorted(keys, pair).clamp(max=keys.numel() - 1)] == pair]] = False
    return keep


def bpr_loss(user_emb: torch.Tensor, pos_emb: torch.Tensor, neg_emb: torch.Tensor) -> torch.Tensor:
    """Bayesian personalized ranking: ``mean(softplus(<u, n> - <u, p>))`` (= ``-log sigmoid`` of the margin).

    ``user_emb`` and ``pos_emb`` are ``(B, D)``; ``neg_emb`` is ``(B, D)`` or
    ``(B, K, D)`` (K negatives per edge, each compared with the positive).
    """
    if pos_emb.shape != user_emb.shape or user_emb.dim() != 2:
        raise ValueError(f"user and positive embeddings must both be (B, D), got {tuple(user_emb.shape)} and "
                         f"{tuple(pos_emb.shape)}")
    if neg_emb.dim() == 2:
        neg_emb = neg_emb.unsqueeze(1)
    if neg_emb.dim() != 3 or neg_emb.shape[0] != user_emb.shape[0] or neg_emb.shape[2] != user_emb.shape[1]:
        raise ValueError(f"negative embeddings must be (B, D) or (B, K, D) with B, D = {tuple(user_emb.shape)}, "
                         f"got {tuple(neg_emb.shape)}")
    pos_score = (user_emb * pos_emb).sum(-1, keepdim=True)     # (B, 1)
    neg_score = (user_emb.unsqueeze(1) * neg_emb).sum(-1)      # (B, K)
    return torch.nn.functional.softplus(neg_score - pos_score).mean()


# -- evaluation ----------------------------------------------------------------------------------------------------

@torch.no_grad()
def embed_nodes(model, dataset, features, fanouts, nodes, *, batch_size: int = 1024, device=None,
                **options) -> torch.Tensor:
    """``model``'s output for each of the distinct ``nodes``, in order, sampled as in training.

    Uses a :class:`NodeLoader` with ``shuffle=False``; sampling is
    deterministic in ``options["seed"]`` (default 0), so two calls agree.
    The model is put in eval mode and restored.
    """
    was_training = model.training
    model.eval()
    try:
        loader = NodeLoader(dataset, features, fanouts, batch_size, seeds=nodes, shuffle=False, **options)
        return torch.cat([model(batch_to(batch, device)) for batch in loader])
    finally:
        model.train(was_training)


def _pairs_of(sorted_pairs: np.ndarray, users: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(j, item)`` for every pair ``(users[j], item)``; pairs sorted by user, ``users`` sorted."""
    lo = np.searchsorted(sorted_pairs[:, 0], users[0], side="left")
    hi = np.searchsorted(sorted_pairs[:, 0], users[-1], side="right")
    block = sorted_pairs[lo:hi]
    local = np.minimum(np.searchsorted(users, block[:, 0]), users.size - 1)
    keep = users[local] == block[:, 0]
    return local[keep], block[keep, 1]


#: the metrics :func:`ranking_sums` adds up per user, in the order the task reports them
RANKING_METRICS = ("recall", "ndcg", "recall_capped", "random_recall")


def user_ranking_metrics(top_hits: torch.Tensor, held: torch.Tensor, k: int) -> dict[str, torch.Tensor]:
    """Per-user metrics of one ranking, as LightGCN's evaluation code computes them.

    ``top_hits[u, r]`` says whether user u's item at rank r (0-based, r < k) is held out; ``held[u]`` is
    ``|H(u)| > 0``. Returns float64 tensors of shape ``(U,)``:

    - ``recall``: hits / |H(u)|;
    - ``ndcg``: DCG / IDCG, with gain 1 / log2(r + 2) at rank r and the ideal ranking's ``min(k, |H(u)|)``
      hits on top;
    - ``recall_capped``: hits / min(k, |H(u)|), which reaches 1.0 when |H(u)| > k (not LightGCN's recall).
    """
    top_hits = top_hits.double()
    held = held.double()
    hits = top_hits.sum(1)
    discount = 1.0 / torch.log2(torch.arange(top_hits.shape[1], dtype=torch.float64) + 2)
    ideal_discount = torch.cumsum(1.0 / torch.log2(torch.arange(k, dtype=torch.float64) + 2), 0)
    idcg = ideal_discount[(held.clamp(max=k) - 1).long()]
    return {"recall": hits / held, "ndcg": (top_hits * discount).sum(1) / idcg,
            "recall_capped": hits / held.clamp(max=k)}


def evaluated_nodes(dataset, pairs: np.ndarray, rank: int, world_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(users, nodes)`` a rank embeds to rank a split of ``pairs``: its share of the split's users, then every
    item. Equal shares (fewer than world_size users left out), so every rank runs as many batches: the shared
    cache's exchange is collective."""
    num_users, _ = user_item_sizes(dataset)
    users = np.unique(np.asarray(pairs)[:, 0])
    users = users[:users.size // world_size * world_size][rank::world_size]
    return users, np.concatenate([users, np.arange(num_users, dataset.num_nodes)])


def known_splits(split: str, splits) -> list[str]:
    """The held-out splits whose pairs a ranking of ``split`` treats as known (removed, like training items):
    every other split for ``test``, none for any other (validation must not see where the test pairs are)."""
    return [name for name in splits if name != split] if split == "test" else []


def ranking_sums(model, dataset, features, fanouts, *, k: int = 20, split: str = "test", batch_size: int = 1024,
                 device=None, rank: int = 0, world_size: int = 1, embeddings: torch.Tensor | None = None,
                 **options) -> tuple[dict[str, float], int]:
    """``({metric: sum over users}, users)`` for the :data:`RANKING_METRICS` over this rank's share of the
    evaluated users (every ``world_size``-th, equal shares); see :func:`recall_at_k`. Sums, so that ranks
    can add theirs up before dividing. ``embeddings`` (every node's, e.g. from
    :func:`~lsm_gnn.tasks.inference.layerwise_inference`) replaces sampling them with :func:`embed_nodes`."""
    num_users, num_items = user_item_sizes(dataset)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    sums = dict.fromkeys(RANKING_METRICS, 0.0)
    sorted_pairs = {}
    for name in {split, *dataset.edge_split_names}:
        pairs = np.asarray(dataset.edge_split(name))  # names the fix when the split is missing
        sorted_pairs[name] = pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]
    users, nodes = evaluated_nodes(dataset, sorted_pairs[split], rank, world_size)
    if users.size == 0:
        return sums, 0
    if embeddings is None:
        emb = embed_nodes(model, dataset, features, fanouts, nodes, batch_size=batch_size, device=device, **options)
    else:
        emb = embeddings[torch.from_numpy(nodes)]
    user_emb, item_emb = emb[:users.size], emb[users.size:]
    count = 0
    chunk = max(1, SCORE_CHUNK // num_items)
    for start in range(0, users.size, chunk):
        block = users[start:start + chunk]
        # Known items are neither ranked nor counted: the training items, and for the test split the other
        # held-out splits' too (validation happened before it). A validation ranking never knows the test
        # items: removing them would tell model selection where the test pairs are, and inflate its recall.
        known = np.zeros((block.size, num_items), dtype=bool)
        local, items = row_entries(dataset.indptr, dataset.indices, block)
        keep = items >= num_users
        known[local[keep], items[keep] - num_users] = True
        for name in known_splits(split, sorted_pairs):
            local, items = _pairs_of(sorted_pairs[name], block)
            known[local, items - num_users] = True
        target = np.zeros_like(known)
        local, items = _pairs_of(sorted_pairs[split], block)
        target[local, items - num_users] = True
        target &= ~known
        known_t, target_t = torch.from_numpy(known), torch.from_numpy(target)
        scores = (user_emb[start:start + block.size] @ item_emb.T).float().cpu().masked_fill_(known_t, float("-inf"))
        top = scores.topk(min(k, num_items), dim=1).indices
        held = target_t.sum(1)
        valid = held > 0
        metrics = user_ranking_metrics(target_t.gather(1, top)[valid], held[valid], k)
        # A uniformly random ranking of the C(u) candidates puts min(k, C) of them in the top k, each held out
        # with probability |H| / C (the mean of a hypergeometric draw): expected recall min(k, C) / C.
        candidates = (num_items - known_t.sum(1).double())[valid]
        metrics["random_recall"] = candidates.clamp(max=k) / candidates
        for name in RANKING_METRICS:
            sums[name] += float(metrics[name].sum())
        count += int(valid.sum())
    return sums, count


def recall_at_k(model, dataset, features, fanouts, *, k: int = 20, split: str = "test", batch_size: int = 1024,
                device=None, **options) -> dict:
    """Recall@k and NDCG@k of ``model`` on the held-out pairs of ``split``, beside a random ranking's recall.

    Users with held-out items and all items are embedded by
    :func:`embed_nodes` (``options`` go to its loader: ``seed``, ``window``,
    ...). For each user u, every item is scored ``<emb(u), emb(i)>``; the
    user's known items (its training items, and for ``split="test"`` its
    pairs in the other edge splits: :func:`known_splits`) are removed; ``H(u)`` is u's held-out items of ``split`` that
    are not known, and users with empty ``H(u)`` are skipped. Then, as in
    LightGCN's evaluation code (:func:`user_ranking_metrics`)::

        recall@k        = mean over users of |top_k(u) & H(u)| / |H(u)|
        ndcg@k          = mean over users of DCG@k(u) / IDCG@k(u)
        recall_capped@k = mean over users of |top_k(u) & H(u)| / min(k, |H(u)|)

    ``random_recall`` is the exact expectation of recall@k under a uniformly
    random ranking of the ``C(u)`` unknown items, ``min(k, C(u)) / C(u)``,
    averaged alike. Returns ``{"recall", "ndcg", "recall_capped",
    "random_recall", "users", "k", "split"}``.
    """
    sums, count = ranking_sums(model, dataset, features, fanouts, k=k, split=split, batch_size=batch_size,
                               device=device, **options)
    return {**_means(sums, count), "users": count, "k": k, "split": split}


def _means(sums: dict[str, float], count: int) -> dict[str, float]:
    return {name: value / count if count else float("nan") for name, value in sums.items()}


# -- the trainer's task ---------------------------------------------------------------------------------------------

class LinkPrediction:
    """``train.task=link``: BPR on the training edges; recall@20 and NDCG@20 on the held-out edge splits."""

    name = "link"
    k = 20

    @property
    def metrics(self) -> tuple[str, ...]:
        """What :meth:`evaluate` reports per split; model selection watches the first by default."""
        return tuple(f"{name}@{self.k}" for name in RANKING_METRICS)

    def __init__(self, cfg, dataset):
        from lsm_gnn.config import ConfigError

        try:
            user_item_sizes(dataset)
        except DatasetError as exc:
            raise ConfigError(f"train.task=link: {exc}") from exc
        self.cfg, self.dataset = cfg, dataset
        self.out_dim = int(cfg.model.hidden)  # the embedding size
        self.splits = list(dataset.edge_split_names)  # the held-out edges recall is measured on
        self.fanouts = relation_fanouts(cfg, dataset)  # a user-item graph's one relation's

    def train_loader(self, features, rank: int, world_size: int) -> LinkLoader:
        c = self.cfg

        return LinkLoader(self.dataset, features, self.fanouts, c.sampler.batch_size, shuffle=True,
                          num_negatives=c.train.num_negatives,
                          negatives_exclude_positives=c.train.negatives_exclude_positives,
                          **loader_options(c, rank, world_size))

    def eval_input_nodes(self, features, split: str, rank: int, world_size: int, count: int) -> list | None:
        """The input nodes of ``count`` of the batches that embed the users and items :meth:`evaluate` ranks
        on ``rank``, sampled as it samples them; None with ``train.eval_mode=full`` or a split the dataset
        lacks (evaluate names it)."""

        c = self.cfg
        if c.train.eval_mode == "full" or split not in self.dataset.edge_split_names:
            return None
        users, nodes = evaluated_nodes(self.dataset, self.dataset.edge_split(split), rank, world_size)
        if users.size == 0:
            return []
        loader = NodeLoader(self.dataset, features, eval_fanouts(c, self.fanouts), eval_batch_size(c), seeds=nodes,
                            shuffle=False, **loader_options(c, rank, world_size, evaluation=True))
        try:
            return loader.sample_input_nodes(count, rank=rank)
        finally:
            loader.close()

    def loss(self, model, batch: LinkBatch) -> torch.Tensor:
        emb = model(batch)
        user, pos, neg = (t.to(emb.device) for t in (batch.user, batch.pos, batch.neg))
        loss = bpr_loss(emb[user], emb[pos], emb[neg])
        l2 = self.cfg.train.embedding_l2
        if l2 and batch.emb is not None:  # the seeds lead the input nodes, so their table rows lead batch.emb
            ego = batch.emb[:emb.shape[0]].to(emb.device)
            norms = ego.pow(2).sum(1)
            loss = loss + l2 * 0.5 * (norms[user] + norms[pos] + norms[neg].mean(1)).mean()
        return loss

    def evaluate(self, model, features, split: str, device, rank: int, world_size: int) -> dict:
        from lsm_gnn.config import ConfigError

        if split not in self.dataset.edge_split_names:
            raise ConfigError(f"dataset {self.dataset.path} has no '{split}' edge split (it has "
                              f"{self.dataset.edge_split_names or 'none'}); set train.eval_splits to those")

        c = self.cfg
        embeddings = None
        if c.train.eval_mode == "full":  # every node, every neighbour; the same on every rank
            from lsm_gnn.tasks.inference import layerwise_inference

            size = eval_batch_size(c)
            embeddings = layerwise_inference(model, self.dataset, features, np.arange(self.dataset.num_nodes),
                                             chunk_size=size, read_rows=size, device=device, rank=rank,
                                             world_size=world_size)
        sums, count = ranking_sums(model, self.dataset, features, eval_fanouts(c, self.fanouts), k=self.k,
                                   split=split, batch_size=eval_batch_size(c), device=device, embeddings=embeddings,
                                   **loader_options(c, rank, world_size, evaluation=True))
        *totals, count = all_reduce_sum([*sums.values(), count])
        means = _means(dict(zip(sums, totals)), int(count))
        return {**{f"{name}@{self.k}": value for name, value in means.items()}, "count": int(count)}
