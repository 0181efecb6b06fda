"""A process that dies inside EmbeddingTable.write (run by tests/test_embedding_table.py):

    python tests/table_crash_worker.py TABLE_DIR WHERE WRITES.npz

Opens the table, writes ``first_ids``/``first_rows`` in full, then writes ``ids``/``rows`` and ends with
``os._exit(CRASHED)`` at WHERE: "after journal fsync" (the before-images are durable, not yet committed),
"after journal commit" (the header that commits them is durable too, no row is overwritten),
"halfway through the rows" (before the 4th row pwrite), "tearing a row" (the 3rd row pwrite writes half a
row), "tearing the journal" (the journal append writes half its records). Exits 1 if it never got there.
"""
import os
import sys

import numpy as np

from lsm_gnn.storage import table_files
from lsm_gnn.storage.table import EmbeddingTable

CRASHED = 71


def main(path: str, where: str, writes: str) -> int:
    data = np.load(writes)
    table = EmbeddingTable.open(path)
    table.write(data["first_ids"], data["first_rows"])
    real_pwrite, real_fsync = os.pwrite, os.fsync
    row_calls = journal_syncs = 0

    def pwrite(fd, buffer, offset):
        nonlocal row_calls
        view = memoryview(buffer).cast("B")
        if fd == table._journal_fd and where == "tearing the journal":
            real_pwrite(fd, view[:view.nbytes // 2], offset)
            os._exit(CRASHED)
        if fd == table._fd:
            row_calls += 1
            if where == "tearing a row" and row_calls == 3:
                real_pwrite(fd, view[:table.row_bytes // 2], offset)
                os._exit(CRASHED)
            if where == "halfway through the rows" and row_calls == 4:
                os._exit(CRASHED)
        return real_pwrite(fd, buffer, offset)

    def fsync(fd):
        nonlocal journal_syncs
        real_fsync(fd)
        if fd == table._journal_fd:
            journal_syncs += 1
            if where == "after journal fsync" or (where == "after journal commit" and journal_syncs == 2):
                os._exit(CRASHED)

    table_files.NATIVE_WRITES = False  # rows through os.pwrite too, so the crash can fall between two of them
    os.pwrite, os.fsync = pwrite, fsync  # the table's modules call them through the os module
    table.write(data["ids"], data["rows"])
    return 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
