"""The durable embedding table: rows read and written in place, rolled back to the last checkpoint after a crash."""
import json
import os
import subprocess
import sys
import tempfile
import zlib

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lsm_gnn.storage import EmbeddingTable, FeatureStorage, TableError
from lsm_gnn.storage import journal as journal_module
from lsm_gnn.storage import table_files
from lsm_gnn.storage.journal import HEADER, journal_header, record_dtype

def random_rows(rng, n: int, row_bytes: int) -> np.ndarray:
    return rng.integers(0, 256, (n, row_bytes), dtype=np.uint8)


@pytest.fixture(autouse=True)
def python_row_writes(monkeypatch):
    """Rows through ``os.pwrite`` (one call per run), which these tests instrument; the native writer, which
    production uses, is held to it by test_the_native_row_writer_writes_what_pwrite_writes."""
    monkeypatch.setattr(table_files, "NATIVE_WRITES", False)


def test_the_native_row_writer_writes_what_pwrite_writes(tmp_path, monkeypatch):
    for row_bytes in (40, 1000):  # packed rows (stride 64) and padded ones (stride 1024)
        tables = {}
        for native in (False, True):
            rng = np.random.default_rng(3)  # the same writes both ways
            monkeypatch.setattr(table_files, "NATIVE_WRITES", native)
            table, _ = make_table(tmp_path / f"{row_bytes}-{native}", row_bytes=row_bytes)
            for _ in range(3):
                ids = np.sort(rng.choice(200, 60, replace=False))
                table.write(ids, random_rows(np.random.default_rng(int(ids.sum())), 60, row_bytes))
            tables[native] = all_rows(table)
            with open(table.data_path, "rb") as fh:  # the padding between rows stays zero
                raw = np.frombuffer(fh.read(), dtype=np.uint8)
            assert not raw[:200 * table.row_stride].reshape(200, -1)[:, row_bytes:].any()
            table.close()
        np.testing.assert_array_equal(tables[True], tables[False])
    from lsm_gnn import _C

    with pytest.raises(OSError) as error:  # a failed write keeps its errno (ENOSPC, EIO, ...)
        _C.write_rows(-1, torch.zeros(1, dtype=torch.int64), torch.zeros((1, 8), dtype=torch.uint8), 8)
    assert error.value.errno == 9  # EBADF


def make_table(path, num_rows=200, row_bytes=40, seed=0, chunk_rows=64):
    """(table at generation 0, its initial rows)."""
    init = random_rows(np.random.default_rng(seed), num_rows, row_bytes)
    calls = []

    def rows(start, stop):
        calls.append((start, stop))
        return init[start:stop]

    table = EmbeddingTable.create(path, num_rows, row_bytes, rows, layout={"dim": 3, "optimizer": "adagrad"},
                                  chunk_rows=chunk_rows)
    assert calls == [(s, min(s + chunk_rows, num_rows)) for s in range(0, num_rows, chunk_rows)]
    return table, init


def all_rows(table) -> np.ndarray:
    return table.read(torch.arange(table.num_rows)).numpy()


def checkpoint(table, *others) -> None:
    """The checkpoint protocol: every rank syncs, rank 0 records the next generation, every rank resets."""
    tables = (table, *others)
    for t in tables:
        t.sync()
    generation = table.generation + 1
    table.set_generation(generation)
    for t in tables:
        t.reset_journal(generation)


def recorded_generation(path) -> int:
    with open(os.path.join(path, "table.json")) as fh:
        return json.load(fh)["generation"]


# -- reading and writing ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("row_bytes,stride", [(40, 64), (64, 64), (1000, 1024), (512, 512)])
def test_create_then_open_reads_the_initial_rows(tmp_path, row_bytes, stride):
    table, init = make_table(tmp_path / "t", num_rows=150, row_bytes=row_bytes)
    assert isinstance(table, FeatureStorage)
    assert (table.backend, table.dim, table.row_bytes, table.row_stride, table.generation) == \
        ("table", row_bytes, row_bytes, stride, 0)
    assert table.dtype == torch.uint8 and table.layout == {"dim": 3, "optimizer": "adagrad"}
    np.testing.assert_array_equal(all_rows(table), init)
    table.close()
    table = EmbeddingTable.open(tmp_path / "t")
    ids = np.random.default_rng(1).integers(0, 150, 300)  # duplicates and any order
    np.testing.assert_array_equal(table.read(ids).numpy(), init[ids])
    out = torch.zeros((10, row_bytes), dtype=torch.uint8)
    table.read_into([5, 149, 0], out, torch.tensor([9, 0, 4]))
    np.testing.assert_array_equal(out[[9, 0, 4]].numpy(), init[[5, 149, 0]])
    assert table.stats().backend == "table" and table.stats().unique_rows > 0
    assert sorted(os.listdir(tmp_path)) == ["t"]  # no temporary left beside it
    table.close()


@pytest.mark.parametrize("row_bytes", [40, 1000])
def test_written_rows_read_back_and_padding_stays_zero(tmp_path, row_bytes):
    rng = np.random.default_rng(2)
    table, init = make_table(tmp_path / "t", num_rows=300, row_bytes=row_bytes)
    expected = init.copy()
    for ids in (rng.permutation(300)[:120], np.arange(40, 90), np.array([299, 0, 1, 2, 150])):
        rows = random_rows(rng, len(ids), row_bytes)
        table.write(torch.from_numpy(ids), torch.from_numpy(rows))
        expected[ids] = rows
        np.testing.assert_array_equal(table.read(ids).numpy(), rows)
        np.testing.assert_array_equal(all_rows(table), expected)
    raw = np.fromfile(tmp_path / "t" / "table.bin", dtype=np.uint8)
    assert raw.size % 4096 == 0
    by_row = raw[:300 * table.row_stride].reshape(300, table.row_stride)
    np.testing.assert_array_equal(by_row[:, :row_bytes], expected)
    assert not by_row[:, row_bytes:].any() and not raw[300 * table.row_stride:].any()
    table.close()


def test_a_row_is_journaled_once_per_generation(tmp_path):
    table, _ = make_table(tmp_path / "t", row_bytes=40)
    journal = tmp_path / "t" / "undo.0.log"
    record = record_dtype(40).itemsize
    rng = np.random.default_rng(3)
    table.write([3, 4, 5], random_rows(rng, 3, 40))
    table.write([4, 5, 6, 7], random_rows(rng, 4, 40))
    c = table.write_counters()
    assert (c["rows_written"], c["journal_rows"], c["journal_bytes"]) == (7, 5, 5 * record)
    assert c["bytes_written"] == (3 * 64 - 24) + (4 * 64 - 24)  # one run each: packed rows and the gaps between
    assert os.path.getsize(journal) == HEADER.size + 5 * record
    checkpoint(table)
    assert os.path.getsize(journal) == HEADER.size  # a new generation: an empty journal
    table.write([4], random_rows(rng, 1, 40))
    assert table.write_counters()["journal_rows"] == 6
    table.reset_stats()
    assert table.write_counters() == {"rows_written": 0, "bytes_written": 0, "journal_rows": 0, "journal_bytes": 0,
                                      "write_seconds": 0.0, "journal_seconds": 0.0}
    table.close()


def test_the_journal_is_committed_before_any_row_is_overwritten(tmp_path, monkeypatch):
    table, _ = make_table(tmp_path / "t", row_bytes=40)
    events = []
    real_pwrite, real_fsync = os.pwrite, os.fsync
    name = {table._fd: "table", table._journal_fd: "journal"}

    def pwrite(fd, data, offset):
        events.append(("pwrite", name[fd]))
        return real_pwrite(fd, data, offset)

    def fsync(fd):
        events.append(("fsync", name[fd]))
        return real_fsync(fd)

    monkeypatch.setattr(os, "pwrite", pwrite)
    monkeypatch.setattr(os, "fsync", fsync)
    table.write([1, 2, 3, 50, 90, 91], np.zeros((6, 40), dtype=np.uint8))
    # The records, durable; then the header that commits them, durable; then the rows (3 runs).
    assert events == [("pwrite", "journal"), ("fsync", "journal")] * 2 + [("pwrite", "table")] * 3
    events.clear()
    table.write([2, 3], np.ones((2, 40), dtype=np.uint8))  # journaled already: no journal I/O
    assert events == [("pwrite", "table")]
    table.close()


def test_bad_ids_and_rows_are_refused(tmp_path):
    table, init = make_table(tmp_path / "t", num_rows=50, row_bytes=40)
    row = np.zeros((1, 40), dtype=np.uint8)
    with pytest.raises(IndexError, match="out of range"):
        table.read([50])
    with pytest.raises(IndexError, match="row id 50 is out of range: the table has 50 rows"):
        table.write([50], row)
    with pytest.raises(IndexError, match="row id -1"):
        table.write([-1], row)
    with pytest.raises(ValueError, match="row id 7 appears more than once"):
        table.write([7, 3, 7], np.zeros((3, 40), dtype=np.uint8))
    with pytest.raises(ValueError, match=r"rows must be uint8 of shape \(1, 40\)"):
        table.write([1], np.zeros((1, 40), dtype=np.float32))
    with pytest.raises(ValueError, match=r"rows must be uint8 of shape \(2, 40\)"):
        table.write([1, 2], row)
    with pytest.raises(TypeError, match="integers"):
        table.write([1.5], row)
    table.write([], np.zeros((0, 40), dtype=np.uint8))
    np.testing.assert_array_equal(all_rows(table), init)  # nothing refused was written
    assert table.write_counters()["journal_rows"] == 0
    table.close()
    with pytest.raises(RuntimeError, match="closed"):
        table.write([1], row)


# -- generations and recovery ------------------------------------------------------------------------------------

def test_checkpointed_rows_survive_and_later_ones_roll_back(tmp_path):
    path = tmp_path / "t"
    rng = np.random.default_rng(4)
    table, init = make_table(path)
    committed = init.copy()
    ids = rng.permutation(200)[:80]
    committed[ids] = random_rows(rng, 80, 40)
    table.write(ids, committed[ids])
    checkpoint(table)
    assert (table.generation, recorded_generation(path)) == (1, 1)
    table.write(np.arange(0, 200, 3), random_rows(rng, 67, 40))  # generation 1, never checkpointed
    table.close()
    table = EmbeddingTable.open(path)
    assert table.generation == 1
    np.testing.assert_array_equal(all_rows(table), committed)
    assert sorted(os.listdir(path)) == [".lsm-gnn.lock", "table.bin", "table.json", "undo.0.log"]
    table.close()


def journal_records(ids, fill: int, row_bytes: int = 40) -> np.ndarray:
    """Intact journal records (right crc) of ``ids`` whose before-images are all ``fill``."""
    records = np.zeros(len(ids), dtype=record_dtype(row_bytes))
    records["id"], records["row"] = ids, fill
    for record, raw in zip(records, records.view(np.uint8).reshape(len(ids), -1)):
        record["crc"] = zlib.crc32(raw[12:].tobytes(), zlib.crc32(raw[:8].tobytes()))
    return records


def commit(journal, records) -> None:
    """Appends intact ``records`` to ``journal`` and rewrites its header to commit them, as a writer does."""
    raw = journal.read_bytes()
    _, _, row_bytes, generation, count, chain, _ = HEADER.unpack(raw[:HEADER.size])
    body = raw[HEADER.size:HEADER.size + count * record_dtype(row_bytes).itemsize] + records.tobytes()
    journal.write_bytes(journal_header(row_bytes, generation, count + len(records), zlib.crc32(records.tobytes(),
                                                                                              chain)) + body)


def test_records_after_the_last_commit_are_ignored(tmp_path):
    """A crash between appending records and committing them: no row they protect was overwritten."""
    path = tmp_path / "t"
    rng = np.random.default_rng(5)
    table, init = make_table(path)
    table.write([10, 11, 12], random_rows(rng, 3, 40))
    table.close()
    garbage = journal_records([20, 21], fill=0xAB)
    garbage["crc"][0] ^= 1  # a bad record, then an intact one after it
    with open(path / "undo.0.log", "ab") as fh:
        fh.write(garbage.tobytes())
        fh.write(garbage.tobytes()[:30])  # and a torn tail
    table = EmbeddingTable.open(path)
    np.testing.assert_array_equal(all_rows(table), init)
    assert sorted(os.listdir(path)) == [".lsm-gnn.lock", "table.bin", "table.json", "undo.0.log"]
    assert os.path.getsize(path / "undo.0.log") == HEADER.size
    table.close()


def test_a_row_journaled_twice_gets_its_first_before_image(tmp_path):
    path = tmp_path / "t"
    table, init = make_table(path)
    table.write([7], random_rows(np.random.default_rng(6), 1, 40))
    table.close()
    commit(path / "undo.0.log", journal_records([7], fill=0xCD))
    table = EmbeddingTable.open(path)
    np.testing.assert_array_equal(all_rows(table), init)
    table.close()


def flip(offset: int):
    def damage(journal):
        raw = bytearray(journal.read_bytes())
        raw[offset] ^= 0x10
        journal.write_bytes(bytes(raw))
    return damage


def swap_first_two_records(journal):
    raw = journal.read_bytes()
    size = record_dtype(40).itemsize
    first, second = raw[HEADER.size:HEADER.size + size], raw[HEADER.size + size:HEADER.size + 2 * size]
    journal.write_bytes(raw[:HEADER.size] + second + first + raw[HEADER.size + 2 * size:])


RECORD = record_dtype(40).itemsize


@pytest.mark.parametrize("damage,message", [
    (flip(HEADER.size + RECORD + 20), r"record 1 of 6 is damaged"),  # a byte of a row
    (flip(HEADER.size + 2 * RECORD + 1), r"record 2 of 6 is damaged"),  # a byte of an id
    (flip(20), "header is damaged"),
    (lambda j: os.truncate(j, HEADER.size + 3 * RECORD + 7), "cut short: its header commits 6 records, the file "
                                                               "holds 3"),
    (lambda j: os.truncate(j, HEADER.size), "cut short: its header commits 6 records, the file holds 0"),
    (lambda j: os.truncate(j, 0), "shorter than its header"),
    (lambda j: os.truncate(j, 20), "shorter than its"),
    (os.unlink, "undo.0.log is missing, but .*table.json records 1 writing rank"),
    (swap_first_two_records, "do not match the checksum its header commits"),
])
def test_a_damaged_or_missing_journal_is_refused_and_nothing_is_applied(tmp_path, damage, message):
    """Rows were overwritten under the journal: without all of it the committed table cannot be rebuilt, so no
    recovery is tried (a partly applied journal would pass off a mixed table as the checkpoint's)."""
    path = tmp_path / "t"
    rng = np.random.default_rng(8)
    table, init = make_table(path)
    table.write([3, 4, 5], random_rows(rng, 3, 40))
    table.write([40, 41, 42], random_rows(rng, 3, 40))
    table.close()
    written = (path / "table.bin").read_bytes()
    damage(path / "undo.0.log")
    with pytest.raises(TableError, match=message) as info:
        EmbeddingTable.open(path)
    assert "undo.0.log" in str(info.value) and "delete the table directory" in str(info.value)
    assert (path / "table.bin").read_bytes() == written  # nothing applied


def test_a_journal_of_each_writing_rank_is_required(tmp_path):
    path = tmp_path / "t"
    make_table(path)[0].close()
    rank0 = EmbeddingTable.open(path, world_size=2)  # both ranks' journals exist from now on
    assert sorted(os.listdir(path)) == [".lsm-gnn.lock", "table.bin", "table.json", "undo.0.log", "undo.1.log"]
    rank1 = EmbeddingTable.open(path, rank=1, recover=False)
    rank1.write([9], np.ones((1, 40), dtype=np.uint8))
    rank0.close(), rank1.close()
    os.unlink(path / "undo.1.log")
    with pytest.raises(TableError, match="undo.1.log is missing, but .* records 2 writing rank"):
        EmbeddingTable.open(path)


def test_an_empty_journal_of_the_previous_format_is_replaced(tmp_path):
    """Tables written before journals committed their records: an empty version-1 journal opens; one holding
    records is refused (the lsm-gnn that wrote it recovers it)."""
    path = tmp_path / "t"
    make_table(path)[0].close()
    fields = journal_module._V1_HEADER.pack(b"LSMUNDO1", 1, 40, 0, 0)[:24]
    v1 = journal_module._V1_HEADER.pack(b"LSMUNDO1", 1, 40, 0, zlib.crc32(fields))
    (path / "undo.0.log").write_bytes(v1)
    EmbeddingTable.open(path).close()
    assert (path / "undo.0.log").read_bytes() == journal_header(40, 0)
    (path / "undo.0.log").write_bytes(v1 + journal_records([1], fill=0).tobytes())
    with pytest.raises(TableError, match="format version 1, this lsm-gnn reads version 2"):
        EmbeddingTable.open(path)


@pytest.mark.parametrize("direct", [False, True])
def test_reads_see_writes_buffered_or_direct(tmp_path, direct):
    make_table(tmp_path / "t")[0].close()
    table = EmbeddingTable.open(tmp_path / "t", direct=direct)
    rows = random_rows(np.random.default_rng(7), 3, 40)
    table.write([0, 1, 199], rows)
    np.testing.assert_array_equal(table.read([199, 0, 1]).numpy(), rows[[2, 0, 1]])
    table.close()


def test_a_crash_after_the_checkpoint_moves_the_table_to_its_generation(tmp_path):
    """The checkpoint (generation 1) was written, set_generation was not: the journal is stale, the rows stay."""
    path = tmp_path / "t"
    table, init = make_table(path)
    rows = random_rows(np.random.default_rng(6), 5, 40)
    table.write([1, 2, 3, 4, 5], rows)
    table.sync()
    table.close()  # the crash
    table = EmbeddingTable.open(path, expect_generation=1)
    assert (table.generation, recorded_generation(path)) == (1, 1)
    np.testing.assert_array_equal(table.read([1, 2, 3, 4, 5]).numpy(), rows)
    table.write([1], rows[:1] ^ 1)
    table.close()
    np.testing.assert_array_equal(EmbeddingTable.open(path).read([1]).numpy(), rows[:1])  # generation 1 rolls back


def test_a_crash_between_set_generation_and_reset_journal_keeps_the_rows(tmp_path):
    path = tmp_path / "t"
    table, _ = make_table(path)
    rows = random_rows(np.random.default_rng(7), 2, 40)
    table.write([8, 9], rows)
    table.sync()
    table.set_generation(1)
    table.close()
    table = EmbeddingTable.open(path, expect_generation=1)
    np.testing.assert_array_equal(table.read([8, 9]).numpy(), rows)
    table.close()


def test_a_table_newer_than_the_checkpoint_is_refused(tmp_path):
    path = tmp_path / "t"
    table, _ = make_table(path)
    checkpoint(table)
    checkpoint(table)
    table.close()
    with pytest.raises(TableError, match="generation 2, newer than the checkpoint's generation 1.*cannot be rolled"):
        EmbeddingTable.open(path, expect_generation=1)
    (path / "undo.3.log").write_bytes(journal_header(40, 5))
    with pytest.raises(TableError, match="undo.3.log is a journal of generation 5, newer than the checkpoint's "
                                         "generation 2"):
        EmbeddingTable.open(path)
    assert recorded_generation(path) == 2 and (path / "undo.3.log").exists()  # refused before changing anything


def test_ranks_keep_their_own_journals(tmp_path):
    path = tmp_path / "t"
    rng = np.random.default_rng(8)
    rank0, init = make_table(path)
    rank1 = EmbeddingTable.open(path, rank=1, recover=False, expect_generation=0)
    committed = init.copy()
    committed[:10], committed[100:110] = random_rows(rng, 10, 40), random_rows(rng, 10, 40)
    rank0.write(np.arange(10), committed[:10])
    rank1.write(np.arange(100, 110), committed[100:110])
    with pytest.raises(RuntimeError, match="rank 0 only"):
        rank1.set_generation(1)
    rank0.sync(), rank1.sync()
    with pytest.raises(TableError, match="call set_generation\\(1\\) on rank 0 first"):
        rank1.reset_journal(1)
    checkpoint(rank0, rank1)
    rank0.write(np.arange(5, 15), random_rows(rng, 10, 40))
    rank1.write(np.arange(105, 115), random_rows(rng, 10, 40))
    rank0.close(), rank1.close()
    with pytest.raises(TableError, match="undo.1.log still holds before-images of generation 1.*recover=True"):
        EmbeddingTable.open(path, rank=1, recover=False)
    with pytest.raises(TableError, match="records generation 1, the checkpoint generation 2"):
        EmbeddingTable.open(path, rank=1, recover=False, expect_generation=2)
    rank0 = EmbeddingTable.open(path)
    rank1 = EmbeddingTable.open(path, rank=1, recover=False)
    np.testing.assert_array_equal(all_rows(rank1), committed)
    rank0.close(), rank1.close()


def test_a_row_in_two_ranks_journals_is_refused(tmp_path):
    path = tmp_path / "t"
    rank0, _ = make_table(path)
    rank1 = EmbeddingTable.open(path, rank=1, recover=False)
    rank0.write([3], np.ones((1, 40), dtype=np.uint8))
    rank1.write([3], np.full((1, 40), 2, dtype=np.uint8))
    rank0.close(), rank1.close()
    with pytest.raises(TableError, match="another rank's journal.*disjoint rows"):
        EmbeddingTable.open(path)


# -- crashes in another process -----------------------------------------------------------------------------------

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "table_crash_worker.py")
CRASHED = 71  # the worker's exit code where it "crashed" as told


def crash_in_worker(path, where: str, **writes) -> None:
    """Runs tests/table_crash_worker.py, which must die where told (a real process exit inside write())."""
    np.savez(os.path.join(os.path.dirname(path), "writes.npz"), **writes)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, WORKER, str(path), where, os.path.join(os.path.dirname(path), "writes.npz")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == CRASHED, f"the worker did not crash where told: {done.returncode}\n{done.stderr}"


@pytest.mark.parametrize("where,row_bytes", [  # about a second each (a Python process)
    ("after journal fsync", 40), ("after journal commit", 40), ("halfway through the rows", 40),
    ("halfway through the rows", 1000),
    ("tearing a row", 40), ("tearing a row", 1000), ("tearing the journal", 1000),
])
def test_a_process_killed_in_write_leaves_the_last_checkpoint(tmp_path, where, row_bytes):
    path = tmp_path / "t"
    rng = np.random.default_rng(9)
    table, init = make_table(path, row_bytes=row_bytes)
    committed = init.copy()
    committed[::7] = random_rows(rng, len(committed[::7]), row_bytes)
    table.write(np.arange(0, 200, 7), committed[::7])
    checkpoint(table)
    table.close()
    first = rng.permutation(200)[:60]  # overwritten in full before the crash
    # Runs of consecutive ids and single rows, some already journaled by `first`.
    ids = np.unique(np.concatenate([np.arange(20, 40), np.arange(100, 130), rng.permutation(200)[:50]]))
    crash_in_worker(path, where, first_ids=first, first_rows=random_rows(rng, 60, row_bytes), ids=ids,
                    rows=random_rows(rng, len(ids), row_bytes))
    table = EmbeddingTable.open(path, expect_generation=1)
    np.testing.assert_array_equal(all_rows(table), committed)
    table.close()


# -- a model of the committed table ---------------------------------------------------------------------------------

class SimulatedCrash(Exception):
    pass


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.one_of(
    st.tuples(st.just("write"), st.lists(st.integers(0, 47), min_size=1, max_size=30, unique=True)),
    st.tuples(st.just("checkpoint"), st.just([])),
    st.tuples(st.just("crash"), st.lists(st.integers(0, 47), min_size=1, max_size=30, unique=True),
              st.integers(1, 12)),
), max_size=12), row_bytes=st.sampled_from([24, 512]))
def test_recovery_always_returns_the_committed_table(steps, row_bytes):
    """Random writes, checkpoints and crashes (an I/O call that tears its buffer, then the process "dies"):
    reopening always gives the table as of the last checkpoint."""
    rng = np.random.default_rng(len(steps))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "t")
        table, committed = make_table(path, num_rows=48, row_bytes=row_bytes, chunk_rows=20)
        current = committed.copy()
        for op, ids, *crash_after in steps:
            ids = np.array(ids, dtype=np.int64)
            if op == "write":
                rows = random_rows(rng, len(ids), row_bytes)
                table.write(ids, rows)
                current[ids] = rows
                np.testing.assert_array_equal(all_rows(table), current)
            elif op == "checkpoint":
                checkpoint(table)
                committed = current.copy()
            else:
                with pytest.raises(SimulatedCrash), failing_pwrite(after=crash_after[0]):
                    table.write(ids, random_rows(rng, len(ids), row_bytes))
                    raise SimulatedCrash  # the write finished first: crash right after it
                table.close()
                table = EmbeddingTable.open(path, expect_generation=table.generation)
                np.testing.assert_array_equal(all_rows(table), committed)
                current = committed.copy()
        table.close()
        table = EmbeddingTable.open(path)
        np.testing.assert_array_equal(all_rows(table), committed)
        table.close()


class failing_pwrite:
    """A context in which the ``after``-th ``os.pwrite`` writes half its buffer and raises SimulatedCrash."""

    def __init__(self, after: int):
        self.after, self.calls, self.real = after, 0, os.pwrite

    def __enter__(self):
        def pwrite(fd, data, offset):
            self.calls += 1
            if self.calls == self.after:
                view = memoryview(data).cast("B")
                self.real(fd, view[:max(1, view.nbytes // 2)], offset)
                raise SimulatedCrash
            return self.real(fd, data, offset)

        os.pwrite = pwrite
        return self

    def __exit__(self, *exc):
        os.pwrite = self.real


# -- bad tables and bad arguments --------------------------------------------------------------------------------

def edit_meta(path, **changes) -> None:
    meta_path = os.path.join(path, "table.json")
    with open(meta_path) as fh:
        meta = json.load(fh)
    meta.update(changes)
    with open(meta_path, "w") as fh:
        json.dump(meta, fh)


@pytest.fixture
def closed_table(tmp_path):
    table, _ = make_table(tmp_path / "t", num_rows=100, row_bytes=40)
    table.close()
    return tmp_path / "t"


def test_a_missing_directory_is_named(tmp_path):
    with pytest.raises(TableError, match="nope: no embedding table here.*EmbeddingTable.create"):
        EmbeddingTable.open(tmp_path / "nope")
    (tmp_path / "file").write_text("")
    with pytest.raises(TableError, match="file: no embedding table here"):
        EmbeddingTable.open(tmp_path / "file")


@pytest.mark.parametrize("damage,message", [
    (lambda p: os.unlink(p / "table.json"), "table.json is missing"),
    (lambda p: (p / "table.json").write_text("{not json"), "table.json is not valid JSON"),
    (lambda p: (p / "table.json").write_text("[1, 2]"), "format is 'list', expected 'lsm-gnn-embedding-table'"),
    (lambda p: edit_meta(p, format="lsm-gnn-dataset"), "format is 'lsm-gnn-dataset'"),
    (lambda p: edit_meta(p, version=9), "format version 9, this lsm-gnn reads version 1"),
    (lambda p: edit_meta(p, num_rows="100"), "num_rows must be an integer >= 1, got '100'"),
    (lambda p: edit_meta(p, generation=-1), "generation must be an integer >= 0"),
    (lambda p: edit_meta(p, layout=[1]), "layout must be a JSON object"),
    (lambda p: edit_meta(p, row_stride=48), "row_stride=48 is neither a multiple of 512 nor a power of two"),
    (lambda p: edit_meta(p, file_bytes=4096), "file_bytes=4096 disagrees with num_rows=100 rows of row_stride=64"),
    (lambda p: edit_meta(p, num_rows=1000, file_bytes=65536), "table.bin is truncated: 8192 bytes"),
    (lambda p: os.truncate(p / "table.bin", 4096), "table.bin is truncated: 4096 bytes"),
    (lambda p: os.truncate(p / "table.bin", 12288), "table.bin is longer than its metadata says"),
    (lambda p: os.unlink(p / "table.bin"), "table.bin is missing"),
    (lambda p: (p / "undo.0.log").write_bytes(b"LSMUNDO2" + bytes(32)), "undo.0.log: the undo journal is not an undo "
                                                                         "journal"),
    (lambda p: (p / "undo.0.log").write_bytes(b"LSMUNDO1" + bytes(32)), "undo.0.log: undo journal format version 0"),
    (lambda p: (p / "undo.0.log").write_bytes(b"LSM"), "undo.0.log: the undo journal is shorter than its"),
    (lambda p: edit_meta(p, writers=0), "writers must be an integer >= 1"),
    (lambda p: (p / "undo.0.log").write_bytes(journal_header(24, 0)), "holds rows of 24 bytes, the table rows of 40"),
])
def test_a_damaged_table_is_named_with_the_fix(closed_table, damage, message):
    damage(closed_table)
    with pytest.raises(TableError, match=message) as info:
        EmbeddingTable.open(closed_table)
    assert str(closed_table) in str(info.value)


def test_create_refuses_an_existing_path_and_bad_arguments(tmp_path):
    rows = lambda start, stop: np.zeros((stop - start, 8), dtype=np.uint8)  # noqa: E731
    (tmp_path / "taken").mkdir()
    with pytest.raises(TableError, match="taken already exists; open it with EmbeddingTable.open, or delete it"):
        EmbeddingTable.create(tmp_path / "taken", 10, 8, rows, layout={})
    with pytest.raises(ValueError, match="num_rows must be a positive integer, got 0"):
        EmbeddingTable.create(tmp_path / "t", 0, 8, rows, layout={})
    with pytest.raises(ValueError, match="layout must be JSON serializable"):
        EmbeddingTable.create(tmp_path / "t", 10, 8, rows, layout={"f": object()})
    with pytest.raises(ValueError, match=r"init\(4, 8\) must return a uint8 array of shape \(4, 8\).*float64"):
        EmbeddingTable.create(tmp_path / "t", 10, 8, lambda s, e: rows(s, e) if s == 0 else np.zeros((e - s, 8)),
                              layout={}, chunk_rows=4)
    assert sorted(os.listdir(tmp_path)) == ["taken"]  # a failed create leaves nothing, not even its temporary
    table = EmbeddingTable.create(tmp_path / "t", 10, 8, lambda s, e: torch.ones((e - s, 8), dtype=torch.uint8),
                                  layout={}, progress=True)
    assert table.read([9]).tolist() == [[1] * 8]
    with pytest.raises(ValueError, match="generation must be an integer >= the current generation 0"):
        table.set_generation(-1)
    table.close()


@pytest.mark.parametrize("native_copy", [True, False])
def test_a_snapshot_is_a_table_of_its_own_at_the_given_generation(tmp_path, monkeypatch, native_copy):
    from lsm_gnn.storage.table import snapshot_table

    if not native_copy:  # the buffered copy where copy_file_range is missing
        monkeypatch.delattr(os, "copy_file_range", raising=False)
    table, init = make_table(tmp_path / "t")
    rng = np.random.default_rng(1)
    changed = random_rows(rng, 5, 40)
    table.write(torch.arange(5), torch.from_numpy(changed))
    table.sync()
    snapshot_table(table.path, str(tmp_path / "copy"), generation=7)
    table.write(torch.arange(5, 10), torch.from_numpy(random_rows(rng, 5, 40)))  # the source trains on
    table.sync()
    copy = EmbeddingTable.open(tmp_path / "copy", expect_generation=7)
    expected = init.copy()
    expected[:5] = changed
    assert copy.generation == 7 and np.array_equal(all_rows(copy), expected)
    copy.close()
    with pytest.raises(TableError, match="already exists"):
        snapshot_table(table.path, str(tmp_path / "copy"), generation=8)
    table.close()
