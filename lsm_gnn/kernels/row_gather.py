"""Rows of a table by id, copied by a Triton kernel into rows of an output: the ``pinned`` storage's reads, and
a device cache's rows in request order.

``gather_rows(table, ids, out, slots)`` sets ``out[slots[i]] = table[ids[i]]`` for every ``i`` (``slots`` None:
``out[i]``), byte for byte whatever the dtype: rows are copied as the widest machine words that divide the row's
bytes (8, 4, 2 or 1), so a row of 13 float16 moves as 13 two-byte words and one of 256 float32 as 128 eight-byte
ones. One program copies a block of rows; no program reads what another writes (with repeated slots, one of the
ids' rows lands, as :meth:`~lsm_gnn.storage.base.FeatureStorage.read_into` allows).

On a GPU the table is a CPU tensor in page-locked host memory and ``ids``, ``slots`` and ``out`` live on the
device: the kernel loads the table's rows over PCIe (zero-copy through unified virtual addressing) and stores
them straight into device memory, with no host copy between. Triton takes the CPU tensor as it is: its
specialization reads only a tensor's dtype and address, and its launcher turns every pointer argument into a
device pointer with ``cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_DEVICE_POINTER)``, which succeeds for page-locked
memory and fails with "Pointer argument ... cannot be accessed from Triton (cpu tensor?)" for pageable memory
(checked in triton 3.6's ``backends/nvidia/driver.py``); :func:`gather_rows` refuses a table that is not
page-locked before that, with a message that names the fix. On CPU tensors the kernel runs under Triton's
interpreter (tests).

``rows_by_line(data, line, hit, inverse, rows)`` is a lookup's last step on a device cache: each position's row
from the line of its distinct id, and its hit flag, in one launch where torch takes four (two index ops, a clamp,
an ``index_select``).
"""
from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

#: Word dtypes by size in bytes, widest first: a row moves as the widest that divides its bytes.
WORDS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
#: Words per program (rows x words of a block): enough bytes in flight per program to cover PCIe latency.
BLOCK_WORDS_TOTAL = 2048
MAX_BLOCK_WORDS = 512


@triton.jit
def _copy_rows(table_ptr, out_ptr, row, dest, valid, row_words, BLOCK_WORDS: tl.constexpr):
    """``out[dest[i]] = table[row[i]]`` where ``valid[i]``, each row as ``row_words`` words (``row`` and ``dest``
    int64: offsets past 2**31 words)."""
    words = tl.cast(row_words, tl.int64)
    src = table_ptr + (row * words)[:, None]
    dst = out_ptr + (dest * words)[:, None]
    for start in range(0, row_words, BLOCK_WORDS):
        w = start + tl.arange(0, BLOCK_WORDS)
        m = valid[:, None] & (w < row_words)[None, :]
        tl.store(dst + w[None, :], tl.load(src + w[None, :], mask=m, other=0), mask=m)


@triton.jit
def _gather_rows(table_ptr, ids_ptr, slots_ptr, out_ptr, n, row_words, HAS_SLOTS: tl.constexpr,
                 BLOCK_ROWS: tl.constexpr, BLOCK_WORDS: tl.constexpr):
    r = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    in_batch = r < n
    row = tl.cast(tl.load(ids_ptr + r, mask=in_batch, other=0), tl.int64)
    if HAS_SLOTS:
        dest = tl.cast(tl.load(slots_ptr + r, mask=in_batch, other=0), tl.int64)
    else:
        dest = tl.cast(r, tl.int64)
    _copy_rows(table_ptr, out_ptr, row, dest, in_batch, row_words, BLOCK_WORDS)


@triton.jit
def _rows_by_line(data_ptr, line_ptr, hit_ptr, inverse_ptr, rows_ptr, request_hit_ptr, n, row_words,
                  BLOCK_ROWS: tl.constexpr, BLOCK_WORDS: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    in_batch = r < n
    u = tl.load(inverse_ptr + r, mask=in_batch, other=0)  # the position's distinct id
    line = tl.cast(tl.load(line_ptr + u, mask=in_batch, other=-1), tl.int64)
    tl.store(request_hit_ptr + r, tl.load(hit_ptr + u, mask=in_batch, other=0), mask=in_batch)
    _copy_rows(data_ptr, rows_ptr, tl.maximum(line, 0), r, in_batch, row_words, BLOCK_WORDS)


def word_bytes(row_bytes: int, *tensors: torch.Tensor) -> int:
    """The widest word that divides ``row_bytes`` and the address of each of ``tensors``."""
    return next(size for size in WORDS if row_bytes % size == 0 and all(t.data_ptr() % size == 0 for t in tensors))


def as_words(rows: torch.Tensor, size: int) -> torch.Tensor:
    """A contiguous ``[n, dim]`` tensor seen as ``[n, row bytes / size]`` words of ``size`` bytes."""
    return rows.view(torch.uint8).view(WORDS[size])


def gather_rows(table: torch.Tensor, ids: torch.Tensor, out: torch.Tensor, slots: torch.Tensor | None = None) -> None:
    """``out[slots[i]] = table[ids[i]]`` for every ``i`` (``slots`` None: ``out[i]``), bytes exactly.

    ``table`` and ``out`` are contiguous 2-D tensors of one dtype and row width; ``ids`` (and ``slots``) 1-D
    integer tensors on ``out``'s device, in range (the caller checks: the kernel does not). On a GPU ``table``
    is either on ``out``'s device or a page-locked CPU tensor (read over UVA); on the CPU, all four are CPU
    tensors and the kernel runs under Triton's interpreter.
    """
    _check_row_tables(table, out, "table and out")
    n = ids.numel()
    if slots is not None and slots.shape != ids.shape:
        raise ValueError(f"slots must name one row of out per id: {slots.numel()} slots for {n} ids")
    index_devices = {ids.device} | ({slots.device} if slots is not None else set())
    if index_devices != {out.device}:
        raise ValueError(f"ids and slots must be on out's device ({out.device}), got "
                         f"{', '.join(str(d) for d in sorted(index_devices, key=str))}")
    if out.device.type == "cuda" and table.device != out.device and not (table.device.type == "cpu"
                                                                          and table.is_pinned()):
        raise ValueError(f"a GPU reads a table on {table.device} only from page-locked host memory (UVA); this "
                         "one is pageable: pin it (torch.cuda.cudart().cudaHostRegister, or Tensor.pin_memory())")
    if n == 0:
        return
    size = word_bytes(table.shape[1] * table.element_size(), table, out)
    table_words, out_words = as_words(table, size), as_words(out, size)
    row_words = table_words.shape[1]
    block_rows, block_words = _blocks(row_words)
    with _on(out.device):
        _gather_rows[(triton.cdiv(n, block_rows),)](table_words, ids, ids if slots is None else slots, out_words, n,
                                                    row_words, HAS_SLOTS=slots is not None, BLOCK_ROWS=block_rows,
                                                    BLOCK_WORDS=block_words)


def rows_by_line(data: torch.Tensor, line: torch.Tensor, hit: torch.Tensor, inverse: torch.Tensor,
                 rows: torch.Tensor) -> torch.Tensor:
    """A lookup's rows in request order from the lines its distinct ids were given, in one launch:
    ``rows[i] = data[line[inverse[i]]]``, line 0's row where that line is -1 (as torch's ops clamping the line
    give: the caller overwrites it with the row from elsewhere), and the returned ``hit[inverse]`` (bool).
    ``data`` and ``rows``: contiguous 2-D tensors of one dtype and width; ``line`` and ``hit`` per distinct id,
    ``inverse`` (int64) per position, all on ``rows``' device; lines in range (the assign gave them)."""
    _check_row_tables(data, rows, "data and rows")
    n = inverse.numel()
    if rows.shape[0] != n or line.shape != hit.shape:
        raise ValueError(f"one row per position ({n}) and one line and hit per distinct id, got {rows.shape[0]} "
                         f"rows, {line.numel()} lines and {hit.numel()} hits")
    request_hit = torch.empty(n, dtype=torch.int8, device=rows.device)
    if n == 0:
        return request_hit.view(torch.bool)
    size = word_bytes(data.shape[1] * data.element_size(), data, rows)
    data_words, rows_words = as_words(data, size), as_words(rows, size)
    row_words = data_words.shape[1]
    block_rows, block_words = _blocks(row_words)
    with _on(rows.device):
        _rows_by_line[(triton.cdiv(n, block_rows),)](data_words, line, hit.view(torch.int8), inverse, rows_words,
                                                     request_hit, n, row_words, BLOCK_ROWS=block_rows,
                                                     BLOCK_WORDS=block_words)
    return request_hit.view(torch.bool)


def _check_row_tables(source: torch.Tensor, dest: torch.Tensor, names: str) -> None:
    """Rows copied as runs of words need two contiguous 2-D tensors of one dtype and row width."""
    if source.dim() != 2 or dest.dim() != 2 or source.shape[1] != dest.shape[1] or source.dtype != dest.dtype:
        raise ValueError(f"{names} must be 2-D tensors of one dtype and row width, got {source.dtype} "
                         f"{tuple(source.shape)} and {dest.dtype} {tuple(dest.shape)}")
    if not (source.is_contiguous() and dest.is_contiguous()):
        raise ValueError(f"{names} must be contiguous (rows are copied as runs of words)")


def _blocks(row_words: int) -> tuple[int, int]:
    """(rows, words) a program copies at once: the row's words up to MAX_BLOCK_WORDS, rows to fill the block."""
    block_words = min(triton.next_power_of_2(row_words), MAX_BLOCK_WORDS)
    return max(1, BLOCK_WORDS_TOTAL // block_words), block_words


def _on(device: torch.device):
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()

