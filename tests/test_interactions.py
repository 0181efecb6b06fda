"""User-item datasets from interaction files: ids, splits, repeats, features, and clear errors."""
import csv
import json

import numpy as np
import pytest

from lsm_gnn.data import from_interactions, open_dataset
from lsm_gnn.data.interactions import held_out_counts, id_maps

NUM_USERS, NUM_ITEMS, ROWS = 40, 25, 600


def write_csv(path, rows, header=("user", "item", "time"), delimiter=","):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, delimiter=delimiter)
        if header:
            writer.writerow(header)
        writer.writerows(rows)
    return path


@pytest.fixture(scope="module")
def log():
    """Interactions with string ids (users 'u<k>', items 'i<k>') and distinct timestamps, repeats included."""
    rng = np.random.default_rng(3)
    users, items = rng.integers(0, NUM_USERS, ROWS), rng.integers(0, NUM_ITEMS, ROWS)
    times = rng.permutation(ROWS) * 10 + 1_000
    return [(f"u{u}", f"i{i}", int(t)) for u, i, t in zip(users, items, times)]


def pairs_of(ds):
    """Every split's (file user id, file item id) pairs: train from the CSR's user rows."""
    user_ids, item_ids = id_maps(ds)
    u = ds.num_users
    indptr, indices = np.asarray(ds.indptr), np.asarray(ds.indices)
    out = {"train": (np.repeat(np.arange(u), np.diff(indptr[:u + 1])), indices[:indptr[u]] - u)}
    for name in ds.edge_split_names:
        edges = np.asarray(ds.edge_split(name))
        out[name] = (edges[:, 0], edges[:, 1] - u)
    return {name: [(str(user_ids[a]), str(item_ids[b])) for a, b in zip(*ends)] for name, ends in out.items()}


def earliest(log):
    """(user, item) -> its earliest timestamp."""
    first = {}
    for user, item, t in log:
        first[(user, item)] = min(t, first.get((user, item), t))
    return first


def test_a_csv_with_string_ids_becomes_a_user_item_dataset_split_per_user(log, tmp_path):
    ds = from_interactions(tmp_path / "ds", write_csv(tmp_path / "log.csv", log), user_col="user",
                           item_col="item", seed=1, progress=False)
    user_ids, item_ids = id_maps(ds)
    assert list(user_ids) == sorted({u for u, _, _ in log}) and list(item_ids) == sorted({i for _, i, _ in log})
    assert (ds.num_users, ds.num_items) == (len(user_ids), len(item_ids))
    assert ds.score_names() == ["degree", "reverse_pagerank"] and ds.edge_split_names == ["test", "val"]
    split = pairs_of(ds)
    distinct = set(earliest(log))
    assert sum(len(p) for p in split.values()) == len(distinct)  # every distinct pair once, in one split
    assert set().union(*map(set, split.values())) == distinct
    per_user = {u: sum(1 for p in distinct if p[0] == u) for u in user_ids}
    for user, n in per_user.items():
        test, val = held_out_counts(np.array([n]), 0.1, 0.2, 3)
        counts = [sum(1 for p in split[s] if p[0] == user) for s in ("test", "val")]
        assert counts == [int(test[0]), int(val[0])], user
    assert ds.meta["converted"]["repeated_rows"] == len(log) - len(distinct)
    again = from_interactions(tmp_path / "again", tmp_path / "log.csv", user_col="user", item_col="item", seed=1,
                              progress=False)
    assert pairs_of(again) == split  # seeded
    assert pairs_of(from_interactions(tmp_path / "seed2", tmp_path / "log.csv", user_col="user", item_col="item",
                                      seed=2, progress=False))["test"] != split["test"]


def test_held_out_counts_round_keep_one_for_training_and_skip_small_users():
    n = np.array([0, 1, 2, 3, 4, 5, 10, 11])
    test, val = held_out_counts(n, 0.1, 0.2, 3)
    assert list(test) == [0, 0, 0, 1, 1, 1, 2, 2] and list(val) == [0, 0, 0, 0, 0, 1, 1, 1]
    test, val = held_out_counts(np.array([3, 4]), 0.45, 0.5, 2)
    assert list(test) == [2, 2] and list(val) == [0, 1]  # one left to train


def test_the_temporal_split_holds_out_each_users_latest_interactions(log, tmp_path):
    ds = from_interactions(tmp_path / "ds", write_csv(tmp_path / "log.csv", log), user_col="user", item_col="item",
                           time_col="time", split="temporal", progress=False)
    when, split = earliest(log), pairs_of(ds)
    checked = 0
    for user in {u for u, _, _ in log}:
        train, val, test = ([when[p] for p in split[s] if p[0] == user] for s in ("train", "val", "test"))
        assert max(train) < min(val + test, default=np.inf) and max(val, default=-1) < min(test, default=np.inf)
        checked += bool(val)
    assert checked > NUM_USERS // 2


def test_the_split_column_decides_and_a_user_id_may_equal_an_item_id(tmp_path):
    rows = [("7", "7", "train"), ("7", "8", "Valid"), ("7", "9", "test"), ("8", "7", "train"), ("8", "9", "test"),
            ("8", "8", "validation")]
    ds = from_interactions(tmp_path / "ds", write_csv(tmp_path / "s.csv", rows, ("u", "i", "split")), user_col="u",
                           item_col="i", split_col="split", progress=False)
    assert ds.meta["converted"]["split"] == "column"
    user_ids, item_ids = id_maps(ds)
    assert list(user_ids) == [7, 8] and list(item_ids) == [7, 8, 9] and user_ids.dtype == np.int64
    split = pairs_of(ds)
    assert sorted(split["train"]) == [("7", "7"), ("8", "7")]
    assert sorted(split["val"]) == [("7", "8"), ("8", "8")] and sorted(split["test"]) == [("7", "9"), ("8", "9")]


def test_sparse_integer_ids_are_numbered_in_numeric_order_and_text_ids_stay_text(tmp_path):
    rows = [(1000, 5), (20, 5), (3, 70), (20, 70), (1000, 70), (3, 5), (20, 9), (3, 9), (1000, 9)]
    ds = from_interactions(tmp_path / "ds", write_csv(tmp_path / "n.csv", rows, None), val_fraction=0, progress=False)
    assert [list(a) for a in id_maps(ds)] == [[3, 20, 1000], [5, 9, 70]]
    mixed = [("007", "a"), ("7", "a"), ("007", "b"), ("7", "b"), ("007", "c"), ("7", "c")]
    ds = from_interactions(tmp_path / "text", write_csv(tmp_path / "t.csv", mixed, None), test_fraction=0.3,
                           val_fraction=0, progress=False)
    assert list(id_maps(ds)[0]) == ["007", "7"]  # two users, not one


def test_repeated_pairs_are_dropped_kept_or_refused(tmp_path):
    rows = [("a", "x", 5), ("a", "x", 1), ("a", "y", 2), ("a", "z", 3), ("b", "x", 4), ("b", "y", 6), ("b", "z", 7),
            ("a", "x", 9)]
    path = write_csv(tmp_path / "d.csv", rows)
    args = dict(user_col="user", item_col="item", time_col="time", split="temporal", val_fraction=0, progress=False)
    dropped = from_interactions(tmp_path / "drop", path, **args)
    assert dropped.meta["converted"]["repeated_rows"] == 2 and dropped.num_edges == 2 * 4
    assert sorted(pairs_of(dropped)["test"]) == [("a", "z"), ("b", "z")]  # (a, x) counts at its earliest, time 1
    kept = from_interactions(tmp_path / "keep", path, duplicates="keep", **args)
    assert kept.num_edges == 2 * 6  # (a, x) three times in both directions
    assert pairs_of(kept)["test"] == pairs_of(dropped)["test"]
    with pytest.raises(ValueError, match=r"user 'a' and item 'x' interact more than once \(.*lines 2, 3, 9\).*"
                                         "--duplicates"):
        from_interactions(tmp_path / "err", path, duplicates="error", **args)


def test_feature_files_give_rows_by_id_side_by_side_when_widths_differ(tmp_path):
    rows = [(u, i) for u in range(4) for i in range(3) if (u + i) % 4]
    path = write_csv(tmp_path / "f.csv", rows, None)
    users = np.arange(5 * 2, dtype=np.float32).reshape(5, 2)  # user 4 has no interactions: still a node
    items = np.arange(3 * 3, dtype=np.float32).reshape(3, 3) + 100
    np.save(tmp_path / "users.npy", users)
    np.save(tmp_path / "items.npy", items)
    ds = from_interactions(tmp_path / "ds", path, user_features=tmp_path / "users.npy",
                           item_features=tmp_path / "items.npy", test_fraction=0.3, val_fraction=0, progress=False)
    assert (ds.num_users, ds.num_items, ds.feature_dim) == (5, 3, 5)
    stored = ds.read_features_direct(np.arange(8))
    np.testing.assert_array_equal(stored[:5], np.hstack([users, np.zeros((5, 3))]))
    np.testing.assert_array_equal(stored[5:], np.hstack([np.zeros((3, 2)), items]))
    assert [list(a) for a in id_maps(ds)] == [[0, 1, 2, 3, 4], [0, 1, 2]]
    # One side only: the other gets seeded Gaussian features of the same width.
    one = from_interactions(tmp_path / "one", path, item_features=items, test_fraction=0.3, val_fraction=0,
                            progress=False)
    assert one.feature_dim == 3 and one.num_users == 4
    np.testing.assert_array_equal(one.read_features_direct(np.arange(4, 7)), items)
    with pytest.raises(ValueError, match=r"line 2: user id 4 is outside the 4 rows of .*u4\.npy.*row numbers 0\.\.3"):
        np.save(tmp_path / "u4.npy", users[:4])
        rows_bad = rows[:1] + [(4, 1)] + rows[1:]
        from_interactions(tmp_path / "bad", write_csv(tmp_path / "b.csv", rows_bad, None),
                          user_features=tmp_path / "u4.npy", progress=False)
    with pytest.raises(ValueError, match="item id 'x' is not an integer.*row numbers"):
        from_interactions(tmp_path / "bad", write_csv(tmp_path / "x.csv", [(0, "x")], None), header=False,
                          item_features=items, progress=False)
    with pytest.raises(ValueError, match=r"must be a 2-D array with one row per user id, got shape \(5,\)"):
        from_interactions(tmp_path / "bad", path, user_features=np.zeros(5), progress=False)


def test_feature_files_keyed_by_their_own_ids(tmp_path, log):
    """String ids with feature files: each file's rows named by an id file (.npy or text); every row is a node,
    in row order, and every interaction's row is the one its id names."""
    users = sorted({u for u, _, _ in log}, reverse=True) + ["u-never"]  # not sorted; one user with no interaction
    items = sorted({i for _, i, _ in log})
    user_rows = np.arange(len(users) * 2, dtype=np.float32).reshape(-1, 2)
    item_rows = np.arange(len(items) * 2, dtype=np.float32).reshape(-1, 2) + 1000
    np.save(tmp_path / "user_ids.npy", np.array(users))
    (tmp_path / "item_ids.txt").write_text("".join(f"{i}\n" for i in items))
    path = write_csv(tmp_path / "log.csv", log)
    ds = from_interactions(tmp_path / "ds", path, user_features=user_rows, item_features=item_rows,
                           user_feature_ids=tmp_path / "user_ids.npy", item_feature_ids=tmp_path / "item_ids.txt",
                           time_col=2, split="temporal", progress=False)
    assert (ds.num_users, ds.num_items) == (len(users), len(items))
    user_ids, item_ids = id_maps(ds)
    assert list(user_ids) == users and list(item_ids) == items
    np.testing.assert_array_equal(ds.read_features_direct(np.arange(ds.num_nodes)), np.vstack([user_rows, item_rows]))
    # Every interaction of the file is in some split, by the rows its ids name.
    assert {pair for part in pairs_of(ds).values() for pair in part} == {(u, i) for u, i, _ in log}
    with pytest.raises(ValueError, match=rf"line \d+: user id '{users[0]}' is not among the ids of .*user_feature_ids"):
        from_interactions(tmp_path / "bad", path, user_features=user_rows[1:], user_feature_ids=np.array(users[1:]),
                          progress=False)  # users[0] has interactions, but no row
    with pytest.raises(ValueError, match=r"user_feature_ids has 3 ids but the feature file has 2 rows"):
        from_interactions(tmp_path / "bad", path, user_features=np.zeros((2, 2)), user_feature_ids=["a", "b", "c"],
                          progress=False)
    with pytest.raises(ValueError, match=r"user_feature_ids: id 'a' names 2 rows"):
        from_interactions(tmp_path / "bad", path, user_features=np.zeros((2, 2)), user_feature_ids=["a", "a"],
                          progress=False)
    with pytest.raises(ValueError, match=r"pass user_features too"):
        from_interactions(tmp_path / "bad", path, user_feature_ids=["a"], progress=False)


def test_npy_interactions_by_index_or_by_field_name(tmp_path, monkeypatch):
    import lsm_gnn.data.interaction_files as interaction_files

    rng = np.random.default_rng(0)
    table = np.stack([rng.integers(0, 30, 400), rng.integers(0, 20, 400), rng.permutation(400)], axis=1)
    np.save(tmp_path / "plain.npy", table)
    a = from_interactions(tmp_path / "a", tmp_path / "plain.npy", time_col=2, split="temporal", progress=False)
    structured = np.zeros(400, dtype=[("who", "i8"), ("what", "i4"), ("when", "f8")])
    structured["who"], structured["what"], structured["when"] = table.T
    np.save(tmp_path / "named.npy", structured)
    monkeypatch.setattr(interaction_files, "READ_CHUNK", 7)  # many chunks, a ragged end
    b = from_interactions(tmp_path / "b", tmp_path / "named.npy", user_col="who", item_col="what", time_col="when",
                          split="temporal", progress=False)
    assert pairs_of(a) == pairs_of(b)
    for name in ("indptr", "indices"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def test_chunked_reading_of_text_gives_the_same_dataset(log, tmp_path, monkeypatch):
    import lsm_gnn.data.interaction_files as interaction_files

    path = write_csv(tmp_path / "log.tsv", log, delimiter="\t")
    a = from_interactions(tmp_path / "a", path, time_col=2, split="temporal", progress=False)  # header guessed
    assert a.meta["converted"]["header"] == ["user", "item", "time"] and a.meta["converted"]["format"] == "tsv"
    monkeypatch.setattr(interaction_files, "READ_CHUNK", 13)
    b = from_interactions(tmp_path / "b", path, time_col="time", split="temporal", progress=False)
    assert pairs_of(a) == pairs_of(b)
    np.testing.assert_array_equal(a.read_features_direct(np.arange(a.num_nodes)),
                                  b.read_features_direct(np.arange(b.num_nodes)))


def test_iso_dates_order_the_temporal_split(tmp_path):
    rows = [("a", "x", "2024-03-01"), ("a", "y", "2024-01-01T10:00:00"), ("a", "z", "2024-02-01"),
            ("b", "x", "2023-12-31"), ("b", "y", "2024-01-02"), ("b", "z", "2023-01-01")]
    ds = from_interactions(tmp_path / "ds", write_csv(tmp_path / "d.csv", rows), user_col="user", item_col="item",
                           time_col="time", split="temporal", val_fraction=0, progress=False)
    assert sorted(pairs_of(ds)["test"]) == [("a", "x"), ("b", "y")]


@pytest.mark.parametrize("rows, kw, message", [
    ([], {}, r"holds no interactions after its header line \(user, item, time\)"),
    ([("a", "x", 1)], {"user_col": "userId"}, r"user column 'userId' is not in .*header \(user, item, time\)"),
    ([("a", "x", 1), ("b",)], {}, r"line 3 has 1 field\(s\) but the item column is column 1"),
    ([("a", "x", 1), ("a", "y", "nan")], {"time_col": "time", "split": "temporal"}, "line 3: the timestamp is missing"),
    ([("a", "x", 1), ("a", "y", "")], {"time_col": "time", "split": "temporal"}, "line 3: .*timestamp"),
    ([("a", "x", "soon")], {"time_col": "time", "split": "temporal"}, "line 2: timestamp 'soon' is neither"),
    ([("a", "x", "train"), ("a", "y", "holdout")], {"split_col": "time"}, "line 3: split 'holdout' is not one of"),
    ([("a", "x", "1")], {"split": "temporal"}, "needs the timestamp column"),
    ([("a", "", "1")], {}, "line 2: the item id is empty"),
    ([("a", "x", 1), ("a", "y", 2)], {}, "no interaction went to test.*min_user_interactions"),
    ([("a", "x", 1)], {"split": "random"}, "split='random' is not one of user-random, temporal, column"),
    ([("a", "x", 1)], {"test_fraction": 0.7, "val_fraction": 0.3}, "val_fraction \\+ test_fraction < 1"),
])
def test_bad_input_is_refused_with_a_message_naming_it(tmp_path, rows, kw, message):
    path = write_csv(tmp_path / "bad.csv", rows)
    args = {"user_col": "user", "item_col": "item", **kw}
    with pytest.raises(ValueError, match=message):
        from_interactions(tmp_path / "ds", path, progress=False, **args)
    assert not (tmp_path / "ds").exists()


def test_an_extension_the_reader_does_not_know_asks_for_the_format(tmp_path):
    """A RecBole-style ``.inter`` file: tab separated, named neither .csv nor .tsv."""
    (tmp_path / "ml.inter").write_text("user_id:token\titem_id:token\n" + "".join(
        f"u{u}\ti{(u * 7 + k) % 13}\n" for u in range(20) for k in range(6)))
    with pytest.raises(ValueError, match=r"extension '\.inter'.*--format csv, tsv or npy"):
        from_interactions(tmp_path / "ds", tmp_path / "ml.inter", progress=False)
    assert not (tmp_path / "ds").exists()
    ds = from_interactions(tmp_path / "ds", tmp_path / "ml.inter", format="tsv", user_col="user_id:token",
                           item_col="item_id:token", progress=False)
    assert ds.num_nodes == 20 + 13


def test_an_empty_file_and_a_missing_file(tmp_path):
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(ValueError, match="holds no interactions"):
        from_interactions(tmp_path / "ds", tmp_path / "empty.csv", progress=False)
    with pytest.raises(FileNotFoundError, match="no such file"):
        from_interactions(tmp_path / "ds", tmp_path / "missing.csv", progress=False)


def test_cli_converts_a_csv_and_the_trainer_accepts_it_with_defaults(log, tmp_path, capsys):
    pytest.importorskip("torch_geometric")
    from lsm_gnn.cli import main

    path = write_csv(tmp_path / "log.csv", log, ("user_id", "item_id", "ts"))
    out = tmp_path / "ds"
    assert main(["prepare", "interactions", "--interactions", str(path), "--user-col", "user_id", "--item-col",
                 "item_id", "--time-col", "ts", "--split", "temporal", "--feature-dim", "8", "--out", str(out),
                 "--no-progress"]) == 0
    printed = capsys.readouterr().out
    ds = open_dataset(out)
    assert f"{ds.num_users} users, {ds.num_items} items, interactions train/val/test" in printed
    assert f"{len(earliest(log))} distinct (user, item) pairs ({len(log) - len(earliest(log))} repeated rows " \
           "dropped)" in printed
    assert main(["train", f"dataset={out}", "train.task=link", "train.max_iterations=1", "cache.capacity=1M",
                 "log.progress=false", "--json", str(tmp_path / "r.json")]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["iterations"] == 1 and set(result["eval"]) == {"val", "test"}
    assert main(["prepare", "interactions", "--interactions", str(path), "--out", str(tmp_path / "x"),
                 "--split", "temporal", "--no-progress"]) == 1
    assert "needs the timestamp column" in capsys.readouterr().err
