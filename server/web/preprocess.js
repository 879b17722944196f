// An image to a model input as models/preprocess.py does: color mode, resize, center crop, then
// (pixel * scale - mean[c]) / std[c] in float64 rounded once to float32, channels first.
// Same pixels give the same floats; a resize here is the canvas's, close to Pillow's, not equal.

export const FASHION_MNIST_SPEC = Object.freeze({
  color: "L", resize: [28, 28], center_crop: null, interpolation: "bilinear",
  scale: 1 / 255, mean: [0], std: [1], layout: "CHW",
});

function resizedSize(width, height, spec) {
  if (spec.resize == null) return [width, height];
  if (Array.isArray(spec.resize)) return [spec.resize[1], spec.resize[0]];
  const short = Math.min(width, height);
  const long = Math.trunc((spec.resize * Math.max(width, height)) / short);
  return width <= height ? [spec.resize, long] : [long, spec.resize];
}

/** RGBA pixels of `blob` after the spec's resize and center crop: {data, width, height}. */
export async function decodePixels(blob, spec) {
  // No color management and no premultiplication: a PNG's stored values are the pixels.
  const bitmap = await createImageBitmap(blob, { colorSpaceConversion: "none", premultiplyAlpha: "none" });
  const [width, height] = resizedSize(bitmap.width, bitmap.height, spec);
  let [cropW, cropH] = [width, height];
  if (spec.center_crop) {
    [cropH, cropW] = spec.center_crop;
    if (cropH > height || cropW > width) {
      throw new Error(`image is ${width}x${height} after resizing, smaller than the center crop ${cropW}x${cropH}`);
    }
  }
  const left = Math.round((width - cropW) / 2);
  const top = Math.round((height - cropH) / 2);
  const canvas = new OffscreenCanvas(cropW, cropH);
  const ctx = canvas.getContext("2d", { willReadFrequently: true });
  ctx.imageSmoothingEnabled = spec.interpolation !== "nearest";
  ctx.imageSmoothingQuality = "high";
  ctx.drawImage(bitmap, -left, -top, width, height);
  bitmap.close();
  return { data: ctx.getImageData(0, 0, cropW, cropH).data, width: cropW, height: cropH };
}

/** float32 [C * H * W] from RGBA pixels: Pillow's ITU-R 601-2 luma for L, alpha dropped. */
export function normalize(pixels, spec) {
  const { data, width, height } = pixels;
  const channels = spec.color === "L" ? 1 : 3;
  const tables = [];
  for (let c = 0; c < channels; c++) {
    const table = new Float32Array(256);
    for (let v = 0; v < 256; v++) table[v] = (v * spec.scale - spec.mean[c]) / spec.std[c];
    tables.push(table);
  }
  const plane = width * height;
  const out = new Float32Array(channels * plane);
  for (let i = 0; i < plane; i++) {
    const [r, g, b] = [data[4 * i], data[4 * i + 1], data[4 * i + 2]];
    if (channels === 1) {
      out[i] = tables[0][(r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16];
    } else {
      out[i] = tables[0][r];
      out[plane + i] = tables[1][g];
      out[2 * plane + i] = tables[2][b];
    }
  }
  return { data: out, dims: [channels, height, width] };
}
