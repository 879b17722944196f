"""The QPART paper's own comparison (issue 27): autoencoder-based offloading at an intermediate cut.

``python -m bench.harness.autoencoder --model fmnist-cnn --cut 3 --out bench/results/autoencoder``

The device runs the float head up to the cut, then a small convolutional encoder (a 3x3 conv and a
strided 3x3 conv: ``C x H x W`` to ``k x ceil(H/2) x ceil(W/2)``); the bottleneck is quantized to
``bits`` with the activation packets' own quantizer (asymmetric, per group of up to 256 values,
:func:`qpart.kernels.wire.encode_quantized_activation`) and uploaded; the server decodes it, runs
the decoder (a transposed conv and a 3x3 conv back to ``C x H x W``, cropped) and the float tail.

Training (BottleNet++-style): the model is frozen; encoder and decoder are fitted on the ``train``
split (the 50,000 images the model was trained on; no calibration or test image) to the model's
labels' cross entropy and the float model's answers (distillation, temperature 4) through the frozen
tail, plus the activation's mean squared error (over its variance), with
the bottleneck fake-quantized in the forward pass (straight-through gradient), Adam, fixed seed.
The test drop is measured on the whole ``test`` split as the promise measures it: the float
model's correct answers less the autoencoder path's, over the count, with the real packet codec
in the loop.

Writes ``OUT/<model>-c<cut>/encoder.safetensors``, ``decoder.safetensors`` and ``meta.json`` (cut,
shapes, bits, group size, packet bytes, test drop, training seconds); ``bench.e2e`` loads them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from bench import REPO, write_json
from qpart.kernels.quantization import activation_group
from qpart.kernels.wire import decode_activation_array, encode_quantized_activation
from qpart.models import METRICS, hits_of
from qpart.models.data import Split
from qpart.models.partition import cuts_of, prepare, split
from qpart.models.registry import get_model
from qpart.models.sources import FashionMnistSource
from qpart.progress import progress_bars

GROUP_LARGEST = 256  # the activation packets' largest group (kernels)
SEED = 0
TEMPERATURE = 4.0  # distillation from the float model's own answers


@dataclass(frozen=True)
class AutoencoderMeta:
    """What a trained autoencoder is and what it measured."""

    model: str
    cut: int
    cut_node: str
    activation_shape: tuple[int, int, int]
    channels: int
    bottleneck_shape: tuple[int, int, int]
    bits: int
    group_size: int
    nonnegative: bool
    packet_bytes: int
    test_images: int
    float_correct: int
    correct: int
    test_drop: float
    train_seconds: float
    epochs: int


class Encoder(nn.Module):
    """``C x H x W`` to ``k x ceil(H/2) x ceil(W/2)``."""

    def __init__(self, c: int, k: int) -> None:
        super().__init__()
        self.a = nn.Conv2d(c, max(k, c // 2), 3, padding=1)
        self.b = nn.Conv2d(max(k, c // 2), k, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(F.relu(self.a(x)))  # type: ignore[no-any-return]


class Decoder(nn.Module):
    """``k x h x w`` back to ``C x H x W`` (the transposed conv doubles, the crop trims an odd side);
    ends in a ReLU where the cut's activation is non-negative."""

    def __init__(self, c: int, k: int, hw: tuple[int, int], nonnegative: bool) -> None:
        super().__init__()
        self.a = nn.ConvTranspose2d(k, max(k, c // 2), 4, stride=2, padding=1)
        self.b = nn.Conv2d(max(k, c // 2), c, 3, padding=1)
        self.hw = hw
        self.nonnegative = nonnegative

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        y = self.b(F.relu(self.a(z)))[..., : self.hw[0], : self.hw[1]]
        return F.relu(y) if self.nonnegative else y


def fake_quantize_groups(z: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """Asymmetric round-to-nearest per group of ``group`` values of each sample (the packets'
    quantizer), with a straight-through gradient."""
    flat = z.reshape(z.shape[0], -1, group)
    lo = flat.amin(-1, keepdim=True)
    hi = flat.amax(-1, keepdim=True)
    scale = torch.clamp((hi - lo) / (2**bits - 1), min=1e-12)
    q = torch.round((flat - lo) / scale) * scale + lo
    return (flat + (q - flat).detach()).reshape(z.shape)


def _split_model(name: str, cut: int) -> tuple[nn.Module, nn.Module, str]:
    spec = get_model(name)
    gm = prepare(spec.load().eval(), spec.input_shape)
    c = cuts_of(gm)[cut]
    head, tail = split(gm, c)
    for p in [*head.parameters(), *tail.parameters()]:
        p.requires_grad_(False)
    return head.eval(), tail.eval(), c.node


def split_images(name: str, split: Split, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A split's images as ``name``'s card preprocesses them, and its labels: for the 28x28 models
    ``load_split``'s images bit for bit, for fmnist-mobilenet 3x64x64 RGB (as the grid's device
    feeds its head)."""
    source = FashionMnistSource(split, limit=limit, spec=get_model(name).preprocess)
    batch = next(source.batches(len(source)))
    return batch.images, batch.labels


def train(name: str, cut: int, channels: int, bits: int, epochs: int, batch: int = 128,
          limit: int | None = None) -> tuple[Encoder, Decoder, dict[str, Any]]:
    """Fit encoder and decoder at ``cut`` of the frozen ``name``; returns them and their shapes."""
    torch.manual_seed(SEED)
    head, tail, node = _split_model(name, cut)
    images, labels = split_images(name, Split.TRAIN, limit)
    x_all, y_all = torch.from_numpy(images), torch.from_numpy(labels)
    with torch.inference_mode():
        sample = head(x_all[:256])
    c, h, w = (int(d) for d in sample.shape[1:])
    enc = Encoder(c, channels)
    dec = Decoder(c, channels, (h, w), nonnegative=bool((sample >= 0).all()))
    bottleneck = tuple(int(d) for d in enc(sample[:1].clone()).shape[1:])
    group = activation_group(math.prod(bottleneck), GROUP_LARGEST)
    params = [*enc.parameters(), *dec.parameters()]
    opt = torch.optim.Adam(params, lr=2e-3)
    steps = epochs * math.ceil(len(x_all) / batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps)
    gen = torch.Generator().manual_seed(SEED)
    with progress_bars() as bars:
        task = bars.add_task(f"train {name} cut {cut}", total=steps)
        for _ in range(epochs):
            perm = torch.randperm(len(x_all), generator=gen)
            for idx in (perm[i : i + batch] for i in range(0, len(perm), batch)):
                with torch.no_grad():
                    a = head(x_all[idx])
                    teacher = F.log_softmax(tail(a) / TEMPERATURE, 1)
                a_hat = dec(fake_quantize_groups(enc(a), bits, group))
                logits = tail(a_hat)
                distil = F.kl_div(F.log_softmax(logits / TEMPERATURE, 1), teacher, log_target=True,
                                  reduction="batchmean") * TEMPERATURE**2
                loss = (distil + F.cross_entropy(logits, y_all[idx])
                        + F.mse_loss(a_hat, a) / a.var().clamp(min=1e-6))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                bars.update(task, advance=1)
    return enc.eval(), dec.eval(), {"activation_shape": (c, h, w), "bottleneck_shape": bottleneck,
                                    "group_size": group, "cut_node": node, "nonnegative": dec.nonnegative}


def run_path(head: nn.Module, enc: nn.Module, dec: nn.Module, tail: nn.Module, x: torch.Tensor,
             bits: int, group: int) -> torch.Tensor:
    """Logits through head, encoder, the real packet (encode, decode) one sample at a time, decoder
    and tail: what device and server compute."""
    with torch.inference_mode():
        z = enc(head(x)).numpy()
        back = [decode_activation_array(encode_quantized_activation(z[i : i + 1], bits, group))[0]
                for i in range(len(z))]
        return tail(dec(torch.from_numpy(np.concatenate(back))))  # type: ignore[no-any-return]


def test_drop(name: str, cut: int, enc: nn.Module, dec: nn.Module, bits: int, group: int,
              limit: int | None = None, batch: int = 500) -> tuple[int, int, int]:
    """(images, float model's correct, autoencoder path's correct) on the test split."""
    head, tail, _ = _split_model(name, cut)
    model = get_model(name).load().eval()
    images, labels = split_images(name, Split.TEST, limit)
    base = hits = 0
    with torch.inference_mode():
        for i in range(0, len(images), batch):
            x = torch.from_numpy(images[i : i + batch])
            y = labels[i : i + batch]
            base += int(hits_of(METRICS["top1-drop"], model(x), y).sum())
            logits = run_path(head, enc, dec, tail, x, bits, group)
            hits += int(hits_of(METRICS["top1-drop"], logits, y).sum())
    return len(images), base, hits


def save(folder: Path, enc: nn.Module, dec: nn.Module, meta: AutoencoderMeta) -> None:
    """Weights as safetensors (nothing pickled), the record as JSON."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in enc.state_dict().items()}, str(folder / "encoder.safetensors"))
    save_file({k: v.contiguous() for k, v in dec.state_dict().items()}, str(folder / "decoder.safetensors"))
    write_json(folder / "meta.json", asdict(meta))


def load(folder: Path) -> tuple[Encoder, Decoder, AutoencoderMeta]:
    """A saved autoencoder: encoder, decoder (eval mode) and its record."""
    raw = json.loads((folder / "meta.json").read_text())
    raw.pop("provenance", None)  # bench.write_json's record of the commit
    for key in ("activation_shape", "bottleneck_shape"):
        raw[key] = tuple(raw[key])
    meta = AutoencoderMeta(**raw)
    c, h, w = meta.activation_shape
    enc = Encoder(c, meta.channels)
    enc.load_state_dict(load_file(str(folder / "encoder.safetensors")))
    dec = Decoder(c, meta.channels, (h, w), nonnegative=meta.nonnegative)
    dec.load_state_dict(load_file(str(folder / "decoder.safetensors")))
    return enc.eval(), dec.eval(), meta


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a model of the zoo (qpart models)")
    parser.add_argument("--cut", type=int, required=True, help="an intermediate legal cut (qpart models)")
    parser.add_argument("--channels", type=int, default=8, help="bottleneck channels (default 8)")
    parser.add_argument("--bits", type=int, default=4, help="bottleneck bits per value (default 4)")
    parser.add_argument("--epochs", type=int, default=4, help="passes over the train split (default 4)")
    parser.add_argument("--limit", type=int, default=None, help="first N train and test images (tests)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "autoencoder")
    args = parser.parse_args(argv)
    if not 1 <= args.bits <= 8:
        parser.error(f"--bits is 1 to 8, not {args.bits}")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    start = time.perf_counter()
    enc, dec, shapes = train(args.model, args.cut, args.channels, args.bits, args.epochs, limit=args.limit)
    seconds = time.perf_counter() - start
    n, base, hits = test_drop(args.model, args.cut, enc, dec, args.bits, shapes["group_size"], args.limit)
    packet = len(encode_quantized_activation(np.zeros((1, *shapes["bottleneck_shape"]), np.float32),
                                             args.bits, shapes["group_size"]))
    meta = AutoencoderMeta(model=args.model, cut=args.cut, cut_node=shapes["cut_node"],
                           activation_shape=shapes["activation_shape"], channels=args.channels,
                           bottleneck_shape=shapes["bottleneck_shape"], bits=args.bits,
                           group_size=shapes["group_size"], nonnegative=shapes["nonnegative"],
                           packet_bytes=packet, test_images=n,
                           float_correct=base, correct=hits, test_drop=(base - hits) / n,
                           train_seconds=round(seconds, 1), epochs=args.epochs)
    save(args.out / f"{args.model}-c{args.cut}", enc, dec, meta)
    print(f"{args.model} cut {args.cut}: bottleneck {meta.bottleneck_shape} at {args.bits} bits, "
          f"{packet} B a packet; test drop {meta.test_drop:+.4f} ({base} -> {hits} of {n}); "
          f"trained in {seconds:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
