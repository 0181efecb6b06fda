"""Every command README.md and the pages under docs/ show a user runs as written, on small generated data.

The commands are read from the documents' code blocks (``lsm-gnn ...``, ``python -m lsm_gnn ...``,
``launch/*.sh ...``, after any ``VAR=value`` prefix), so a new or changed command is tested without
touching this file. Each document runs in a directory of its own (``configs/`` linked in), its
``prepare`` commands first, then the rest in the order shown, so one command can read what an earlier
one wrote (a checkpoint, a dataset). Only these change, all listed below:

- sizes: graphs of a few thousand nodes and 16 features (:data:`SMALL`), so a run takes seconds; a plan's
  calibration times 4 training steps and 0.1 s of reads per batch size (:data:`SHORT_CALIBRATION`), not 32 and
  0.5 s: on a small graph the calibration was most of a plan's minute;
- :data:`PLACEHOLDERS`: paths of the machine a command was measured on;
- inputs a command converts (``feat.npy``...) are generated, and so is a dataset a document's commands
  read but none of them writes (a synthetic graph);
- a cache share chosen for the documented graph can be too small for a graph of 2,000 nodes (a batch
  covers most of it): such a run stops before training with the capacity it needs (``lsm_gnn.sizing``;
  ``cache.capacity`` or ``model.node_embedding.capacity``), and is run again with that advice, as its
  user would; the advice must work.

:data:`SKIP` names the commands that need what a test cannot have (a download, two hosts, minutes),
each with its reason; :data:`EXPECTED_ERRORS` the ones shown failing on purpose.
"""
import os
import re
import shlex
import subprocess
import sys
import time
from glob import glob

import numpy as np
import pytest

from lsm_gnn.testing import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", *sorted(os.path.relpath(p, ROOT)
                         for p in glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))]
_ENV = r"(?:[A-Z_][A-Z0-9_]*=\S*\s+)*"
COMMAND = re.compile(rf"^{_ENV}(?:lsm-gnn|python3? -m lsm_gnn|launch/[\w.]+\.sh)\s")

SMALL = {"--num-nodes": "2000", "--num-users": "300", "--num-items": "200", "--num-papers": "800",
         "--feature-dim": "16"}
SHORT_CALIBRATION = ["--train-steps", "4", "--storage-seconds", "0.1"]
PLACEHOLDERS = {
    "/tmp/lpdoc/recsys": "data/recsys",
    "/work/bench-data/": "data/",
    "/tmp/lsm-gnn-bench/": "data/",
    "/tmp/slurm-g": "data/slurm-g",
}

SKIP = {
    "lsm-gnn prepare folder --src /data/igb/full --out data/igb":
        "needs an IGB download; tests/test_convert.py converts generated IGB and OGB folders",
    "lsm-gnn prepare hetero igbh /data/igbh --size small --out data/igbh-small":
        "needs an IGBH download; tests/test_convert_hetero.py converts a generated one",
    "lsm-gnn train configs/ablation.yaml --grid dataset=data/rmat1m":
        "72 runs of 200 iterations; tests/test_cli.py runs a grid",
    "lsm-gnn train configs/demo.yaml dataset=data/small cache.capacity=30% kernels=triton":
        "the Triton kernels want a GPU (the interpreter on a CPU takes minutes); tests/test_kernels_*.py",
    "NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 NPROC=4 launch/torchrun.sh configs/default.yaml dataset=/scratch/igb":
        "two hosts; tests/test_multinode.py runs two virtual hosts",
    "NNODES=2 NODE_RANK=1 MASTER_ADDR=node0 NPROC=4 launch/torchrun.sh configs/default.yaml dataset=/scratch/igb":
        "two hosts; tests/test_multinode.py runs two virtual hosts",
    "NPROC=8 HOSTS=node0:4,node1:4 MASTER_ADDR=node0 launch/mpirun.sh configs/default.yaml dataset=/scratch/igb":
        "two hosts of 4 ranks",
    "NPROC=2 launch/torchrun.sh configs/default.yaml dataset=data/igb":
        "README.md's launch/torchrun.sh command is the same 2-rank run (20 s): once is enough here",
    "NPROC=2 launch/mpirun.sh configs/default.yaml dataset=data/igb":
        "the same run as launch/torchrun.sh's, started by Open MPI; tests/test_launchers.py runs it",
    "lsm-gnn plot docs/results/plan_validation_quiet.json --out docs/images/plan_validation_quiet.png "
    "--title 'quiet machine (load 0.4-1.1):'":
        "draws the repository's docs/results/plan_validation_quiet.json; tests/test_cli_plot.py draws that file",
}
EXPECTED_ERRORS = {
    "lsm-gnn train configs/demo.yaml cache.polcy=rr": "unknown config key 'cache.polcy'",
    # docs/training.md's first run: the default cache is too small for a small graph, and says what to set
    "lsm-gnn train dataset=data/mine model.kind=sage sampler.batch_size=512 'sampler.fanouts=[10,5]' "
    "train.epochs=30 train.early_stopping.patience=3 checkpoint.dir=runs/mine": "lsm-gnn: error: cache.capacity=1.5%",
}


def documented_commands() -> list[tuple[str, str]]:
    """(document, command) of every command in a code block, in order, each command once."""
    found, seen = [], set()
    for doc in DOCS:
        with open(os.path.join(ROOT, doc)) as fh:
            lines = fh.read().splitlines()
        in_block, pending = False, ""
        for line in lines:
            if line.strip().startswith("```"):
                in_block, pending = not in_block, ""
                continue
            if not in_block:
                continue
            text = (pending + " " + line.strip()).strip() if pending else line.strip()
            if text.endswith("\\"):
                pending = text[:-1].rstrip()
                continue
            pending = ""
            text = text[2:] if text.startswith("$ ") else text
            if COMMAND.match(text):
                command = shlex.join(shlex.split(text, comments=True))
                if command not in seen:
                    seen.add(command)
                    found.append((doc, command))
    return found


COMMANDS = documented_commands()


def test_the_lists_name_only_commands_the_documents_show():
    shown = {command for _, command in COMMANDS}
    assert not (set(SKIP) | set(EXPECTED_ERRORS)) - shown  # a renamed or removed command: update the list
    assert len(COMMANDS) > 20  # the reader found the blocks


def _argv(command: str, cwd: str) -> tuple[list[str], dict]:
    """The command's argv on small data and its environment."""
    tokens = shlex.split(command)
    env = dict(os.environ, HOME=cwd, LSM_GNN_TIMEOUT_S="120", PYTHON=sys.executable,
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    while re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[0]):
        key, value = tokens.pop(0).split("=", 1)
        env[key] = value
    if tokens[0].startswith("launch/"):
        env.setdefault("MASTER_PORT", str(free_port()))
        argv = ["bash", os.path.join(ROOT, tokens[0])]
        tokens = tokens[1:]
    else:  # lsm-gnn, python -m lsm_gnn: this checkout's
        argv = [sys.executable, "-m", "lsm_gnn"]
        tokens = tokens[3:] if tokens[0].startswith("python") else tokens[1:]
    for i, token in enumerate(tokens):
        if i and tokens[i - 1] in SMALL:
            token = SMALL[tokens[i - 1]]
        for old, new in PLACEHOLDERS.items():
            token = token.replace(old, new)
        argv.append(token)
    if argv[1:4] == ["-m", "lsm_gnn", "plan"] and not set(SHORT_CALIBRATION[::2]) & set(argv):
        argv += SHORT_CALIBRATION
    return argv, env


def _write_inputs(cwd: str) -> None:
    """The arrays ``lsm-gnn prepare npy`` converts (500 nodes, 8 features, 4 classes) and the interaction log
    ``lsm-gnn prepare interactions`` converts (docs/link_prediction.md's columns: 300 users, 200 items)."""
    rng = np.random.default_rng(0)
    np.save(os.path.join(cwd, "feat.npy"), rng.standard_normal((500, 8)).astype(np.float32))
    np.save(os.path.join(cwd, "edge_index.npy"), rng.integers(0, 500, (2, 3000)))
    np.save(os.path.join(cwd, "y.npy"), rng.integers(0, 4, 500))
    users, items = rng.integers(0, 300, 3000), rng.integers(0, 200, 3000)
    for name in ("interactions.csv", "log.csv"):  # docs/link_prediction.md's name, README.md's
        with open(os.path.join(cwd, name), "w") as fh:
            fh.write("user_id,item_id,rating,timestamp\n")
            fh.writelines(f"user{u:05d},sku-{i:04d},{1 + (u + i) % 5},{1_700_000_000 + 37 * k}\n"
                          for k, (u, i) in enumerate(zip(users, items)))


def _datasets_read(argv: list[str]) -> list[str]:
    paths = [a.split("=", 1)[1] for a in argv if a.startswith("dataset=")]
    return paths + [a for a in argv if a.startswith("data/")]


def _run(argv, env, cwd):
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.beside
@pytest.mark.parametrize("doc", sorted({doc for doc, _ in COMMANDS}))
def test_every_documented_command_runs(doc, tmp_path):
    cwd = str(tmp_path)
    os.symlink(os.path.join(ROOT, "configs"), os.path.join(cwd, "configs"))
    _write_inputs(cwd)
    commands = [c for d, c in COMMANDS if d == doc and c not in SKIP]
    prepares = [c for c in commands if " prepare " in f" {c} "]
    written = {a for c in prepares for a in _argv(c, cwd)[0] if a.startswith("data/")}
    failures = []
    for command in prepares + [c for c in commands if c not in prepares]:
        argv, env = _argv(command, cwd)
        for path in _datasets_read(argv):
            if path.startswith("data/") and path not in written:  # read here, written by no command here
                _run([sys.executable, "-m", "lsm_gnn", "prepare", "synthetic", "--out", path, "--num-nodes",
                      "2000", "--feature-dim", "16", "--no-progress"], env, cwd).check_returncode()
                written.add(path)
        start = time.perf_counter()
        result = _run(argv, env, cwd)
        expected = EXPECTED_ERRORS.get(command)
        for _ in range(0 if expected else 3):  # a share for the documented graph, too small here: follow the advice
            advice = re.search(r"error: ((?:cache|model\.node_embedding(?:\.\w+)?)\.capacity)=.* set (\1=[^\s,]+)",
                               result.stderr)
            if not (result.returncode and advice):
                break
            argv = argv + [advice.group(2)]  # each cache's advice in turn (the features', the embeddings')
            result = _run(argv, env, cwd)
        print(f"{time.perf_counter() - start:6.1f} s  {command}")
        if expected is not None:
            ok = result.returncode != 0 and expected in result.stderr
        else:
            ok = result.returncode == 0
        if not ok:
            failures.append(f"{command}\n  ran {shlex.join(argv)}: exit {result.returncode}\n"
                            f"{result.stdout[-1500:]}{result.stderr[-1500:]}")
    assert not failures, "\n\n".join(failures)
