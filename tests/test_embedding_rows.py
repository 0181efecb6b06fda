"""The embedding row format and the row-wise optimizers, against torch's sparse training of nn.Embedding."""
import json

import numpy as np
import pytest
import torch

from lsm_gnn.embedding import EMBEDDING_DTYPES, OPTIMIZERS, RowLayout, RowOptimizer, initial_rows
from lsm_gnn.embedding.rows import INIT_BLOCK_ROWS

# torch's own sparse optimizers build sparse tensors that trigger this notice; it says nothing about our code.
pytestmark = pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled")

NUM, DIM, BATCH, STEPS = 40, 7, 24, 20  # odd dim: float16 rows carry 2 padding bytes
LR = {"sgd": 0.05, "adagrad": 0.1, "adam": 0.05}


def _torch_optimizer(optimizer, params, lr, initial_accumulator_value):
    if optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if optimizer == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, initial_accumulator_value=initial_accumulator_value)
    return torch.optim.SparseAdam(params, lr=lr)


def _torch_state(optimizer, torch_opt, weight):
    """torch's per-row state stacked like a row's slots: [num, slots, dim]."""
    if optimizer == "sgd":
        return torch.zeros(weight.shape[0], 0, weight.shape[1])
    names = ("sum",) if optimizer == "adagrad" else ("exp_avg", "exp_avg_sq")
    return torch.stack([torch_opt.state[weight][name] for name in names], dim=1)


def _loss(emb, target):
    return ((emb - target) ** 2).sum() + 0.1 * emb.pow(3).sum()


def _train_both(layout, weight_decay=0.0, initial_accumulator_value=0.0):
    """STEPS steps of random batches with repeated ids, through torch's nn.Embedding(sparse=True) and through rows.

    Returns (table rows after training, torch's weights, torch's state as [num, slots, dim]).
    """
    gen = torch.Generator().manual_seed(7)
    table = torch.from_numpy(initial_rows(layout, 0, NUM, seed=11, std=0.5,
                                          initial_accumulator_value=initial_accumulator_value))
    ref = torch.nn.Embedding(NUM, DIM, sparse=True)
    with torch.no_grad():
        ref.weight.copy_(layout.embeddings(table))
    torch_opt = _torch_optimizer(layout.optimizer, ref.parameters(), LR[layout.optimizer], initial_accumulator_value)
    ours = RowOptimizer(layout, LR[layout.optimizer], weight_decay=weight_decay)
    for step in range(1, STEPS + 1):
        ids = torch.randint(0, NUM // 2, (BATCH,), generator=gen) * 2 % NUM  # repeats; some rows never touched
        target = torch.randn(BATCH, DIM, generator=gen)

        torch_opt.zero_grad()
        _loss(ref(ids), target).backward()
        if weight_decay:  # torch refuses weight_decay with sparse grads; fold it into the touched rows' gradient
            grad = ref.weight.grad.coalesce()
            decayed = grad.values() + weight_decay * ref.weight.detach()[grad.indices()[0]]
            ref.weight.grad = torch.sparse_coo_tensor(grad.indices(), decayed, grad.shape)
        torch_opt.step()
        if layout.dtype == "float16":  # the fp32 computation, rounded to the table's dtype each step
            with torch.no_grad():
                ref.weight.copy_(ref.weight.half().float())

        # Ours: per-position grads summed per node, as torch's coalescing does.
        uniq, inverse = ids.unique(return_inverse=True)
        emb = layout.embeddings(table)[ids].requires_grad_()
        _loss(emb, target).backward()
        grads = torch.zeros(len(uniq), DIM).index_add_(0, inverse, emb.grad)
        table[uniq] = ours.step(table[uniq], grads, step)
    return table, ref.weight.detach(), _torch_state(layout.optimizer, torch_opt, ref.weight)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_float32_rows_train_as_torch_sparse_embedding(optimizer):
    layout = RowLayout(DIM, "float32", optimizer)
    table, weight, state = _train_both(layout)
    emb, ours_state = layout.split(table)
    assert not torch.equal(emb, layout.embeddings(initial_rows(layout, 0, NUM, seed=11, std=0.5)))
    torch.testing.assert_close(emb, weight, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours_state, state, rtol=1e-5, atol=1e-6)
    # Odd rows are never in a batch: their bytes, state included, are the initial ones.
    assert torch.equal(table[1::2], torch.from_numpy(initial_rows(layout, 0, NUM, seed=11, std=0.5))[1::2])


@pytest.mark.parametrize("dtype", EMBEDDING_DTYPES)
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_step_leaves_its_input_rows_alone_and_gives_the_bytes_of_split_then_join(dtype, optimizer):
    """A float32 step updates one copy of the rows in place; the bytes are those of updating split's
    tensors and joining them (the journal keeps the input rows as before-images, so they must not move)."""
    layout = RowLayout(DIM, dtype, optimizer)
    rows = torch.from_numpy(initial_rows(layout, 0, 6, seed=3, std=0.5))
    before = rows.clone()
    grads = torch.randn(6, DIM, generator=torch.Generator().manual_seed(0))
    out = RowOptimizer(layout, 0.1, weight_decay=0.0).step(rows, grads, 3)
    assert torch.equal(rows, before)
    emb, state = layout.split(rows)
    reference = RowOptimizer(layout, 0.1)
    if optimizer == "sgd":
        emb.add_(grads, alpha=-0.1)
    elif optimizer == "adagrad":
        state[:, 0].add_(grads.pow(2))
        emb.add_(grads / state[:, 0].sqrt().add_(reference.eps), alpha=-0.1)
    else:
        reference._adam(emb, state, grads, 3)
    assert torch.equal(out, layout.join(emb, state))


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_weight_decay_applies_to_touched_rows_as_torchs_formula(optimizer):
    layout = RowLayout(DIM, "float32", optimizer)
    table, weight, state = _train_both(layout, weight_decay=0.1)
    emb, ours_state = layout.split(table)
    torch.testing.assert_close(emb, weight, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours_state, state, rtol=1e-5, atol=1e-6)
    plain, _, _ = _train_both(layout)
    assert not torch.allclose(layout.embeddings(plain), emb)


def test_adagrad_initial_accumulator_value_matches_torch():
    layout = RowLayout(DIM, "float32", "adagrad")
    table, weight, state = _train_both(layout, initial_accumulator_value=0.3)
    emb, ours_state = layout.split(table)
    torch.testing.assert_close(emb, weight, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours_state, state, rtol=1e-5, atol=1e-6)
    assert torch.all(ours_state[1::2] == 0.3)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_float16_rows_store_rounded_embeddings_of_an_fp32_update(optimizer):
    layout = RowLayout(DIM, "float16", optimizer)
    table, weight, state = _train_both(layout)
    emb, ours_state = layout.split(table)
    assert torch.equal(emb, emb.half().float())
    # Both sides round to fp16 each step; a rounding tie broken differently is one fp16 ulp (2**-10 relative).
    torch.testing.assert_close(emb, weight, rtol=2e-3, atol=1e-4)
    torch.testing.assert_close(ours_state, state, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("dtype", EMBEDDING_DTYPES)
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_split_join_round_trip_bytes_exactly(dtype, optimizer):
    layout = RowLayout(5, dtype, optimizer)
    rows = torch.from_numpy(initial_rows(layout, 0, 9, seed=1, std=1.0))
    rows[:, layout.embedding_bytes:] = torch.randint(0, 256, (9, layout.row_bytes - layout.embedding_bytes),
                                                     dtype=torch.uint8)
    emb, state = layout.split(rows)
    assert emb.dtype == state.dtype == torch.float32
    assert emb.shape == (9, 5) and state.shape == (9, layout.state_slots, 5)
    assert torch.equal(layout.join(emb, state), rows)
    assert torch.equal(layout.embeddings(rows), emb)
    # Any contiguity: every other row, and rows that are a column slice of a wider buffer.
    assert torch.equal(layout.join(*layout.split(rows[::2])), rows[::2])
    wide = torch.zeros(9, layout.row_bytes + 3, dtype=torch.uint8)
    wide[:, 1:-2] = rows
    assert torch.equal(layout.join(*layout.split(wide[:, 1:-2])), rows)


def test_split_copies_and_join_rounds_and_zero_pads():
    layout = RowLayout(3, "float16", "adagrad")
    assert (layout.embedding_bytes, layout.row_bytes) == (8, 8 + 12)
    emb = torch.tensor([[1.0, 1 + 2 ** -12, -2.5]])
    rows = layout.join(emb, torch.full((1, 1, 3), 4.0))
    assert torch.equal(rows[:, 6:8], torch.zeros(1, 2, dtype=torch.uint8))
    assert torch.equal(layout.embeddings(rows), torch.tensor([[1.0, 1.0, -2.5]]))
    before = rows.clone()
    got_emb, got_state = layout.split(rows)
    got_emb += 1
    got_state += 1
    layout.embeddings(rows).zero_()
    assert torch.equal(rows, before)
    assert torch.equal(layout.split(layout.join(emb))[1], torch.zeros(1, 1, 3))


def test_row_bytes_per_layout():
    assert RowLayout(8, "float32", "sgd").row_bytes == 32
    assert RowLayout(8, "float32", "adagrad").row_bytes == 64
    assert RowLayout(8, "float32", "adam").row_bytes == 96
    assert RowLayout(8, "float16", "adam").row_bytes == 16 + 64
    assert RowLayout(1, "float16", "sgd").row_bytes == 4


def test_initial_rows_are_independent_of_chunking_and_depend_on_seed():
    layout = RowLayout(4, "float32", "adam")
    whole = initial_rows(layout, 0, INIT_BLOCK_ROWS + 100, seed=5, std=0.1)
    cuts = [0, 3, INIT_BLOCK_ROWS - 1, INIT_BLOCK_ROWS + 1, INIT_BLOCK_ROWS + 100]
    chunks = [initial_rows(layout, a, b, seed=5, std=0.1) for a, b in zip(cuts, cuts[1:])]
    assert np.array_equal(np.concatenate(chunks), whole)
    assert initial_rows(layout, 7, 7, seed=5, std=0.1).shape == (0, layout.row_bytes)
    other = initial_rows(layout, 0, 100, seed=6, std=0.1)
    assert not np.array_equal(other, whole[:100])
    emb, state = layout.split(whole)
    assert torch.all(state == 0)
    assert abs(emb.std().item() - 0.1) < 0.005 and abs(emb.mean().item()) < 0.005
    # Blocks differ from each other (a per-block seed, not one stream restarted).
    assert not torch.equal(emb[:100], emb[INIT_BLOCK_ROWS:INIT_BLOCK_ROWS + 100])


def test_initial_rows_float16_and_accumulator():
    layout = RowLayout(3, "float16", "adagrad")
    emb, state = layout.split(initial_rows(layout, 10, 20, seed=0, std=1.0, initial_accumulator_value=0.25))
    assert torch.equal(emb, emb.half().float())
    assert torch.all(state == 0.25)
    wide = RowLayout(3, "float32", "adagrad")
    torch.testing.assert_close(emb, wide.embeddings(initial_rows(wide, 10, 20, seed=0, std=1.0)).half().float())


def test_layout_dict_round_trips_through_json():
    layout = RowLayout(16, "float16", "adam")
    assert RowLayout.from_dict(json.loads(json.dumps(layout.as_dict()))) == layout
    assert RowLayout.from_dict({"dim": 4}) == RowLayout(4)


@pytest.mark.parametrize("kwargs, words", [
    ({"dim": 0}, ["RowLayout.dim", "0", "positive"]),
    ({"dim": 2.0}, ["RowLayout.dim", "2.0"]),
    ({"dim": 4, "dtype": "bfloat16"}, ["RowLayout.dtype", "bfloat16", "float16"]),
    ({"dim": 4, "optimizer": "rmsprop"}, ["RowLayout.optimizer", "rmsprop", "adagrad"]),
    ({"dim": 4, "dtype": ["float32"]}, ["RowLayout.dtype", "['float32']"]),
])
def test_bad_layout_names_field_value_and_choices(kwargs, words):
    with pytest.raises(ValueError) as err:
        RowLayout(**kwargs)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize("d, words", [
    ({"dim": 4, "dtype": "float32", "optimizer": "sgd", "row_bytes": 17}, ["row_bytes", "17", "16"]),
    ({"dim": 4, "width": 3}, ["unknown", "width"]),
    ({"dtype": "float32"}, ["missing", "dim"]),
])
def test_from_dict_refuses_mismatched_or_unknown(d, words):
    with pytest.raises(ValueError) as err:
        RowLayout.from_dict(d)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize("optimizer, kwargs, words", [
    ("sgd", {"lr": 0.0}, ["lr", "0.0"]),
    ("adagrad", {"lr": float("nan")}, ["lr", "nan"]),
    ("sgd", {"lr": 0.1, "eps": 1e-8}, ["sgd takes no eps"]),
    ("adam", {"lr": 0.1, "eps": 0.0}, ["eps", "adam", "> 0"]),
    ("adagrad", {"lr": 0.1, "eps": -1.0}, ["eps", "adagrad", ">= 0"]),
    ("adam", {"lr": 0.1, "betas": (0.9, 1.0)}, ["betas", "[0, 1)"]),
    ("adam", {"lr": 0.1, "betas": 0.9}, ["betas"]),
    ("adam", {"lr": 0.1, "weight_decay": 0.01}, ["adam", "weight_decay", "sgd or adagrad"]),
    ("sgd", {"lr": 0.1, "weight_decay": -1.0}, ["weight_decay", "-1.0"]),
])
def test_bad_hyper_parameters_raise_clearly(optimizer, kwargs, words):
    with pytest.raises(ValueError) as err:
        RowOptimizer(RowLayout(4, optimizer=optimizer), **kwargs)
    for word in words:
        assert word in str(err.value)


def test_step_refuses_bad_rows_grads_and_step():
    layout = RowLayout(4, "float32", "adam")
    opt = RowOptimizer(layout, 0.1)
    rows = torch.from_numpy(initial_rows(layout, 0, 3, seed=0, std=1.0))
    with pytest.raises(ValueError, match=r"uint8 of shape \[n, 48\].*dim=layout.row_bytes"):
        opt.step(rows[:, :40], torch.zeros(3, 4), 1)
    with pytest.raises(ValueError, match=r"uint8 of shape"):
        opt.step(rows.float(), torch.zeros(3, 4), 1)
    with pytest.raises(ValueError, match=r"grads must be a tensor of shape \[3, 4\]"):
        opt.step(rows, torch.zeros(2, 4), 1)
    with pytest.raises(ValueError, match=r"step must be an integer >= 1"):
        opt.step(rows, torch.zeros(3, 4), 0)
    assert opt.step(rows.numpy(), torch.zeros(3, 4), 1).shape == rows.shape


def test_state_dict_round_trip_and_layout_check():
    layout = RowLayout(4, "float32", "adam")
    opt = RowOptimizer(layout, 0.01, eps=1e-6, betas=(0.8, 0.99))
    saved = json.loads(json.dumps(opt.state_dict()))
    fresh = RowOptimizer(layout, 0.5)
    fresh.load_state_dict(saved)
    assert (fresh.lr, fresh.eps, fresh.betas, fresh.weight_decay) == (0.01, 1e-6, (0.8, 0.99), 0.0)
    assert RowOptimizer(layout, 0.1).eps == 1e-8 and RowOptimizer(RowLayout(4), 0.1).eps == 1e-10
    with pytest.raises(ValueError, match="saved for .*adam.*adagrad"):
        RowOptimizer(RowLayout(4, "float32", "adagrad"), 0.1).load_state_dict(saved)
    with pytest.raises(ValueError, match="lr must be"):
        fresh.load_state_dict({**saved, "lr": -1})
    with pytest.raises(ValueError, match="missing keys"):
        fresh.load_state_dict({"lr": 0.1})
