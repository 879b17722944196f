"""The naive baselines of issue 27, as devices in a cell run them and as the cost model prices them.

- ``input-<codec>`` (``input-png``, ``input-webp@75`` ...): the device compresses the input image
  it holds (the IDX file's 28x28 grayscale pixels, before any preprocessing) with Pillow and
  uploads it; the server decodes it, preprocesses it as the card declares and runs the float
  model (``input-png``: the product's input-image plan, ADR 0014; a WebP quality the model's
  calibration promises: the product's lossy input-image plan, ADR 0015; the others:
  :mod:`bench.harness.baseline_routes`). Its test drop is the one :mod:`bench.micro.input_codecs`
  measured on the whole test split (``bench/results/input_codecs.json``), or for a quality only
  the calibration measured, the artifact's (the same measure on the same split).
- ``autoencoder@k``: the device runs the float head to cut ``k`` (the lossless pattern's segment)
  and :mod:`bench.harness.autoencoder`'s encoder (its weights downloaded once, like a segment), quantizes
  the bottleneck into an activation packet and uploads it; the server decodes it, runs the decoder
  and the float tail. Test drop: the autoencoder's ``meta.json``.

Both are priced with the planner's own :func:`qpart.server.planning.planner.price_upload`: the baseline is
a pattern at its cut whose activation bytes are the upload's (the mean over the cell's images of
the encoded sizes; the autoencoder's packed bottleneck with its scales), whose device encode time
is what this host measured for the baseline's own device work (scaled to the device, as every
device time is), and whose server time is the tail's plus this host's decoding time. A codec's
encode time is priced by its own record, as the product's device prices by its own
(:mod:`qpart.client.image_offers`, which uses its record from the first encode): the median of its
last 16 encodes in earlier rounds, once there are :data:`SERVED_LEAST`; before that, a timing loop
here on image 0. In the grid at 7535ea1, where the loop priced every encode, the rounds' encodes
took longer (predicted over measured device time, median per model and codec, 0.62 to 0.84; the
loop runs hot, and image 0 is among the fastest images to encode), and the cnn's
``input-webp@60`` came out 11.5% off end to end. The
autoencoder's encoder download adds its bytes to the head segment's and one more exchange.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
from PIL import Image

from bench import REPO
from bench.e2e.artifacts import is_float, packet_bytes
from bench.e2e.config import DEMAND
from bench.e2e.device import Link, ModelView, server_parts, server_timing
from bench.harness import autoencoder
from bench.harness.baseline_routes import decode_image
from bench.harness.codecs import CODECS as RECORDED_CODECS
from bench.harness.codecs import encode
from bench.harness.device_clock import ENCODE_RUNS, HEAD_RUNS
from qpart.client.image_offers import WINDOW as OFFER_WINDOW
from qpart.kernels.wire import decode_activation_array, encode_quantized_activation
from qpart.models.image_codecs import WEBP, encode_webp, rung_id
from qpart.models.preprocess import preprocess_image
from qpart.models.registry import get_model
from qpart.models.timing import median_seconds
from qpart.profiles.artifacts import CalibrationArtifact
from qpart.profiles.costs import HTTP_EXCHANGE_BYTES, PlanInputs
from qpart.profiles.devices import DeviceProfile
from qpart.server.planning.images import CONTENT_TYPE, INPUT_PNG
from qpart.server.planning.planner import price_upload
from qpart.server.planning.webp import CONTENT_TYPE as WEBP_TYPE

CODECS = ("png", "webp@75", "webp@90", "jpeg@90")
CODEC_RESULTS = REPO / "bench" / "results" / "input_codecs.json"
AUTOENCODERS = REPO / "bench" / "results" / "autoencoder"
ENCODER_PREFIX = "ae-encoder-"  # what a device that holds an autoencoder's encoder lists as held
TIMING_SECONDS = 0.1  # host timing of a baseline's device and server work, per cell
SERVED_WINDOW, SERVED_LEAST = 9, 3  # the server's decoding: its last 9 reports, once there are 3


@dataclass
class Baseline:
    """One naive baseline of one model: what it sends and what it measured on test."""

    name: str
    kind: str  # "codec" or "ae"
    cut: int
    test_drop: float
    codec: str = ""
    encoder: torch.nn.Module | None = None
    decoder: torch.nn.Module | None = None
    meta: autoencoder.AutoencoderMeta | None = None
    encoder_bytes: bytes = b""
    host_local_s: float = 0.0  # this host's device work beyond the head (encode; encoder + quantize)
    host_server_s: float = 0.0  # this host's server work beyond the tail (decode, preprocess; decoder)
    upload_bytes: float = 0.0  # priced body bytes
    sizes: list[int] = field(default_factory=list)
    served: deque[float] = field(default_factory=lambda: deque(maxlen=SERVED_WINDOW))  # server decodes
    encoded: deque[float] = field(default_factory=lambda: deque(maxlen=OFFER_WINDOW))  # host encodes, rounds

    @property
    def meets_demand(self) -> bool:
        return self.test_drop <= DEMAND


def encode_input(pixels: np.ndarray, codec: str) -> bytes:
    """One grayscale image as ``codec`` encodes it: :mod:`bench.micro.input_codecs`'s codecs, or a WebP at
    any quality by the product's encoder (the same bytes as ``input_codecs``' WebPs, method 6)."""
    if codec in RECORDED_CODECS:
        return encode(pixels, codec)
    name, _, quality = codec.partition("@")
    if name != WEBP or not quality.isdigit():
        raise ValueError(f"no encoder for the codec {codec!r}")
    return encode_webp(Image.fromarray(pixels, "L"), int(quality))


def product_quality(artifact: CalibrationArtifact, demand: float = DEMAND) -> int | None:
    """The WebP quality a device offers at ``demand``, as the product's client picks it: the lowest
    the calibration promises at a level no looser (ADR 0015)."""
    ladder = artifact.image_ladder
    rungs = [] if ladder is None else [r for r in ladder.rungs if r.level is not None and r.level <= demand]
    return min((r.quality for r in rungs), default=None)


def promised(artifact: CalibrationArtifact, codec: str) -> bool:
    """Whether ``codec`` (``webp@75`` ...) is a quality the artifact's ladder promises at some level:
    the product's lossy input-image plan then takes it."""
    ladder = artifact.image_ladder
    return ladder is not None and any(f"webp@{r.quality}" == codec and r.levels for r in ladder.rungs)


def load_baselines(model: str, codecs: tuple[str, ...] = CODECS, autoencoders: Path = AUTOENCODERS,
                   codec_results: Path = CODEC_RESULTS,
                   artifact: CalibrationArtifact | None = None) -> list[Baseline]:
    """The model's codec baselines (with their recorded test drops), the quality the product's
    device offers at the grid's demand when it is not one of them (its test drop the artifact's),
    and its autoencoders."""
    recorded = json.loads(codec_results.read_text())["models"][model]["codecs"]
    out = [Baseline(f"input-{c}", "codec", 0, float(recorded[c]["test_drop"]), codec=c) for c in codecs]
    quality = None if artifact is None else product_quality(artifact)
    if artifact is not None and artifact.image_ladder is not None and quality is not None \
            and f"webp@{quality}" not in codecs:
        rung = next(r for r in artifact.image_ladder.rungs if r.quality == quality)
        assert rung.test_drop is not None  # measured for every promised rung
        out.append(Baseline(rung_id(WEBP, quality), "codec", 0, rung.test_drop, codec=f"webp@{quality}"))
    for folder in sorted(autoencoders.glob(f"{model}-c*")):
        enc, dec, meta = autoencoder.load(folder)
        out.append(Baseline(f"autoencoder@{meta.cut}", "ae", meta.cut, meta.test_drop, encoder=enc,
                            decoder=dec, meta=meta,
                            encoder_bytes=(folder / "encoder.safetensors").read_bytes()))
    return out


def _bottleneck(b: Baseline, act: torch.Tensor) -> bytes:
    assert b.encoder is not None and b.meta is not None
    with torch.inference_mode():
        z = b.encoder(act).numpy()
    return encode_quantized_activation(z, b.meta.bits, b.meta.group_size)


def _packet_bytes(meta: autoencoder.AutoencoderMeta) -> int:
    """The bottleneck's codes and scales, as a pattern's ``activation_bytes`` counts them."""
    return packet_bytes(int(np.prod(meta.bottleneck_shape)), meta.bits, meta.group_size)


def profile(b: Baseline, model: ModelView, pixels: np.ndarray, image: np.ndarray) -> None:
    """This host's times for the baseline's own device and server work, and its upload bytes."""
    if b.kind == "codec":
        spec = get_model(model.name).preprocess
        assert spec is not None
        if len(b.sizes) != len(pixels):  # the same images every cell: their sizes once
            b.sizes = [len(encode_input(p, b.codec)) for p in pixels]
        body = encode_input(pixels[0], b.codec)
        b.host_local_s = _recent(b.encoded, lambda: encode_input(pixels[0], b.codec))
        b.host_server_s = _served(b, lambda: preprocess_image(decode_image(body), spec))
        b.upload_bytes = float(np.mean(b.sizes))
        return
    assert b.meta is not None and b.decoder is not None
    head = model.heads[f"ae-head-{b.cut}"]
    with torch.inference_mode():
        act = head(torch.from_numpy(image))
    packet = _bottleneck(b, act)
    b.host_local_s = _timed(lambda: _bottleneck(b, act))
    decoder = b.decoder

    def server() -> None:
        with torch.inference_mode():
            decoder(torch.from_numpy(decode_activation_array(packet)[0]))

    b.host_server_s = _served(b, server)
    b.upload_bytes = float(_packet_bytes(b.meta))


def _served(b: Baseline, fn: Any) -> float:
    """The server's decoding time for ``b``: the median of what its last answers reported
    (``Server-Timing``) once there are :data:`SERVED_LEAST`, as the server prices its own image
    plans; before that this host's timing of ``fn``. A timing loop runs hot where a served request,
    among the other strategies' requests, decodes cold (0.05 against 0.2 to 0.4 ms for a 28x28
    WebP here)."""
    return _recent(b.served, fn)


def _recent(samples: deque[float], fn: Any) -> float:
    """The median of ``samples`` once there are :data:`SERVED_LEAST`, else this host's timing of ``fn``."""
    if len(samples) >= SERVED_LEAST:
        return float(np.median(samples))
    return _timed(fn)


def _timed(fn: Any) -> float:
    runs, start, times = 0, time.perf_counter(), []
    while runs < 5 or time.perf_counter() - start < TIMING_SECONDS:
        times.append(median_seconds(fn, warmup=ENCODE_RUNS["settle"], repeats=ENCODE_RUNS["burst"]))
        runs += 1
    return float(np.median(times))


def predict(b: Baseline, model: ModelView, device: DeviceProfile, inputs: PlanInputs, ratio: float,
            segment: dict[str, Any] | None) -> dict[str, Any]:
    """The cost model's price of the baseline (see the module's docstring)."""
    lossless = next(p for p in model.artifact.patterns if is_float(p.model_dump()) and p.cut == b.cut)
    pseudo = lossless.model_copy(update={"activation_bits": 8, "activation_bytes": b.upload_bytes})
    measured = device.measured[model.name]
    encode_s = list(measured.encode_s)
    encode_s[b.cut] = b.host_local_s * ratio
    dev = device.model_copy(update={"measured": {
        **device.measured, model.name: measured.model_copy(update={"encode_s": encode_s})}})
    seg_bytes = (segment["size_bytes"] if segment else 0) + len(b.encoder_bytes)
    costs = price_upload(model.artifact, pseudo, segment["id"] if segment else None, seg_bytes,
                         dataclasses.replace(inputs, device=dev, upload_codings=frozenset()),
                         model.tail_s[b.cut] + b.host_server_s, model.answer_bytes).model_dump()
    if b.encoder_bytes and segment and segment["id"] not in inputs.held:  # the encoder's own exchange
        extra = inputs.rtt_s + HTTP_EXCHANGE_BYTES * 8 / inputs.rate_bps
        w = inputs.weights
        costs["time_s"]["transfer"] += extra
        costs["time_s"]["total"] += extra
        costs["energy_j"]["transfer"] += device.power_tx_w * extra
        costs["energy_j"]["total"] += device.power_tx_w * extra
        costs["objective"] += w.time * extra + w.energy * device.power_tx_w * extra
        costs["transfer_bytes"] += HTTP_EXCHANGE_BYTES
    return costs


def image_route(model: ModelView, pattern_id: str = INPUT_PNG) -> str:
    """The tail route of the product's input-image plan (ADR 0014, 0015) for ``model``."""
    return f"/v1/models/{model.name}/versions/{model.version}/patterns/{pattern_id}/infer"


def run_once(client: httpx.Client, url: str, model: ModelView, b: Baseline, pixels: np.ndarray,
             image: np.ndarray, ratio: float, link: Link) -> dict[str, float]:
    """One inference of the baseline: its device work (timed, scaled), upload, server answer.
    ``input-png`` and the WebP qualities the calibration promises go to the product's input-image
    plans, the other codecs and the autoencoders to :mod:`bench.harness.baseline_routes`."""
    headers: dict[str, str] = {}
    if b.kind == "codec":
        host = median_seconds(lambda: encode_input(pixels, b.codec), warmup=ENCODE_RUNS["settle"],
                              repeats=ENCODE_RUNS["burst"])
        b.encoded.append(host)  # what the device's next offer and price go by
        body, path = encode_input(pixels, b.codec), f"/bench/input/{model.name}"
        if b.codec == "png":  # the product's own input-image plan (ADR 0014) takes it
            path, headers = image_route(model), {"Content-Type": CONTENT_TYPE}
        elif promised(model.artifact, b.codec):  # and its lossy one (ADR 0015)
            path, headers = image_route(model, b.name), {"Content-Type": WEBP_TYPE}
    else:
        head = model.heads[f"ae-head-{b.cut}"]
        x = torch.from_numpy(image)
        with torch.inference_mode():  # as bench.e2e.device.run_once times a head
            host = median_seconds(lambda: head(x), warmup=HEAD_RUNS["settle"], repeats=HEAD_RUNS["burst"])
            act = head(x)
        host += median_seconds(lambda: _bottleneck(b, act), warmup=ENCODE_RUNS["settle"],
                               repeats=ENCODE_RUNS["burst"])
        body, path = _bottleneck(b, act), f"/bench/ae/{model.name}/{b.cut}"
    link.wire.quiet()
    start = time.perf_counter()
    r = client.post(url + path, content=body, headers=headers)
    round_trip = time.perf_counter() - start
    r.raise_for_status()
    answer = r.json()
    decode_s = server_timing(r.headers.get("server-timing"))
    if decode_s is not None:
        b.served.append(decode_s)
    return {"local": host * ratio, "round_trip": round_trip,
            "server": answer["queue_s"] + answer["compute_s"], "upload_bytes": float(len(body)),
            **server_parts(answer, r.headers.get("server-timing"))}
