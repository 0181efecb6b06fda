"""Configs: YAML + key=value overrides, and clear errors for anything invalid."""
import glob
import os

import pytest

from lsm_gnn.config import ConfigError, cache_capacity_bytes, load_config, load_grid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


def test_defaults_are_the_papers_run():
    cfg = load_config()
    assert (cfg.model.kind, cfg.model.hidden, cfg.model.heads) == ("gat", 512, 4)
    assert cfg.sampler.fanouts == [5, 2, 2, 2] and cfg.sampler.batch_size == 2048
    assert (cfg.cache.policy, cfg.cache.window, cfg.cache.ways) == ("auto", 256, 32)  # auto: hybrid without PVP
    assert cfg.cache.pvp is False and cfg.cache.pvp_queue_bytes == "25%" and cfg.cache.pvp_queue_capacity == 0


def test_yaml_then_overrides_in_order(tmp_path):
    path = write(tmp_path, "model:\n  kind: sage\n  hidden: 64\ncache:\n  policy: rr\n")
    cfg = load_config(path, ["cache.policy=static", "sampler.fanouts=[10, 5]", "train.lr=1e-2", "train.lr=0.5",
                             "cache.oversubscribe=true", "dataset=some/dir"])
    assert cfg.model.kind == "sage" and cfg.model.hidden == 64
    assert cfg.cache.policy == "static"
    assert cfg.sampler.fanouts == [10, 5]
    assert cfg.train.lr == 0.5
    assert cfg.cache.oversubscribe is True
    assert cfg.dataset == "some/dir"


@pytest.mark.parametrize("override, message", [
    (["cache.polcy=rr"], "unknown config key 'cache.polcy'; valid keys here are: cache.features, cache.capacity"),
    (["nosuch=1"], "unknown config key 'nosuch'"),
    (["cache.policy=foo"], "cache.policy='foo' is not valid; choose one of: auto, rr, lru"),
    (["cache.pvp_queue_capacity=-1"], "cache.pvp_queue_capacity must be >= 0"),
    (["cache.pvp_queue_bytes="], "give the victim queues a size"),
    (["cache.pvp_queue_bytes=lots"], "cache.pvp_queue_bytes: cannot read 'lots' as a byte size"),
    (["cache.pvp_queue_bytes=-5%"], "cache.pvp_queue_bytes: '-5%' is not a share of the cache"),
    (["cache.pvp=true", "cache.features=storage"], "cache.pvp=true needs cache.features=cache"),
    (["cache.pvp=maybe"], "cache.pvp must be a bool"),
    (["model.kind=gin"], "choose one of: gat, sage, gcn"),
    (["train.epochs=x"], "train.epochs must be an int"),
    (["train.epochs=0"], "train.epochs must be >= 1"),
    (["sampler.fanouts=[5, -2]"], "sampler.fanouts must be a non-empty list"),
    (["cache.capacity=lots"], "cache.capacity"),
    (["cache.capacity=150%"], "share of the nodes"),
    (["model.hidden=30", "model.heads=4"], "divisible"),
    (["model.dropout=1.0"], "model.dropout"),
    (["train.eval_splits=[dev]"], "valid splits are"),
    (["cache"], "not key=value"),
    (["cache=rr"], "cache is a section"),
])
def test_bad_values_name_the_key_and_the_fix(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_config(None, override)


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "model: [unclosed\n"))
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(write(tmp_path, "- 1\n- 2\n"))


def test_capacity_as_bytes_or_share():
    assert cache_capacity_bytes("4M", 1000, 512) == 4 << 20
    assert cache_capacity_bytes("1.5%", 100_000, 512) == 1500 * 512


def test_grid_is_the_cartesian_product(tmp_path):
    path = write(tmp_path, "cache:\n  window: 8\ngrid:\n  cache.policy: [rr, hybrid]\n  cache.capacity: [1%, 2%, 3%]\n")
    runs = load_grid(path, ["train.epochs=2"])
    assert len(runs) == 6
    assert {(a["cache.policy"], a["cache.capacity"]) for a, _ in runs} == \
        {(p, c) for p in ("rr", "hybrid") for c in ("1%", "2%", "3%")}
    assert all(cfg.cache.window == 8 and cfg.train.epochs == 2 for _, cfg in runs)
    assert all(cfg.cache.policy == a["cache.policy"] for a, cfg in runs)
    with pytest.raises(ConfigError, match="no grid section"):
        load_grid(write(tmp_path, "cache:\n  window: 8\n"))
    with pytest.raises(ConfigError, match="non-empty list"):
        load_grid(write(tmp_path, "grid:\n  cache.policy: rr\n"))
    with pytest.raises(ConfigError, match="unknown config key"):
        load_grid(write(tmp_path, "grid:\n  cache.nope: [1]\n"))


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml"))),
                         ids=os.path.basename)
def test_shipped_configs_are_valid(path):
    with open(path) as fh:
        has_grid = "grid:" in fh.read()
    if has_grid:
        assert len(load_grid(path)) > 1
    else:
        load_config(path)


def test_every_key_is_documented():
    import dataclasses

    from lsm_gnn.config import Config

    with open(os.path.join(ROOT, "docs", "training.md")) as fh:
        doc = fh.read()
    def leaves(cls, prefix=""):  # sections nest (train.early_stopping.patience)
        for f in dataclasses.fields(cls):
            if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory):
                yield from leaves(f.default_factory, f"{prefix}{f.name}.")
            else:
                yield f"{prefix}{f.name}"

    keys = list(leaves(Config))
    assert "train.early_stopping.patience" in keys
    missing = [k for k in keys if f"`{k}`" not in doc]
    assert not missing, f"docs/training.md does not describe {missing}"


def test_a_directory_or_no_file_where_a_config_file_goes_is_named(tmp_path):
    """A dataset directory given as the config, and --grid without a config file, used to end in an OSError
    and an internal TypeError."""
    from lsm_gnn.data.synthetic import generate_synthetic

    generate_synthetic(tmp_path / "g", num_nodes=200, avg_degree=3, feature_dim=4, progress=False)
    with pytest.raises(ConfigError, match=f"config file {tmp_path / 'g'} is a directory; to train on the dataset "
                                          f"there, give dataset={tmp_path / 'g'}"):
        load_config(str(tmp_path / "g"))
    with pytest.raises(ConfigError, match="is a directory; give a YAML file"):
        load_config(str(tmp_path))
    with pytest.raises(ConfigError, match="--grid needs a config file with a grid: section"):
        load_grid(None, ["cache.policy=rr"])
