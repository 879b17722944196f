"""Kernel benchmark: qpart native and numpy kernels against peers, as ratios to a memcpy.

``python -m bench.micro.kernels [--json PATH] [--elements N] [--repeats R]``

All implementations run single-threaded on the same data in the same process, each timed as the
median of R runs after one warm-up, into preallocated outputs where the implementation allows it.
Peers (benchmark-only):

* ``numpy-packbits``: a generic LSB-first bit stream built on ``numpy.unpackbits``/``packbits``,
  with the numpy reference quantizer;
* ``hqq``: HQQ's ``BitPack`` (PyPI ``hqq``, installed with ``--no-deps``: only its torch bit
  packing is used), with HQQ-style torch quantize/dequantize around it. HQQ has no 3-bit uint8
  format; its 3-bit packer stores 10 codes per int32 (3.2 bits/code), measured as such.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from bench import write_json
from qpart.kernels import (
    Backend,
    QuantScheme,
    native_isa,
    native_isa_used,
    pack_codes,
    packed_size,
    quantize_pack,
    unpack_codes,
    unpack_dequantize,
)
from qpart.kernels.ops import native_module
from qpart.kernels.quantization import dequantize_numpy, quantize_numpy

BITS = (2, 3, 4, 8)
OPS = ("pack", "unpack", "quantize_pack", "unpack_dequantize")
GROUP = 256


def _median_time(fn: Callable[[], object], repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _paired(fn: Callable[[], object], memcpy: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median seconds of ``fn`` and of the memcpy, timed in alternation (memcpy, fn, memcpy, ...):
    the ratio of the two medians is measured under the same load, which on a shared host moves
    the memcpy itself by 2x between minutes."""
    fn()
    memcpy()
    ours: list[float] = []
    floor: list[float] = []
    for _ in range(repeats):
        for samples, f in ((floor, memcpy), (ours, fn)):
            start = time.perf_counter()
            f()
            samples.append(time.perf_counter() - start)
    return statistics.median(ours), statistics.median(floor)


# ---- qpart --------------------------------------------------------------------------------


def _qpart_ops(
    backend: Backend, x: np.ndarray, codes: np.ndarray, bits: int
) -> dict[str, Callable[[], object]]:
    n = x.size
    scheme = QuantScheme(bits, GROUP)
    packed_buf = np.empty(packed_size(n, bits), dtype=np.uint8)
    codes_buf = np.empty(n, dtype=np.uint8)
    out = np.empty(n, dtype=np.float32)
    pt = quantize_pack(x, scheme, backend=backend)
    return {
        "pack": lambda: pack_codes(codes, bits, out=packed_buf, backend=backend),
        "unpack": lambda: unpack_codes(pt.data, bits, n, out=codes_buf, backend=backend),
        "quantize_pack": lambda: quantize_pack(x, scheme, out=packed_buf, backend=backend),
        "unpack_dequantize": lambda: unpack_dequantize(pt, out=out, backend=backend),
    }


# ---- numpy packbits peer ------------------------------------------------------------------


def _bits_pack(codes: np.ndarray, bits: int) -> np.ndarray:
    expanded = np.unpackbits(codes[:, None], axis=1, bitorder="little")[:, :bits]
    return np.packbits(expanded.reshape(-1), bitorder="little")


def _bits_unpack(packed: np.ndarray, bits: int, n: int) -> np.ndarray:
    stream = np.unpackbits(packed, bitorder="little", count=n * bits).reshape(n, bits)
    return np.packbits(stream, axis=1, bitorder="little").reshape(n)


def _packbits_ops(x: np.ndarray, codes: np.ndarray, bits: int) -> dict[str, Callable[[], object]]:
    n = x.size
    scheme = QuantScheme(bits, GROUP)
    q_codes, scales, mins = quantize_numpy(x, scheme)
    packed = _bits_pack(q_codes, bits)

    def quantize_pack_peer() -> object:
        c, _, _ = quantize_numpy(x, scheme)
        return _bits_pack(c, bits)

    return {
        "pack": lambda: _bits_pack(codes, bits),
        "unpack": lambda: _bits_unpack(packed, bits, n),
        "quantize_pack": quantize_pack_peer,
        "unpack_dequantize": lambda: dequantize_numpy(_bits_unpack(packed, bits, n), scales, mins, GROUP),
    }


# ---- HQQ peer -----------------------------------------------------------------------------


def _hqq_ops(x: np.ndarray, codes: np.ndarray, bits: int) -> dict[str, Callable[[], object]] | None:
    try:
        from hqq.core.bitpack import BitPack  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        return None
    pack, unpack = {
        2: (BitPack.pack_2bit_u8, BitPack.unpack_2bit_u8),
        3: (BitPack.pack_3bit_32, BitPack.unpack_3bit_32),
        4: (BitPack.pack_4bit_u8, BitPack.unpack_4bit_u8),
        8: (BitPack.pack_8bit_u8, BitPack.unpack_8bit_u8),
    }[bits]
    rows = x.size // GROUP
    xt = torch.from_numpy(x).view(rows, GROUP)
    ct = torch.from_numpy(codes).view(rows, GROUP)
    qmax = float((1 << bits) - 1)

    def quantize() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mn = xt.amin(dim=1, keepdim=True)
        scale = (xt.amax(dim=1, keepdim=True) - mn).div_(qmax).clamp_(min=1e-8)
        q = (xt - mn).div_(scale).round_().clamp_(0, qmax).to(torch.uint8)
        return q, scale, mn

    q, scale, mn = quantize()
    packed = pack(q)

    def unpack_dequantize_peer() -> object:
        w = unpack(packed, dtype=torch.float32)[:rows]
        return w.mul_(scale).add_(mn)

    return {
        "pack": lambda: pack(ct),
        "unpack": lambda: unpack(packed)[:rows],
        "quantize_pack": lambda: pack(quantize()[0]),
        "unpack_dequantize": unpack_dequantize_peer,
    }


def run(elements: int, repeats: int) -> dict[str, object]:
    """Measure every implementation, op and bit width; returns the JSON document."""
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(elements).astype(np.float32)
    dst = np.empty_like(x)
    memcpy_s = _median_time(lambda: np.copyto(dst, x), repeats)
    results = []
    peers_missing = []
    native = native_module()
    # the native kernels at the level they loaded at, and at every level this CPU runs but the
    # widest (the baseline: the portable code of the build before run-time dispatch, ADR 0026)
    levels = list(native.isas()) if native is not None else []
    for bits in BITS:
        codes = rng.integers(0, 1 << bits, elements, dtype=np.uint8)
        native_ops = _qpart_ops(Backend.NATIVE, x, codes, bits)  # the level is chosen around each timing
        impls: dict[str, tuple[dict[str, Callable[[], object]] | None, str | None]] = {
            "qpart-native": (native_ops, None),
            **{f"qpart-native@{lv}": (native_ops, lv)
               for lv in levels[1:]},
            "qpart-numpy": (_qpart_ops(Backend.NUMPY, x, codes, bits), None),
            "numpy-packbits": (_packbits_ops(x, codes, bits), None),
            "hqq": (_hqq_ops(x, codes, bits), None),
        }
        for impl, (ops, level) in impls.items():
            if ops is None:
                peers_missing.append(impl)
                continue
            for op in OPS:
                with native_isa_used(level):
                    median_s, floor_s = _paired(ops[op], lambda: np.copyto(dst, x), repeats)
                results.append({"impl": impl, "op": op, "bits": bits, "median_s": median_s,
                                "memcpy_s": floor_s, "ratio_to_memcpy": median_s / floor_s})
                print(f"{impl:<15} {op:<18} b={bits}  {median_s * 1e3:8.2f} ms  "
                      f"{median_s / floor_s:6.2f}x memcpy", file=sys.stderr)
    return {
        "elements": elements, "threads": 1, "memcpy_s": memcpy_s, "results": results,
        "group_size": GROUP, "repeats": repeats,
        "peers": {"numpy-packbits": "numpy.packbits/unpackbits bit stream",
                  "hqq": "hqq.core.bitpack.BitPack (PyPI hqq, --no-deps)"},
        "peers_missing": sorted(set(peers_missing)),
        "machine": {"python": platform.python_version(), "processor": platform.machine(),
                    "torch": torch.__version__, "numpy": np.__version__, "native_isa": native_isa(),
                    "native_levels": levels},
        "ratio_note": "each ratio is the median of the op over the median of a memcpy of the same "
                      "floats timed in alternation with it; memcpy_s at the top is one median at the start",
    }


def _table(doc: dict[str, object]) -> str:
    rows = doc["results"]
    assert isinstance(rows, list)
    impls = sorted({r["impl"] for r in rows}, key=lambda s: (not s.startswith("qpart"), s))
    memcpy_s = doc["memcpy_s"]
    assert isinstance(memcpy_s, float)
    lines = [f"memcpy of {doc['elements']} float32: {memcpy_s * 1e3:.2f} ms "
             f"(ratios below are median_s / memcpy_s)", "",
             "| op | bits | " + " | ".join(impls) + " |", "|---|---|" + "---|" * len(impls)]
    for op in OPS:
        for bits in BITS:
            cells = []
            for impl in impls:
                match = [r for r in rows if r["impl"] == impl and r["op"] == op and r["bits"] == bits]
                cells.append(f"{match[0]['ratio_to_memcpy']:.2f}" if match else "-")
            lines.append(f"| {op} | {bits} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, help="write the results as JSON to this path")
    parser.add_argument("--elements", type=int, default=16_777_216, help="float32 elements (default 2^24)")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per measurement (>= 5)")
    args = parser.parse_args(argv)
    if args.repeats < 5:
        parser.error("--repeats must be at least 5")
    doc = run(args.elements, args.repeats)
    print(_table(doc))
    if args.json:
        write_json(args.json, doc, indent=2)


if __name__ == "__main__":
    main()
