"""The one error mapping: a 404 for an unknown model names what is served only to a caller who
may see model names (ADR 0009: with a token and ``QPART_PROTECT_MODELS``, the token holder)."""

from __future__ import annotations

import pytest

from tests.server.conftest import make_client

TOKEN = {"Authorization": "Bearer s3cret"}
UNKNOWN = ("/v2/models/nosuch/ready", "/v2/models/nosuch-tail/ready",
           "/v2/models/nosuch/versions/1/ready", "/v2/models/fmnist-cnn/versions/nosuch/ready")


@pytest.fixture(scope="module")
def private(cnn_only):
    with make_client(cnn_only, auth_token="s3cret") as c:
        yield c


def _version(client) -> str:
    return client.get("/v2/models/fmnist-cnn", headers=TOKEN).json()["versions"][0]


@pytest.mark.parametrize("path", UNKNOWN)
def test_readiness_of_an_unknown_model_names_no_served_model_without_the_token(private, path):
    answer = private.get(path)
    assert answer.status_code == 404, answer.text
    error = answer.json()["error"]
    assert "nosuch" in error  # it says what was not found
    assert "fmnist-cnn" not in error.replace("model 'fmnist-cnn'", ""), error
    assert _version(private) not in error and "served models" not in error, error


@pytest.mark.parametrize("path", UNKNOWN)
def test_the_token_holder_is_told_what_is_served(private, path):
    error = private.get(path, headers=TOKEN).json()["error"]
    assert "served models: fmnist-cnn" in error or f"versions: {_version(private)}" in error, error


def test_with_models_public_an_unknown_model_lists_the_served_ones(cnn_only):
    with make_client(cnn_only, auth_token="s3cret", protect_models=False) as c:
        assert "served models: fmnist-cnn" in c.get("/v2/models/nosuch/ready").json()["error"]


def test_readiness_of_a_served_model_stays_open(private):
    assert private.get("/v2/models/fmnist-cnn/ready").json() == {"name": "fmnist-cnn", "ready": True}
    assert private.get(f"/v2/models/fmnist-cnn/versions/{_version(private)}/ready").status_code == 200


def test_server_readiness_counts_restarting_models_without_naming_them(private, monkeypatch):
    monkeypatch.setattr(private.app.state.engine.tails, "stalled_models", lambda: {"fmnist-cnn"})
    answer = private.get("/v2/health/ready")
    assert answer.status_code == 503 and "fmnist-cnn" not in answer.text
    assert "tail inference of 1 model(s) is restarting" in answer.json()["error"]
    assert "fmnist-cnn" in private.get("/v2/health/ready", headers=TOKEN).json()["error"]
