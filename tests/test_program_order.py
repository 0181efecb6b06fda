"""The ``program_order`` fixture (conftest.py): Triton's interpreter really runs a launch's programs in the
chosen order, and a kernel that depends on that order gives another result under it."""
import os

import numpy as np
import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are defined: before their import
triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from lsm_gnn.kernels import triton_interpreted  # noqa: E402
from lsm_gnn.testing import ProgramOrder  # noqa: E402

pytestmark = pytest.mark.skipif(not triton_interpreted(), reason="needs Triton's interpreter (CPU tensors)")

PROGRAMS = 24


@triton.jit
def _record_turns(counter_ptr, turns_ptr):
    """Each program stores the turn it ran at: the value of a counter it bumps atomically."""
    ny = tl.num_programs(1)
    nz = tl.num_programs(2)
    program = (tl.program_id(0) * ny + tl.program_id(1)) * nz + tl.program_id(2)
    tl.store(turns_ptr + program, tl.atomic_add(counter_ptr, 1))


@triton.jit
def _chain(values_ptr):
    """Order-dependent on purpose: program i adds 1 to what program i - 1 stored, assuming it already ran."""
    i = tl.program_id(0)
    previous = tl.load(values_ptr + i - 1, mask=i > 0, other=0)
    tl.store(values_ptr + i, previous + 1)


def run_turns(grid) -> np.ndarray:
    """The turn at which each program of one launch over ``grid`` ran, by its linear program index."""
    counter = torch.zeros(1, dtype=torch.int32)
    turns = torch.full((int(np.prod(grid)),), -1, dtype=torch.int32)
    _record_turns[grid](counter, turns)
    return turns.numpy()


@pytest.mark.parametrize("program_order", ["natural", "reversed", "shuffled"], indirect=True)
@pytest.mark.parametrize("grid", [(PROGRAMS,), (2, 3, 4)])
def test_programs_run_in_the_chosen_order(program_order, grid):
    turns = run_turns(grid)
    assert sorted(turns) == list(range(PROGRAMS)), "every program runs once"
    if program_order.order == "natural":  # the interpreter's own order, left unpatched
        assert list(turns) == list(range(PROGRAMS))
    elif program_order.order == "reversed":
        assert list(turns) == list(range(PROGRAMS))[::-1]
        assert program_order.launches == 1
    else:
        assert list(turns) not in (list(range(PROGRAMS)), list(range(PROGRAMS))[::-1])
        assert list(run_turns(grid)) != list(turns), "each launch draws its own permutation"
        assert program_order.launches == 2


def test_the_alternating_order_reverses_and_shuffles_launches_in_turn():
    """The kernel tests' second run: even launches reversed, odd ones shuffled."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        ProgramOrder("alternating", 3).apply(monkeypatch)
        turns = [list(run_turns((PROGRAMS,))) for _ in range(4)]
    assert turns[0] == turns[2] == list(range(PROGRAMS))[::-1]
    for shuffled in (turns[1], turns[3]):
        assert sorted(shuffled) == list(range(PROGRAMS))
        assert shuffled not in (list(range(PROGRAMS)), list(range(PROGRAMS))[::-1])
    assert turns[1] != turns[3]


def test_shuffled_order_is_reproducible_from_its_seed():
    def shuffled_turns(seed):
        with pytest.MonkeyPatch.context() as monkeypatch:
            ProgramOrder("shuffled", seed).apply(monkeypatch)
            return [list(run_turns((PROGRAMS,))) for _ in range(2)]

    assert shuffled_turns(7) == shuffled_turns(7)
    assert shuffled_turns(7) != shuffled_turns(8)


def test_the_patch_is_gone_after_the_test():
    from triton.runtime.interpreter import InterpreterBuilder

    with pytest.MonkeyPatch.context() as monkeypatch:
        ProgramOrder("reversed").apply(monkeypatch)
        assert list(run_turns((4,))) == [3, 2, 1, 0]
    assert "in_order" not in InterpreterBuilder.set_grid_idx.__name__
    assert list(run_turns((4,))) == [0, 1, 2, 3]


@pytest.mark.parametrize("program_order", ["natural", "reversed"], indirect=True)
def test_an_order_dependent_kernel_fails_in_reversed_order(program_order):
    """What the kernel tests' reversed and shuffled runs are for: ``_chain`` counts 1, 2, 3... only when
    program i - 1 has run before program i, which the interpreter's natural order does and a GPU does not."""
    values = torch.zeros(PROGRAMS, dtype=torch.int32)
    _chain[(PROGRAMS,)](values)
    counted = values.tolist()
    if program_order.order == "natural":
        assert counted == list(range(1, PROGRAMS + 1))
    else:  # each program read a 0 its predecessor had not yet overwritten
        assert counted == [1] * PROGRAMS
