"""Device settings refuse, when they load, what would fail obscurely later (issue 52, review)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from qpart.client.settings import DeviceSettings


@pytest.mark.parametrize("server", ["127.0.0.1:9", "ftp://example.com", "localhost", "http://"])
def test_a_server_that_is_not_an_http_url_is_refused_at_load(server, tmp_path):
    with pytest.raises(ValidationError) as exc:
        DeviceSettings(server=server, cache_dir=tmp_path)
    assert "is not an http(s) URL" in str(exc.value) and "http://127.0.0.1:8000" in str(exc.value)


@pytest.mark.parametrize("server", ["http://127.0.0.1:8000", "https://qpart.example.com/base/"])
def test_an_http_base_url_is_kept_as_given(server, tmp_path):
    assert DeviceSettings(server=server, cache_dir=tmp_path).server == server
