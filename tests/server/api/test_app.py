"""What ``create_app`` serves beside the routes: /metrics behind the token when models are private,
no CDN-loaded API pages unless asked for, and no redirect that writes the Host header back."""

from __future__ import annotations

import pytest

from tests.server.conftest import make_client

TOKEN = {"Authorization": "Bearer s3cret"}


def test_metrics_need_the_token_when_models_are_private(cnn_only):
    with make_client(cnn_only, auth_token="s3cret") as c:
        c.get("/v2/models/fmnist-cnn/ready")  # a labelled series for the served model
        denied = c.get("/metrics")
        assert denied.status_code == 401 and denied.headers["www-authenticate"] == "Bearer"
        assert "fmnist-cnn" not in denied.text and "token" in denied.json()["error"]
        assert c.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        scraped = c.get("/metrics", headers=TOKEN)
        assert scraped.status_code == 200 and 'model="fmnist-cnn"' in scraped.text


@pytest.mark.parametrize("settings", [{}, {"auth_token": "s3cret", "protect_models": False}],
                         ids=["no token", "models public"])
def test_metrics_stay_open_when_models_are_not_private(cnn_only, settings):
    with make_client(cnn_only, **settings) as c:
        c.get("/v2/models/fmnist-cnn/ready")
        scraped = c.get("/metrics")
        assert scraped.status_code == 200 and 'model="fmnist-cnn"' in scraped.text


def test_the_api_pages_that_load_a_cdn_are_off_by_default(client):
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        answer = client.get(path)
        assert answer.status_code == 404, path
        assert "cdn" not in answer.text.lower() and "/openapi.json" in answer.json()["error"]
    assert client.get("/openapi.json").json()["info"]["title"] == "QPART serving"


def test_the_api_pages_are_served_when_asked_for(cnn_only):
    with make_client(cnn_only, api_docs=True) as c:
        assert c.get("/docs").status_code == 200 and "swagger" in c.get("/docs").text.lower()
        assert c.get("/redoc").status_code == 200


@pytest.mark.parametrize("path", ["/v2/health/ready/", "/v1/models/fmnist-cnn/", "/metrics/", "/v2/"])
def test_a_trailing_slash_is_a_404_that_writes_no_host_back(client, path):
    answer = client.get(path, headers={"Host": "evil.example"}, follow_redirects=False)
    assert answer.status_code == 404, (answer.status_code, answer.headers)
    assert "location" not in answer.headers
    assert all("evil.example" not in v for v in answer.headers.values())
    assert f"no route GET {path}" in answer.json()["error"]


def test_the_device_page_redirect_names_no_host(client):
    answer = client.get("/device", headers={"Host": "evil.example"}, follow_redirects=False)
    assert answer.status_code == 308 and answer.headers["location"] == "/device/"
