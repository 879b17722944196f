"""Dense b-bit packing of uint8 codes (b = 1..8): layout definition and numpy reference.

Layout (format version 1). Codes are cut into blocks of ``8 * M`` codes, ``M = 512`` for every
full block; the last block holds the ``r < 4096`` remaining codes with ``M = ceil(r / 8)``,
zero-padded up to ``8 * M`` codes. Inside a block, code ``i`` sits at row ``i // M``, column
``i % M``. The eight codes of one column form a ``8b``-bit little-endian word
``w = c0 | c1 << b | … | c7 << 7b``; byte ``t`` of that word (bits ``8t .. 8t+7``) is stored at
block offset ``t * M + m``. A block of ``8M`` codes therefore takes exactly ``b * M`` bytes::

    block (M columns)          packed block (b*M bytes), b = 3
    row 0: c[0]   .. c[M-1]    byte row 0: c0[2:0] | c1[2:0]<<3 | c2[1:0]<<6      (per column)
    row 1: c[M]   .. c[2M-1]   byte row 1: c2[2] | c3<<1 | c4<<4 | c5[0]<<7
    ...                        byte row 2: c5[2:1] | c6<<2 | c7<<5
    row 7: c[7M]  .. c[8M-1]

Total size ``b * ceil(n / 8)`` bytes: exactly ``b`` bits per code plus at most 7 padding codes
(zero bits) at the end. Everything is defined on bytes, so the meaning never depends on the
machine's byte order. The column-major word lets every byte row be computed with whole-vector
shifts of contiguous rows, which is what makes the native kernel memory-bound.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from qpart.kernels.errors import QuantizationError

BLOCK_COLUMNS = 512
BLOCK_CODES = 8 * BLOCK_COLUMNS

U8Array = npt.NDArray[np.uint8]


def check_bits(bits: int) -> None:
    """Raise :class:`QuantizationError` unless ``bits`` is an int in 1..8."""
    if isinstance(bits, bool) or not isinstance(bits, int | np.integer) or not 1 <= bits <= 8:
        raise QuantizationError(f"bits must be an integer in 1..8, got {bits!r}")


def packed_size(n: int, bits: int) -> int:
    """Bytes taken by ``n`` codes of ``bits`` bits: ``bits * ceil(n / 8)``."""
    check_bits(bits)
    return int(bits) * ((int(n) + 7) // 8)


def _pack_rows(c: U8Array, bits: int) -> U8Array:
    """``c``: ``[k, 8, M]`` codes → ``[k, bits, M]`` bytes."""
    out = np.zeros((c.shape[0], bits, c.shape[2]), dtype=np.uint8)
    for t in range(bits):
        for r in range(8):
            lo = r * bits - 8 * t
            if lo >= 8 or lo + bits <= 0:
                continue
            # Multiplying wraps like a truncated left shift and is ~5x faster in numpy.
            part = c[:, r] * np.uint8(1 << lo) if lo >= 0 else c[:, r] >> np.uint8(-lo)
            out[:, t] |= part
    return out


def _unpack_rows(p: U8Array, bits: int) -> U8Array:
    """``p``: ``[k, bits, M]`` bytes → ``[k, 8, M]`` codes."""
    mask = np.uint8((1 << bits) - 1)
    out = np.empty((p.shape[0], 8, p.shape[2]), dtype=np.uint8)
    for r in range(8):
        t0, o = divmod(r * bits, 8)
        v = p[:, t0] >> np.uint8(o)
        if o + bits > 8:
            v |= p[:, t0 + 1] * np.uint8(1 << (8 - o))
        out[:, r] = v & mask
    return out


def pack_codes_numpy(codes: U8Array, bits: int) -> U8Array:
    """Pack uint8 codes (each ``< 2**bits``) into ``packed_size(n, bits)`` bytes.

    Args:
        codes: uint8 array of any shape, read in C order.
        bits: 1..8.
    """
    check_bits(bits)
    flat = np.ascontiguousarray(codes, dtype=np.uint8).reshape(-1)
    if bits < 8 and flat.size and int(flat.max()) >> bits:
        raise QuantizationError(f"a code does not fit in {bits} bits")
    n = flat.size
    if bits == 8:  # identity inside every block; only the zero padding to a multiple of 8
        out = np.zeros(packed_size(n, 8), dtype=np.uint8)
        out[:n] = flat
        return out
    full = n // BLOCK_CODES
    parts = [_pack_rows(flat[: full * BLOCK_CODES].reshape(full, 8, BLOCK_COLUMNS), bits).reshape(-1)]
    rem = n - full * BLOCK_CODES
    if rem:
        m = (rem + 7) // 8
        tail = np.zeros(8 * m, dtype=np.uint8)
        tail[:rem] = flat[full * BLOCK_CODES :]
        parts.append(_pack_rows(tail.reshape(1, 8, m), bits).reshape(-1))
    return np.concatenate(parts)


def unpack_codes_numpy(packed: U8Array, bits: int, n: int) -> U8Array:
    """Unpack ``n`` codes of ``bits`` bits; ``packed`` must hold exactly ``packed_size(n, bits)``."""
    want = packed_size(n, bits)
    flat = np.ascontiguousarray(packed, dtype=np.uint8).reshape(-1)
    if flat.size != want:
        raise QuantizationError(f"packed input holds {flat.size} bytes, expected {want}")
    if bits == 8:
        return flat[:n].copy()
    full = n // BLOCK_CODES
    cut = full * bits * BLOCK_COLUMNS
    parts = [_unpack_rows(flat[:cut].reshape(full, bits, BLOCK_COLUMNS), bits).reshape(-1)]
    rem = n - full * BLOCK_CODES
    if rem:
        m = (rem + 7) // 8
        parts.append(_unpack_rows(flat[cut:].reshape(1, bits, m), bits).reshape(-1)[:rem])
    return np.concatenate(parts)
