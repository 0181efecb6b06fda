"""The embedding table's row format and the row-wise sparse optimizers that update it.

A trainable embedding table is a file of fixed-size rows of raw bytes, one row per node. Row ``i`` holds node ``i``'s
embedding followed by that node's optimizer state::

    | embedding: dim x dtype (float32 or float16) | pad to 4 bytes | state slot 0: dim x float32 | slot 1 ... |

=========  ===========  ===========================================================
optimizer  state slots  slots, in order
=========  ===========  ===========================================================
sgd        0            (none; plain SGD, no momentum)
adagrad    1            sum of squared gradients
adam       2            first moment ``m``, second moment ``v`` (SparseAdam)
=========  ===========  ===========================================================

Numbers are stored in the machine's byte order (little-endian on every platform we run on). The state sits beside the
embedding, not in a second table, because a sparse optimizer's update of node ``i`` reads and writes node ``i``'s
embedding and state only: one row in, one row out. That keeps the whole update inside one cache line (one row) of the
software cache, so a dirty line is all there is to write back, and the undo journal's before-image of that one row is
all it takes to roll the update back. The state is always float32, also under a float16 table, so the moments keep
their precision while the embedding halves its bytes.

Storage and cache see a row as ``row_bytes`` opaque ``uint8``; only this module knows what the bytes mean.

:class:`RowOptimizer` reproduces PyTorch's sparse training of ``torch.nn.Embedding(num, dim, sparse=True)``:
``sgd`` is ``torch.optim.SGD(lr)``, ``adagrad`` is ``torch.optim.Adagrad(lr, eps=eps,
initial_accumulator_value=...)`` and ``adam`` is ``torch.optim.SparseAdam(lr, betas, eps)``, each on the coalesced
sparse gradient (only touched rows change, state included). One extension: torch refuses ``weight_decay`` with sparse
gradients; here ``weight_decay`` for sgd and adagrad adds ``weight_decay * w`` to the gradient of the *touched* rows
(torch's dense formula restricted to the rows in the batch, "lazy" decay); adam refuses it as SparseAdam has none.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from lsm_gnn.utils.hashing import mix64

# The one table of names: optimizer -> number of float32 state slots (each `dim` wide) beside the embedding.
_STATE_SLOTS = {"sgd": 0, "adagrad": 1, "adam": 2}
_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16}
OPTIMIZERS = tuple(_STATE_SLOTS)
EMBEDDING_DTYPES = tuple(_TORCH_DTYPES)

# torch's default eps per optimizer (Adagrad 1e-10, SparseAdam 1e-8); SGD has none.
DEFAULT_EPS = {"sgd": None, "adagrad": 1e-10, "adam": 1e-8}

# initial_rows draws fixed blocks of this many rows, so a row's initial value never depends on the caller's chunking.
INIT_BLOCK_ROWS = 65536

_STATE_BYTES = 4  # float32


@dataclass(frozen=True)
class RowLayout:
    """The byte layout of one table row: ``dim`` embedding values of ``dtype``, then the optimizer's state.

    Identities: ``layout.join(*layout.split(rows))`` equals ``rows`` byte for byte (padding is zero), and
    ``layout.split(layout.join(emb, state))`` gives back ``(emb rounded to dtype, state)``.
    """

    dim: int
    dtype: str = "float32"
    optimizer: str = "adagrad"

    def __post_init__(self):
        if isinstance(self.dim, bool) or not isinstance(self.dim, (int, np.integer)) or self.dim < 1:
            raise ValueError(f"RowLayout.dim must be a positive integer (the embedding width), got {self.dim!r}")
        object.__setattr__(self, "dim", int(self.dim))
        if not isinstance(self.dtype, str) or self.dtype not in _TORCH_DTYPES:
            raise ValueError(f"RowLayout.dtype must be one of {EMBEDDING_DTYPES}, got {self.dtype!r}")
        if not isinstance(self.optimizer, str) or self.optimizer not in _STATE_SLOTS:
            raise ValueError(f"RowLayout.optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _TORCH_DTYPES[self.dtype]

    @property
    def state_slots(self) -> int:
        """float32 state vectors (each ``dim`` wide) kept per row: 0 sgd, 1 adagrad, 2 adam."""
        return _STATE_SLOTS[self.optimizer]

    @property
    def embedding_bytes(self) -> int:
        """Bytes of the embedding part, padded up to a multiple of 4 so the float32 state stays aligned."""
        raw = self.dim * self.torch_dtype.itemsize
        return -(-raw // _STATE_BYTES) * _STATE_BYTES

    @property
    def row_bytes(self) -> int:
        """Bytes of one row: the padded embedding plus ``4 * dim * state_slots``."""
        return self.embedding_bytes + _STATE_BYTES * self.dim * self.state_slots

    def split(self, rows) -> tuple[torch.Tensor, torch.Tensor]:
        """``uint8 [n, row_bytes]`` -> (embeddings ``float32 [n, dim]``, state ``float32 [n, state_slots, dim]``).

        Both are fresh tensors on ``rows``' device (float16 embeddings upcast); writing to them never changes ``rows``.
        """
        rows = self._check_rows(rows)
        state = _copy_as(rows[:, self.embedding_bytes:], torch.float32)
        return self._embeddings(rows), state.view(rows.shape[0], self.state_slots, self.dim)

    def editable(self, rows) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """``(copy, embeddings, state)``: what :meth:`split` gives, and for a float32 table a fresh copy of
        ``rows`` whose bytes the two are views of (an optimizer updates them in place and returns the copy: one
        copy of the rows instead of split's and join's four); None for a float16 table (join them after)."""
        rows = self._check_rows(rows)
        if self.dtype != "float32":
            return None, *self.split(rows)
        copy = rows.clone(memory_format=torch.contiguous_format)
        values = copy.view(torch.float32).view(rows.shape[0], 1 + self.state_slots, self.dim)
        return copy, values[:, 0], values[:, 1:]

    def embeddings(self, rows) -> torch.Tensor:
        """Just the embeddings of ``rows`` as a fresh ``float32 [n, dim]`` tensor (skips copying the state)."""
        return self._embeddings(self._check_rows(rows))

    def join(self, emb: torch.Tensor, state: torch.Tensor | None = None) -> torch.Tensor:
        """(embeddings ``[n, dim]``, state ``[n, state_slots, dim]``) -> rows ``uint8 [n, row_bytes]``.

        The embeddings are rounded to ``dtype``; padding bytes are zero. ``state=None`` means all-zero state.
        """
        if not isinstance(emb, torch.Tensor) or emb.dim() != 2 or emb.shape[1] != self.dim:
            raise ValueError(f"join: embeddings must be a tensor of shape [n, {self.dim}], got "
                             f"{tuple(emb.shape) if isinstance(emb, torch.Tensor) else type(emb).__name__}")
        if not emb.is_floating_point():
            raise ValueError(f"join: embeddings must be floating point, got {emb.dtype}")
        n = emb.shape[0]
        out = torch.zeros(n, self.row_bytes, dtype=torch.uint8, device=emb.device)
        raw = self.dim * self.torch_dtype.itemsize
        out[:, :raw] = emb.to(self.torch_dtype).contiguous().view(torch.uint8)
        if state is not None and self.state_slots:
            want = (n, self.state_slots, self.dim)
            if not isinstance(state, torch.Tensor) or tuple(state.shape) != want:
                raise ValueError(f"join: state must be a tensor of shape {list(want)} for {self.optimizer}, got "
                                 f"{tuple(state.shape) if isinstance(state, torch.Tensor) else type(state).__name__}")
            flat = state.to(device=emb.device, dtype=torch.float32).reshape(n, self.state_slots * self.dim)
            out[:, self.embedding_bytes:] = flat.contiguous().view(torch.uint8)
        elif state is not None and state.numel():
            raise ValueError(f"join: {self.optimizer} keeps no state, got a state tensor of shape {tuple(state.shape)}")
        return out

    def as_dict(self) -> dict:
        """A JSON-able description (``row_bytes`` included, so a reader can check the file's row size)."""
        return {"dim": self.dim, "dtype": self.dtype, "optimizer": self.optimizer, "row_bytes": self.row_bytes}

    @classmethod
    def from_dict(cls, d: dict) -> RowLayout:
        """The inverse of :meth:`as_dict`; refuses unknown keys and a ``row_bytes`` that does not match."""
        if not isinstance(d, dict):
            raise ValueError(f"RowLayout.from_dict needs a dict, got {type(d).__name__}")
        unknown = sorted(set(d) - {"dim", "dtype", "optimizer", "row_bytes"})
        if unknown:
            raise ValueError(f"RowLayout.from_dict: unknown keys {unknown}; valid: dim, dtype, optimizer, row_bytes")
        if "dim" not in d:
            raise ValueError("RowLayout.from_dict: missing 'dim'")
        layout = cls(**{k: d[k] for k in ("dim", "dtype", "optimizer") if k in d})
        if "row_bytes" in d and d["row_bytes"] != layout.row_bytes:
            raise ValueError(f"RowLayout.from_dict: row_bytes {d['row_bytes']!r} does not match {layout} "
                             f"({layout.row_bytes} bytes); the table was written in another row format")
        return layout

    def _embeddings(self, rows: torch.Tensor) -> torch.Tensor:
        raw = self.dim * self.torch_dtype.itemsize
        return _copy_as(rows[:, :raw], self.torch_dtype).to(torch.float32)

    def _check_rows(self, rows) -> torch.Tensor:
        if isinstance(rows, np.ndarray):
            rows = torch.from_numpy(rows)
        if not isinstance(rows, torch.Tensor):
            raise ValueError(f"rows must be a uint8 tensor or array of shape [n, {self.row_bytes}], "
                             f"got {type(rows).__name__}")
        if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.shape[1] != self.row_bytes:
            raise ValueError(f"rows must be uint8 of shape [n, {self.row_bytes}] for {self}, got {rows.dtype} "
                             f"{list(rows.shape)}; open the table with dtype='uint8' and dim=layout.row_bytes")
        return rows


def _copy_as(byte_columns: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous copy of ``uint8 [n, k]`` columns reinterpreted as ``dtype [n, k / itemsize]``."""
    if byte_columns.shape[1] == 0:  # an empty slice keeps odd strides that view(dtype) refuses
        return torch.empty(byte_columns.shape[0], 0, dtype=dtype, device=byte_columns.device)
    return byte_columns.clone(memory_format=torch.contiguous_format).view(dtype)


def _block_seed(seed: int, block: int) -> int:
    return mix64(mix64(seed) ^ block)


def initial_rows(layout: RowLayout, start: int, stop: int, *, seed: int, std: float,
                 initial_accumulator_value: float = 0.0) -> np.ndarray:
    """The initial rows of nodes ``[start, stop)``: ``uint8 [stop - start, row_bytes]``.

    Embeddings are drawn from N(0, std^2) (then rounded to the table's dtype); the state is zero, except adagrad's sum
    of squares, which starts at ``initial_accumulator_value`` as torch's Adagrad does. Row ``i`` is the same whatever
    ``start``/``stop`` chunking produced it: values come in fixed blocks of :data:`INIT_BLOCK_ROWS` rows, block ``b``
    from its own generator seeded with a hash of ``(seed, b)``. Chunks aligned to the block size waste no draws.
    """
    for name, value in (("start", start), ("stop", stop), ("seed", seed)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"initial_rows: {name} must be an integer, got {value!r}")
    if not 0 <= start <= stop:
        raise ValueError(f"initial_rows: need 0 <= start <= stop, got start={start}, stop={stop}")
    if not (math.isfinite(std) and std >= 0):
        raise ValueError(f"initial_rows: std must be a finite number >= 0, got {std!r}")
    if not (math.isfinite(initial_accumulator_value) and initial_accumulator_value >= 0):
        raise ValueError(f"initial_rows: initial_accumulator_value must be a finite number >= 0, "
                         f"got {initial_accumulator_value!r}")
    if initial_accumulator_value and layout.optimizer != "adagrad":
        raise ValueError(f"initial_rows: initial_accumulator_value is adagrad's; {layout.optimizer} has no "
                         f"accumulator, leave it 0")
    start, stop = int(start), int(stop)
    out = np.empty((stop - start, layout.row_bytes), dtype=np.uint8)
    state_value = float(initial_accumulator_value)
    for block in range(start // INIT_BLOCK_ROWS, -(-stop // INIT_BLOCK_ROWS)):
        base = block * INIT_BLOCK_ROWS
        lo, hi = max(start, base), min(stop, base + INIT_BLOCK_ROWS)
        gen = torch.Generator().manual_seed(_block_seed(int(seed), block))
        draws = torch.randn(INIT_BLOCK_ROWS, layout.dim, generator=gen)[lo - base:hi - base] * std
        state = torch.full((hi - lo, layout.state_slots, layout.dim), state_value)
        out[lo - start:hi - start] = layout.join(draws, state).numpy()
    return out


class RowOptimizer:
    """A sparse optimizer that updates table rows in place of ``torch.optim.{SGD, Adagrad, SparseAdam}``.

    ``step(rows, grads, step)`` returns what torch's optimizer would leave in those rows' embedding and state after
    one step with the sparse gradient whose coalesced values are ``grads``; no other row changes. It keeps no
    per-row state of its own (the state is in the rows), so it is cheap to hold and to checkpoint.
    """

    def __init__(self, layout: RowLayout, lr: float, *, eps: float | None = None, betas=(0.9, 0.999),
                 weight_decay: float = 0.0):
        if not isinstance(layout, RowLayout):
            raise ValueError(f"RowOptimizer needs a RowLayout, got {type(layout).__name__}")
        self.layout = layout
        self._set_hyper(lr, eps, betas, weight_decay)

    def _set_hyper(self, lr, eps, betas, weight_decay) -> None:
        opt = self.layout.optimizer
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"RowOptimizer: lr must be a finite number > 0, got {lr!r}")
        if opt == "sgd":
            if eps is not None:
                raise ValueError(f"RowOptimizer: sgd takes no eps, got eps={eps!r}; leave it None")
        else:
            eps = DEFAULT_EPS[opt] if eps is None else eps
            # Adagrad accepts eps >= 0; SparseAdam needs eps > 0 (it divides by sqrt(v) + eps).
            low_ok = eps > 0 if opt == "adam" else eps >= 0
            if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (math.isfinite(eps) and low_ok):
                raise ValueError(f"RowOptimizer: eps for {opt} must be a finite number "
                                 f"{'> 0' if opt == 'adam' else '>= 0'}, got {eps!r}")
        try:
            b1, b2 = (float(b) for b in betas)
        except (TypeError, ValueError):
            raise ValueError(f"RowOptimizer: betas must be two numbers in [0, 1), got {betas!r}") from None
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError(f"RowOptimizer: betas must be two numbers in [0, 1), got {betas!r}")
        if isinstance(weight_decay, bool) or not isinstance(weight_decay, (int, float)) \
                or not (math.isfinite(weight_decay) and weight_decay >= 0):
            raise ValueError(f"RowOptimizer: weight_decay must be a finite number >= 0, got {weight_decay!r}")
        if weight_decay and opt == "adam":
            raise ValueError("RowOptimizer: adam (torch's SparseAdam) has no weight_decay; set it to 0 or use "
                             "sgd or adagrad")
        self.lr, self.eps, self.betas, self.weight_decay = float(lr), eps, (b1, b2), float(weight_decay)

    def step(self, rows, grads: torch.Tensor, step: int) -> torch.Tensor:
        """New rows (``uint8 [n, row_bytes]``) for ``n`` distinct nodes' ``rows`` and their summed ``grads``.

        ``grads`` is ``float32 [n, dim]``, already summed per node (as torch coalesces a sparse gradient) and scaled
        as the caller wants. ``step`` counts optimizer steps taken including this one, from 1, globally (SparseAdam's
        bias correction uses it; torch counts one step per ``optimizer.step()`` whichever rows it touches).
        """
        layout = self.layout
        out, emb, state = layout.editable(rows)
        if not isinstance(grads, torch.Tensor) or tuple(grads.shape) != tuple(emb.shape):
            raise ValueError(f"RowOptimizer.step: grads must be a tensor of shape {list(emb.shape)} (one summed "
                             f"gradient per row), got "
                             f"{list(grads.shape) if isinstance(grads, torch.Tensor) else type(grads).__name__}")
        if not grads.is_floating_point():
            raise ValueError(f"RowOptimizer.step: grads must be floating point, got {grads.dtype}")
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 1:
            raise ValueError(f"RowOptimizer.step: step must be an integer >= 1 (steps taken including this one), "
                             f"got {step!r}")
        grad = grads.to(device=emb.device, dtype=torch.float32)
        if self.weight_decay:
            grad = grad.add(emb, alpha=self.weight_decay)
        if layout.optimizer == "sgd":
            emb.add_(grad, alpha=-self.lr)
        elif layout.optimizer == "adagrad":
            total = state[:, 0]
            total.add_(grad.pow(2))
            emb.add_(grad / total.sqrt().add_(self.eps), alpha=-self.lr)
        else:
            self._adam(emb, state, grad, int(step))
        return layout.join(emb, state) if out is None else out

    def _adam(self, emb: torch.Tensor, state: torch.Tensor, grad: torch.Tensor, step: int) -> None:
        # The operation order of torch.optim._functional.sparse_adam, so results agree to rounding.
        b1, b2 = self.betas
        m, v = state[:, 0], state[:, 1]
        m.add_(grad.sub(m).mul_(1 - b1))
        v.add_(grad.pow(2).sub_(v).mul_(1 - b2))
        denom = v.sqrt().add_(self.eps)
        step_size = self.lr * math.sqrt(1 - b2 ** step) / (1 - b1 ** step)
        emb.add_(m.div(denom).mul_(-step_size))

    def state_dict(self) -> dict:
        """The layout and hyper-parameters (the per-row state lives in the table itself)."""
        return {"layout": self.layout.as_dict(), "lr": self.lr, "eps": self.eps, "betas": list(self.betas),
                "weight_decay": self.weight_decay}

    def load_state_dict(self, d: dict) -> None:
        """Adopt saved hyper-parameters (validated, as torch's optimizers adopt theirs); the layout must match."""
        if not isinstance(d, dict):
            raise ValueError(f"RowOptimizer.load_state_dict needs a dict, got {type(d).__name__}")
        missing = sorted({"layout", "lr", "eps", "betas", "weight_decay"} - set(d))
        if missing:
            raise ValueError(f"RowOptimizer.load_state_dict: missing keys {missing}")
        saved = RowLayout.from_dict(d["layout"])
        if saved != self.layout:
            raise ValueError(f"RowOptimizer.load_state_dict: the state was saved for {saved}, this optimizer has "
                             f"{self.layout}; rows of one layout cannot be read as the other")
        self._set_hyper(d["lr"], d["eps"], d["betas"], d["weight_decay"])
