"""bench.micro.input_codecs: the input-compression baseline's bytes and drops are measured, not assumed."""

from __future__ import annotations

import json

import numpy as np

from bench.harness.baseline_routes import decode_image as decode
from bench.micro.input_codecs import CODECS, encode, main
from qpart.models.data import Split, load_split_pixels


def test_png_round_trips_the_pixels_and_lossy_codecs_do_not():
    pixels, _, _ = load_split_pixels(Split.TEST, limit=3)
    for p in pixels:
        assert np.array_equal(np.asarray(decode(encode(p, "png"))), p)
        assert not np.array_equal(np.asarray(decode(encode(p, "webp@50")).convert("L")), p)
        assert decode(encode(p, "jpeg@90")).size == (28, 28)


def test_the_run_records_every_codec_with_a_drop_against_the_float_model(tmp_path):
    out = tmp_path / "codecs.json"
    main(["--limit", "40", "--model", "fmnist-cnn", "--json", str(out)])
    doc = json.loads(out.read_text())["models"]["fmnist-cnn"]
    assert doc["images"] == 40 and set(doc["codecs"]) == set(CODECS)
    png = doc["codecs"]["png"]
    assert png["test_drop"] == 0.0 and png["correct"] == doc["float_correct"]  # lossless
    for c in doc["codecs"].values():
        assert c["test_drop"] == (doc["float_correct"] - c["correct"]) / 40
        assert 0 < c["bytes_median"] <= c["bytes_p95"] and c["encode_us"] > 0
    # quality orders size within a codec
    webp = [doc["codecs"][f"webp@{q}"]["bytes_mean"] for q in (50, 75, 90, 95)]
    assert webp == sorted(webp)
    assert set(doc["planner_cut0_upload_bytes"]) >= {"0.0", "0.01"}
