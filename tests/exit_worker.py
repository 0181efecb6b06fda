"""One rank of the exit test (run by tests/test_launchers.py under torchrun): `lsm-gnn train`, then the threads
the process still has when the interpreter is about to finalize, written to OUT_DIR/threads-RANK.json.

    python -m torch.distributed.run --nproc_per_node=2 tests/exit_worker.py OUT_DIR TRAIN_ARGS...

A thread left running native code that takes the GIL (gloo's workers release a finished collective's tensors,
and with them Python objects) aborts the process at exit when it takes the GIL while the interpreter finalizes:
`terminate called without an active exception`, now and then. No such thread may outlive the run.
"""
import json
import os
import sys
import threading

from lsm_gnn.cli import main


def native_threads() -> list[str]:
    """The names of this process's threads (Linux), the main thread's included."""
    names = []
    for tid in sorted(os.listdir("/proc/self/task")):
        try:
            with open(f"/proc/self/task/{tid}/comm") as fh:
                names.append(fh.read().strip())
        except OSError:  # the thread ended meanwhile
            pass
    return names


if __name__ == "__main__":
    out_dir, train_args = sys.argv[1], sys.argv[2:]
    code = main(["train", *train_args])
    report = {"code": code, "python": [t.name for t in threading.enumerate()], "native": native_threads()}
    with open(os.path.join(out_dir, f"threads-{os.environ['RANK']}.json"), "w") as fh:
        json.dump(report, fh)
    sys.exit(code)
