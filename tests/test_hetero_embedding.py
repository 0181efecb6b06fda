"""Node embeddings on a heterogeneous graph: a table per node type (``model.node_embedding.<type>.*``), read
through its own cache, written back, journaled, kept by best.pt and resumed exactly."""
import json

import numpy as np
import pytest
import torch

pytest.importorskip("torch_geometric")

from lsm_gnn.build import embedding_tables  # noqa: E402
from lsm_gnn.config import ConfigError, load_config  # noqa: E402
from lsm_gnn.storage import EmbeddingTable  # noqa: E402
from lsm_gnn.testing import write_tiny_hetero_dataset  # noqa: E402
from lsm_gnn.training.checkpoint_files import load_checkpoint  # noqa: E402
from lsm_gnn.training.trainer import Trainer  # noqa: E402


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_tiny_hetero_dataset(tmp_path_factory.mktemp("hetero") / "ds")


def overrides(path, out, *more):
    # Topics (30, no features) get the section's dim (a cache of all 30 rows); authors (500, with features) one of
    # their own, behind a cache of 60% of their rows: batches reach up to ~220 authors, so dirty rows are evicted
    # and written back.
    return [f"dataset={path}", "model.kind=sage", "model.hidden=16", "sampler.fanouts=[3,2]",
            "sampler.batch_size=40", "cache.capacity=70%", "cache.window=4", "cache.static_score=degree",
            "cache.ways=8", "train.lr=0.02", "train.epochs=3", "train.eval_splits=[val]", "log.progress=false",
            f"log.dir={out / 'log'}", f"checkpoint.dir={out / 'ckpt'}", "checkpoint.every=4",
            "model.node_embedding.dim=8", "model.node_embedding.lr=0.05", "model.node_embedding.author.dim=4",
            "model.node_embedding.topic.capacity=100%", "model.node_embedding.author.capacity=60%", *more]


def table(out, node_type) -> np.ndarray:
    t = EmbeddingTable.open(str(out / "ckpt" / "node_embedding" / node_type))
    try:
        return t.read(torch.arange(t.num_rows)).numpy().copy()
    finally:
        t.close()


def losses(out) -> list[float]:
    with open(out / "log" / "metrics.jsonl") as fh:
        return [json.loads(line)["loss"] for line in fh if '"iteration"' in line]


def test_which_types_get_tables(dataset, tmp_path):
    """The section's dim goes to the types without features (topic); a type's own dim adds a table to a type with
    features (after them) or takes one away; each table has its own settings and directory."""
    cfg = load_config(None, overrides(dataset.path, tmp_path, "model.node_embedding.author.optimizer=sgd"))
    tables = embedding_tables(cfg, dataset)
    assert set(tables) == {"topic", "author"}
    assert (tables["topic"].dim, tables["topic"].optimizer, tables["topic"].lr) == (8, "adagrad", 0.05)
    assert (tables["author"].dim, tables["author"].optimizer, tables["author"].capacity) == (4, "sgd", "60%")
    assert tables["topic"].path == str(tmp_path / "ckpt" / "node_embedding" / "topic")
    cfg = load_config(None, [f"dataset={dataset.path}", f"checkpoint.dir={tmp_path}", "model.node_embedding.dim=8",
                             "model.node_embedding.topic.dim=0", "model.node_embedding.paper.dim=2"])
    assert {t: e.dim for t, e in embedding_tables(cfg, dataset).items()} == {"paper": 2}


@pytest.mark.parametrize("more, message", [
    (["model.node_embedding.venue.dim=4"], "node types \\['venue'\\].*'paper', 'author', 'topic'"),
    (["model.node_embedding.features=false"], "features=false takes a graph of one node type"),
])
def test_what_the_dataset_cannot_have_is_refused_before_training(dataset, tmp_path, more, message):
    with pytest.raises(ConfigError, match=message):
        Trainer(load_config(None, overrides(dataset.path, tmp_path, *more)))


@pytest.mark.parametrize("spelling", ["same", "relative", "link"])
def test_two_types_given_one_table_directory_are_refused(dataset, tmp_path, monkeypatch, spelling):
    """However the second path spells the first's directory, two types never train one table together."""
    table_dir = tmp_path / "tables" / "shared"
    table_dir.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    other = {"same": str(table_dir), "relative": "tables/shared", "link": str(tmp_path / "alias")}[spelling]
    (tmp_path / "alias").symlink_to(table_dir)
    cfg = load_config(None, overrides(dataset.path, tmp_path, f"model.node_embedding.topic.path={table_dir}",
                                      f"model.node_embedding.author.path={other}"))
    with pytest.raises(ConfigError, match=r"model.node_embedding.author.path .* and model.node_embedding.topic.path"
                                          r" .* node types author and topic would train one table together"):
        embedding_tables(cfg, dataset)


@pytest.mark.parametrize("more, message", [
    (["model.node_embedding.topic.size=4"], "model.node_embedding.topic has unknown keys \\['size'\\]"),
    (["model.node_embedding.topic.dim=-1"], "model.node_embedding.topic.dim must be >= 0"),
    (["model.node_embedding.topic.optimizer=lion"], "model.node_embedding.topic.optimizer='lion' is not valid"),
    (["model.node_embedding.topic.dim=many"], "model.node_embedding.topic.dim must be an int"),
    (["model.node_embedding.topic.lr=inf"], "model.node_embedding.topic.lr must be a finite number > 0"),
    (["model.node_embedding.topic.init_std=inf"], "init_std a finite number >= 0, got lr=0.05, init_std=inf"),
    (["model.node_embedding.topic.capacity=lots"], "model.node_embedding.topic.capacity"),
    (["model.node_embedding.topic=4"], "unknown config key 'model.node_embedding.topic'.*<type>"),
])
def test_bad_type_sections_are_refused_with_their_key(dataset, tmp_path, more, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides(dataset.path, tmp_path, *more))


def test_a_type_without_features_learns_a_vector_per_node(tmp_path):
    """Only the topics tell a paper's class here (authors and citations left out, a paper's own features are
    noise). One vector shared by every topic cannot tell topics apart; a learned row per topic can."""
    dataset = write_tiny_hetero_dataset(tmp_path / "ds", paper_signal=0.0)
    only_topics = ["sampler.relation_fanouts.author__writes__paper=[0,0]",
                   "sampler.relation_fanouts.paper__cites__paper=[0,0]", "train.epochs=6"]

    def accuracy(out, *more):
        result = Trainer(load_config(None, overrides(dataset.path, out, *only_topics, *more))).fit()
        return result["eval"]["val"]["accuracy"]

    shared = accuracy(tmp_path / "shared", "model.node_embedding.dim=0", "model.node_embedding.author.dim=0")
    per_node = accuracy(tmp_path / "per_node", "model.node_embedding.author.dim=0")
    assert per_node > shared + 0.2 and per_node > 0.9, f"a row per topic {per_node:.3f}, one vector {shared:.3f}"


def test_tables_are_exact_through_a_small_cache_and_a_resume(dataset, tmp_path):
    """Authors' rows are evicted dirty and written back through a cache of 60%; the tables and losses equal a run
    whose caches hold every row, and a run stopped at iteration 5 and resumed ends with the same tables."""
    every_row = tmp_path / "every_row"
    whole = Trainer(load_config(None, overrides(dataset.path, every_row,
                                                "model.node_embedding.author.capacity=100%",
                                                "model.node_embedding.capacity=100%"))).fit()
    parts = tmp_path / "parts"
    stopped = Trainer(load_config(None, overrides(dataset.path, parts, "train.max_iterations=5"))).fit()
    assert stopped["iterations"] == 5
    resumed = Trainer(load_config(None, overrides(dataset.path, parts))).fit()
    assert losses(parts) == losses(every_row)
    assert resumed["eval"]["val"]["accuracy"] == whole["eval"]["val"]["accuracy"]
    for t in ("topic", "author"):
        assert np.array_equal(table(parts, t), table(every_row, t)), f"{t}'s table differs"
    written = resumed["history"][-1]
    assert written["embedding_bytes_written"] > 0, "the authors' cache wrote rows back"
    # the tables trained: not their initial rows
    from lsm_gnn.embedding import RowLayout, initial_rows

    layout = RowLayout(8, "float32", "adagrad")
    start = initial_rows(layout, 0, dataset.num_nodes_of("topic"), seed=0 + 1_000_003 * 2, std=0.1)
    assert not np.array_equal(table(parts, "topic"), start)


def test_best_checkpoint_keeps_every_tables_copy(dataset, tmp_path):
    """best.pt pairs with a copy of each type's table as it was at the best evaluation; evaluating it gives the
    accuracy recorded there, after later epochs changed the run's tables."""
    # The best by the lowest val accuracy: the first epoch's, before two more epochs change every table.
    result = Trainer(load_config(None, overrides(dataset.path, tmp_path, "train.early_stopping.mode=min"))).fit()
    assert result["best"]["epoch"] == 0 and result["best"]["eval"]["val"] != result["eval"]["val"]
    best = tmp_path / "ckpt" / "best.pt"
    state = load_checkpoint(str(best))
    assert set(state["embeddings"]) == {"topic", "author"}
    for t, saved in state["embeddings"].items():
        assert (tmp_path / "ckpt" / saved["snapshot"]).is_dir() and f".{t}." in saved["snapshot"]
    from lsm_gnn.cli.evaluate import restored_trainer

    with restored_trainer(str(best)) as evaluator:
        assert evaluator.evaluate("val") == pytest.approx(result["best"]["eval"]["val"])


def test_a_table_prepared_for_one_node_type_trains_in_place(dataset, tmp_path, capsys):
    from lsm_gnn.cli import main

    table_dir = tmp_path / "author-emb"
    assert main(["prepare", "embedding", str(dataset.path), "--out", str(table_dir), "--dim", "4",
                 "--no-progress"]) == 1
    assert "--node-type" in capsys.readouterr().err
    assert main(["prepare", "embedding", str(dataset.path), "--out", str(table_dir), "--dim", "4",
                 "--node-type", "venue", "--no-progress"]) == 1
    assert "'venue' is not a node type" in capsys.readouterr().err
    assert main(["prepare", "embedding", str(dataset.path), "--out", str(table_dir), "--dim", "4",
                 "--node-type", "author", "--no-progress"]) == 0
    assert f"model.node_embedding.author.path={table_dir}" in capsys.readouterr().out
    before = EmbeddingTable.open(str(table_dir))
    assert before.num_rows == dataset.num_nodes_of("author")
    before.close()
    Trainer(load_config(None, overrides(dataset.path, tmp_path, f"model.node_embedding.author.path={table_dir}",
                                        "train.epochs=1"))).fit()
    trained = EmbeddingTable.open(str(table_dir))
    assert trained.generation > 0, "the run trained the prepared table in place"
    trained.close()
