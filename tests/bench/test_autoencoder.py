"""bench.harness.autoencoder: training sees the quantizer the wire applies, and what is saved loads back."""

from __future__ import annotations

import json

import numpy as np
import torch

from bench.harness import autoencoder
from qpart.kernels.wire import decode_activation_array, encode_quantized_activation
from qpart.models.data import Split, load_split


def test_training_quantizes_the_bottleneck_as_the_packet_does():
    z = torch.randn(3, 8, 7, 7, generator=torch.Generator().manual_seed(1)) * 3
    for bits in (2, 4, 8):
        fake = autoencoder.fake_quantize_groups(z, bits, 196).numpy()
        packets = [encode_quantized_activation(z[i : i + 1].numpy(), bits, 196) for i in range(3)]
        wire = np.concatenate([decode_activation_array(p)[0] for p in packets])
        np.testing.assert_allclose(fake, wire, atol=1e-5 * float(z.abs().max()))


def test_the_quantizer_passes_gradients_straight_through():
    z = torch.randn(2, 4, 2, 2, requires_grad=True)
    autoencoder.fake_quantize_groups(z, 2, 16).sum().backward()
    assert z.grad is not None and torch.equal(z.grad, torch.ones_like(z))


def test_a_short_run_trains_measures_and_saves_what_loads_back(tmp_path):
    autoencoder.main(["--model", "fmnist-cnn", "--cut", "3", "--channels", "2", "--epochs", "1",
                      "--limit", "256", "--out", str(tmp_path)])
    folder = tmp_path / "fmnist-cnn-c3"
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["activation_shape"] == [32, 14, 14] and meta["bottleneck_shape"] == [2, 7, 7]
    assert meta["test_images"] == 256 and meta["test_drop"] == (meta["float_correct"] - meta["correct"]) / 256
    enc, dec, loaded = autoencoder.load(folder)
    assert loaded.packet_bytes == len(encode_quantized_activation(np.zeros((1, 2, 7, 7), np.float32), 4, 98))
    x = torch.rand(1, 32, 14, 14)
    with torch.inference_mode():
        y = dec(enc(x))
    assert y.shape == x.shape and bool((y >= 0).all())  # the cut's activation is a ReLU's


def test_the_images_are_the_cards_preprocessing():
    cnn, labels = autoencoder.split_images("fmnist-cnn", Split.TEST, limit=8)
    want = load_split(Split.TEST, limit=8)
    assert np.array_equal(cnn, want.images) and np.array_equal(labels, want.labels)
    mobile, mobile_labels = autoencoder.split_images("fmnist-mobilenet", Split.TEST, limit=8)
    assert mobile.shape == (8, 3, 64, 64) and mobile.dtype == np.float32
    assert np.array_equal(mobile_labels, want.labels)
