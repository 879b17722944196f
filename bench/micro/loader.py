"""Whether the ImageFolder loader streams in bounded memory: peak RSS and images/s over a generated
folder of JPEGs, with and without decoding worker processes.

``python -m bench.micro.loader [--images 20000] [--batch 500] [--workers 0 2] [--folder DIR] [--json PATH]``

Generates ``--images`` JPEGs of 224×224 (smooth random pictures, quality 90, 100 classes) unless
``--folder`` already holds them, then streams the folder through
:class:`models.sources.ImageFolderSource` with an ImageNet-style spec (RGB, shorter side to 256,
center crop 224, per-channel mean and std) at ``--batch`` images a batch, the way calibration
reads it: one batch at a time, the previous one dropped. Each worker count runs in a fresh
process, so each peak is its own: the loader's peak RSS (``ru_maxrss``, which is ``VmHWM``), the
largest worker's, and their sum bound (loader + workers × largest worker). A batch of 500 is
301 MB of float32; the stated bound is 1 GiB for the loader. It measures memory and speed, not
accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from bench import REPO, write_json
from qpart.models.preprocess import PreprocessSpec
from qpart.models.sources import ImageFolderSource

IMAGENET_SPEC = PreprocessSpec(color="RGB", resize=256, center_crop=(224, 224),
                               mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
BOUND_BYTES = 1 << 30
CLASSES = 100
SIDE = 224


def generate_folder(root: Path, count: int, seed: int = 0) -> int:
    """``count`` JPEGs of SIDE×SIDE in ``CLASSES`` class folders; the bytes written."""
    rng = np.random.default_rng(seed)
    written = 0
    for i in range(count):
        folder = root / f"class{i % CLASSES:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        coarse = rng.integers(0, 256, (14, 14, 3), dtype=np.uint8)  # upsampled: JPEG-sized like a photo
        noise = rng.integers(-12, 13, (SIDE, SIDE, 3))
        smooth = np.asarray(Image.fromarray(coarse).resize((SIDE, SIDE), Image.Resampling.BICUBIC), np.int64)
        path = folder / f"{i:06d}.jpg"
        picture = np.clip(smooth + noise, 0, 255).astype(np.uint8)
        Image.fromarray(picture).save(path, format="JPEG", quality=90)
        written += path.stat().st_size
    return written


def _vm_hwm_bytes() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def measure_one(folder: Path, workers: int, batch: int) -> dict[str, Any]:
    """Stream the folder once in this process; speed and this process's peak memory."""
    source = ImageFolderSource(folder, IMAGENET_SPEC, workers=workers)
    started = time.perf_counter()
    first_batch_s = None
    images = 0
    checksum = 0.0
    for got in source.batches(batch):
        if first_batch_s is None:
            first_batch_s = time.perf_counter() - started
        images += got.images.shape[0]
        checksum += float(got.images[:, :, ::37, ::37].sum())  # touch the batch as a consumer would
        del got
    seconds = time.perf_counter() - started
    digest_started = time.perf_counter()
    source.content_sha256()
    # This process's own peak: VmHWM is its memory's high-water mark since exec; ru_maxrss keeps
    # the parent's peak across fork and exec on Linux (a 1.1 GB pytest process's child read 1.1 GB)
    self_peak = _vm_hwm_bytes() or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    child_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return {
        "workers": workers, "images": images, "seconds": seconds, "images_per_s": images / seconds,
        "first_batch_s": first_batch_s, "digest_s": time.perf_counter() - digest_started,
        "peak_rss_bytes": self_peak, "vm_hwm_bytes": _vm_hwm_bytes(),
        "largest_worker_peak_rss_bytes": child_peak if workers else 0,
        "peak_rss_sum_bound_bytes": self_peak + workers * child_peak,
        "within_bound": self_peak <= BOUND_BYTES, "checksum": checksum,
    }


def _run_isolated(folder: Path, workers: int, batch: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "bench.micro.loader", "--measure-one", str(folder), "--workers", str(workers),
         "--batch", str(batch)],
        cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"measuring {workers} workers failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def run(images: int, batch: int, workers: list[int], folder: Path | None) -> dict[str, Any]:
    """Generate (unless given) and stream the folder once per worker count."""
    scratch = None
    if folder is None:
        scratch = Path(tempfile.mkdtemp(prefix="qpart-loader-"))
        folder = scratch / "images"
    try:
        generated_s, folder_bytes = None, None
        if not folder.is_dir():
            started = time.perf_counter()
            folder_bytes = generate_folder(folder, images)
            generated_s = time.perf_counter() - started
        runs = [_run_isolated(folder, w, batch) for w in workers]
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return {
        "images": runs[0]["images"] if runs else images, "image_side": SIDE, "classes": CLASSES,
        "batch_size": batch, "batch_float32_bytes": batch * 3 * 224 * 224 * 4,
        "spec": IMAGENET_SPEC.model_dump(mode="json"), "bound_bytes": BOUND_BYTES,
        "generated_s": generated_s, "folder_bytes": folder_bytes, "cpu_count": os.cpu_count(),
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=20_000, help="JPEGs to generate (default 20000)")
    parser.add_argument("--batch", type=int, default=500, help="images a batch (default 500, as calibration)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2],
                        help="decoding worker counts to measure, each in its own process (default 0 2)")
    parser.add_argument("--folder", type=Path,
                        help="an existing ImageFolder to read, or where to generate one and keep it "
                             "(default: a temporary folder, removed)")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "loader.json",
                        help="where to write the results (default bench/results/loader.json)")
    parser.add_argument("--measure-one", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.measure_one is not None:
        print(json.dumps(measure_one(args.measure_one, args.workers[0], args.batch)))
        return
    doc = run(args.images, args.batch, args.workers, args.folder)
    for row in doc["runs"]:
        print(f"workers {row['workers']}: {row['images_per_s']:7.1f} images/s, loader peak RSS "
              f"{row['peak_rss_bytes'] / 2**20:6.1f} MiB (bound {BOUND_BYTES / 2**20:.0f} MiB: "
              f"{'within' if row['within_bound'] else 'OVER'}), largest worker "
              f"{row['largest_worker_peak_rss_bytes'] / 2**20:.1f} MiB")
    write_json(args.json, doc)


if __name__ == "__main__":
    main()
