"""`lsm-gnn train` that kills itself with SIGKILL at a named point, for the tests of a kill around a checkpoint or
an evaluation (tests/test_resume.py):

    python tests/kill_worker.py WHERE N TRAIN_ARGS...

WHERE: ``checkpoint write`` (as call N+1 of the checkpoint's atomic write begins: nothing of it in place),
``checkpoint written`` (just after write N+1 renamed its file into place), ``evaluation`` (as evaluation N+1
starts) or ``evaluated`` (as it returns, before model selection sees its result). A SIGKILL runs no handler and
no ``finally``: what is on disk then is what a resumed run finds.
"""
import os
import signal
import sys

from lsm_gnn.training import checkpoint_files as checkpoint
from lsm_gnn.cli import main
from lsm_gnn.training.trainer import Trainer

POINTS = ("checkpoint write", "checkpoint written", "evaluation", "evaluated")


def kill() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def killing(original, after_calls: int, before: bool):
    calls = {"n": 0}

    def wrapped(*args, **kwargs):
        calls["n"] += 1
        last = calls["n"] > after_calls
        if last and before:
            kill()
        result = original(*args, **kwargs)
        if last:
            kill()
        return result
    return wrapped


if __name__ == "__main__":
    where, after_calls, train_args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    if where not in POINTS:
        sys.exit(f"kill_worker: WHERE must be one of {', '.join(POINTS)}, got {where!r}")
    if where.startswith("checkpoint"):
        checkpoint.atomic_write_bytes = killing(checkpoint.atomic_write_bytes, after_calls,
                                                before=where == "checkpoint write")
    else:
        Trainer.evaluate = killing(Trainer.evaluate, after_calls, before=where == "evaluation")
    sys.exit(main(["train", *train_args]))
