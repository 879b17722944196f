// The activation packet in the kernels' layout, byte for byte: quantization as
// kernels/quantization.py, packing as kernels/packing.py, the header as kernels/wire.py.
// Every float32 operation of the kernels is one Math.fround here: a double result rounded once is
// the float32 result (a double holds more than 2 * 24 + 2 bits), so the codes are the same.

export const FLOAT_BITS = 32;
const MAGIC = [0x51, 0x50, 0x41, 0x01]; // b"QPA" + format 1
const HEAD_BYTES = 12;
const MAX_NDIM = 8;
const BLOCK_COLUMNS = 512;
const BLOCK_CODES = 8 * BLOCK_COLUMNS;
const FLT_MIN = 1.1754943508222875e-38; // np.finfo(np.float32).tiny
const f32 = Math.fround;

export class PacketError extends Error {}

function checkScheme(bits, groupSize) {
  if (!Number.isInteger(bits) || bits < 1 || bits > 8) throw new PacketError(`bits must be 1..8, got ${bits}`);
  if (!Number.isInteger(groupSize) || groupSize < 1) throw new PacketError(`group_size must be >= 1, got ${groupSize}`);
}

/** Per-group (scales, mins) of float32 `x`: scale = max((max - min) / (2^b - 1), FLT_MIN). */
export function groupParams(x, bits, groupSize) {
  checkScheme(bits, groupSize);
  const n = x.length;
  if (n === 0) throw new PacketError("cannot quantize an empty tensor");
  const groups = Math.ceil(n / groupSize);
  const scales = new Float32Array(groups);
  const mins = new Float32Array(groups);
  const qmax = (1 << bits) - 1;
  for (let g = 0; g < groups; g++) {
    const end = Math.min(n, (g + 1) * groupSize);
    let lo = Infinity;
    let hi = -Infinity;
    for (let i = g * groupSize; i < end; i++) {
      const v = x[i];
      if (!Number.isFinite(v)) throw new PacketError("input holds NaN or infinity");
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
    const span = f32(hi - lo);
    if (!Number.isFinite(span)) throw new PacketError("a group's range overflows float32");
    scales[g] = Math.max(f32(span / qmax), FLT_MIN);
    mins[g] = lo + 0; // -0 + 0 is +0, as the kernels store it
  }
  return { scales, mins };
}

/** uint8 codes: trunc(min((x - min) * (1 / scale) + 0.5, 2^b - 1)), all in float32. */
export function quantize(x, bits, groupSize, scales, mins) {
  const qmax = (1 << bits) - 1;
  const limit = qmax + 0.5;
  const codes = new Uint8Array(x.length);
  for (let g = 0; g < scales.length; g++) {
    const inv = f32(1 / scales[g]);
    const mn = mins[g];
    const end = Math.min(x.length, (g + 1) * groupSize);
    for (let i = g * groupSize; i < end; i++) {
      const t = f32(f32(f32(x[i] - mn) * inv) + 0.5);
      codes[i] = t < limit ? Math.trunc(t) : qmax;
    }
  }
  return codes;
}

/** Pack codes into bits * ceil(n / 8) bytes: blocks of 8 * M codes (M = 512, the last block
 * ceil(r / 8)); code i of a block at row i / M, column i % M; a column's eight codes form an
 * 8b-bit little-endian word whose byte t goes to block offset t * M + m. */
export function packCodes(codes, bits) {
  const n = codes.length;
  const out = new Uint8Array(bits * Math.ceil(n / 8));
  let written = 0;
  for (let start = 0; start < n; start += BLOCK_CODES) {
    const count = Math.min(BLOCK_CODES, n - start);
    const m = count === BLOCK_CODES ? BLOCK_COLUMNS : Math.ceil(count / 8);
    for (let col = 0; col < m; col++) {
      for (let r = 0; r < 8; r++) {
        const i = r * m + col;
        const c = i < count ? codes[start + i] : 0; // zero padding of the last block
        if (c === 0) continue;
        for (let t = 0; t < bits; t++) {
          const lo = r * bits - 8 * t;
          if (lo >= 8 || lo + bits <= 0) continue;
          out[written + t * m + col] |= lo >= 0 ? (c << lo) & 0xff : c >> -lo;
        }
      }
    }
    written += bits * m;
  }
  return out;
}

function header(bits, dims, groupSize, size) {
  if (dims.length < 1 || dims.length > MAX_NDIM) {
    throw new PacketError(`an activation needs 1..${MAX_NDIM} dimensions, got ${dims.length}`);
  }
  const buf = new Uint8Array(size);
  const view = new DataView(buf.buffer);
  buf.set(MAGIC, 0);
  view.setUint8(4, bits);
  view.setUint8(5, dims.length);
  view.setUint16(6, 0, true);
  view.setUint32(8, groupSize, true);
  dims.forEach((d, k) => view.setUint32(HEAD_BYTES + 4 * k, d, true));
  return { buf, view, at: HEAD_BYTES + 4 * dims.length };
}

/** The activation packet of float32 `x` of shape `dims`: quantized to `bits` with one (scale, min)
 * per `groupSize` elements, or the float32 values themselves when bits is 32. */
export function encodePacket(x, dims, bits, groupSize) {
  const n = dims.reduce((a, b) => a * b, 1);
  if (n !== x.length) throw new PacketError(`shape [${dims}] has ${n} elements, the activation ${x.length}`);
  if (bits >= FLOAT_BITS) {
    const { buf, view, at } = header(FLOAT_BITS, dims, 0, HEAD_BYTES + 4 * dims.length + 4 * n);
    for (let i = 0; i < n; i++) {
      if (!Number.isFinite(x[i])) throw new PacketError("float activation holds NaN or infinity");
      view.setFloat32(at + 4 * i, x[i], true);
    }
    return buf;
  }
  const { scales, mins } = groupParams(x, bits, groupSize);
  const packed = packCodes(quantize(x, bits, groupSize, scales, mins), bits);
  const groups = scales.length;
  const { buf, view, at } = header(bits, dims, groupSize, HEAD_BYTES + 4 * dims.length + 8 * groups + packed.length);
  for (let g = 0; g < groups; g++) {
    view.setFloat32(at + 4 * g, scales[g], true);
    view.setFloat32(at + 4 * (groups + g), mins[g], true);
  }
  buf.set(packed, at + 8 * groups);
  return buf;
}
