"""Settings of the serving process (``QPART_*`` environment variables)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class ServerSettings(BaseSettings):
    """How the server runs; what the models are comes from the artifact files."""

    model_config = SettingsConfigDict(env_prefix="QPART_", frozen=True)

    artifacts: Path = Field(Path("artifacts"), description="Folder of calibration artifacts (sub-folders).")
    host: str = Field("127.0.0.1", description="Bind address.")
    port: int = Field(8000, ge=0, le=65535, description="Bind port (0 = any free port).")
    auth_token: SecretStr | None = Field(None, description="Bearer token required on inference routes.")
    admin_token: SecretStr | None = Field(None, description="Bearer token of /v1/admin (unset: disabled).")
    max_body_bytes: int = Field(8 << 20, ge=1024, description="Largest accepted request body (413 above).")
    max_image_pixels: int = Field(
        4096 * 4096, ge=1, le=1 << 26, description="Most pixels of an input image (ADR 0014) the "
        "server decodes; a larger one is refused from its PNG header, and never planned (at most "
        "2^26, under Pillow's own decompression-bomb bound).")
    max_plan_body_bytes: int = Field(
        1 << 20, ge=64 << 10, description="Largest accepted plan request body (413 above; at most "
        "QPART_MAX_BODY_BYTES): a plan is small, and its JSON is parsed on the event loop, so an 8 MiB "
        "one held every request for a tenth of a second. An inline device profile fits with the "
        "times of 16 models of 256 cuts.")
    body_timeout_s: float = Field(10.0, gt=0, description="Time allowed to receive a request body (408).")
    request_timeout_s: float = Field(30.0, gt=0, description="Per-request processing timeout (504).")
    segment_cache_bytes: int = Field(64 << 20, ge=0, description="Byte budget of cached head segments.")
    max_batch_size: int = Field(32, ge=1, le=4096, description="Largest dynamic batch of tail requests.")
    max_queue_delay_s: float = Field(
        0.0, ge=0, le=1, description="Longest wait to fill a batch (0: batch what queued meanwhile).")
    max_queue: int = Field(256, ge=1, description="Queued tail requests per model before 503.")
    retry_after_s: float = Field(1.0, gt=0, description="Retry-After sent with 503 on overload.")
    torch_threads: int = Field(1, ge=1, le=64, description="torch intra-op threads per tail worker.")
    tail_workers: int = Field(1, ge=1, le=64, description="Threads running tail batches.")
    price_per_second: float = Field(1.0, ge=0, description="Server cost per second of tail compute (C).")
    graceful_timeout_s: float = Field(
        20.0, ge=0, description="Max wait on shutdown for in-flight requests, and for idle connections "
                                "to end after their next answer or at their keep-alive timeout (ADR 0022).")
    drain_delay_s: float = Field(
        0.0, ge=0, description="After SIGTERM: readiness 503 and every answer says `connection: close`, "
                               "then wait this long before the listener closes.")
    inference_fast_path: bool = Field(
        True, description="Serve well-formed infer POSTs straight from ASGI (false: via FastAPI's router; "
                          "same answers, more CPU per request).")
    proxy_headers: bool = Field(
        False, description="Trust X-Forwarded-For/-Proto from 127.0.0.1 (uvicorn's proxy headers); the "
                           "server uses neither client address nor scheme, so off saves a layer.")
    opentelemetry: bool = Field(
        False, description="FastAPI's native OpenTelemetry to the global providers (off: /metrics is the "
                           "telemetry, and no request pays FastAPI's provider checks).")
    metrics_created: bool = Field(
        False, description="Export the `_created` series of counters and histograms on /metrics "
                           "(off: fewer series; Prometheus does not need them).")
    api_docs: bool = Field(
        False, description="Serve the interactive API pages /docs and /redoc (they load Swagger UI and "
                           "ReDoc from a CDN into the browser); off: the OpenAPI document at "
                           "/openapi.json only.")
    public_url: str = Field("", description="Base URL put into segment links (default: relative URLs).")
    protect_models: bool = Field(
        True, description="With QPART_AUTH_TOKEN set, segment downloads, model listings and metadata, and "
                          "/metrics (its labels name every model and version) need the token too (a "
                          "level-0 segment is the whole model's weights); false: they are public. Health "
                          "and readiness stay public, naming no model but the one asked for (ADR 0009).")
    max_header_bytes: int = Field(
        64 << 10, ge=1024, le=16 << 20, description="Largest request line plus headers; above it the "
                                                    "server answers 431 and closes the connection.")
    header_timeout_s: float = Field(
        10.0, gt=0, le=300, description="Time a connection has to send a request's head (from opening, "
                                        "or from its first byte after a keep-alive pause); then 408 "
                                        "and closed.")
    keepalive_timeout_s: int = Field(
        5, ge=1, le=300, description="Idle time between requests on a kept-alive connection before "
                                       "the server closes it.")
    max_connections: int = Field(
        4096, ge=1, le=1 << 20, description="Open connections at most; a connection beyond it is closed "
                                            "at once, so the established ones keep being served (keep "
                                            "it under the process's file descriptor limit).")

    audit_rate: float = Field(
        0.0, ge=0, le=1, description="Share of plans marked for a live audit (0: off), among requests "
        "whose device consents ('audit': true): the device then uploads the raw input after its "
        "answer, and the float model's top-1 is compared with the answer given (ADR 0024).")
    audit_delta: float = Field(
        0.01, gt=0, lt=0.5, description="The chance that a live audit's confidence sequence ever "
        "excludes the true disagreement rate of a (model, version, level), however often it is looked "
        "at; each alert on it is wrong at most this often.")
    audit_window: int = Field(
        10_000, ge=100, le=1 << 30, description="Audited samples per window of a (model, version, "
        "level): each window's confidence sequence starts afresh, so a change shows within about a "
        "window however long the server ran before it (ADR 0024).")
    audit_quiet_s: float = Field(
        0.002, ge=0, le=1, description="An audit's float model starts only once no tail has run or "
        "waited this long: longer, fewer audits run beside answers and fewer run at all under load.")
    audit_queue: int = Field(
        64, ge=1, le=1 << 16, description="Audits waiting for the float model at most; one more is "
                                          "dropped and counted (qpart_audit_dropped_total), never queued.")
    audit_ttl_s: float = Field(
        300.0, gt=0, le=86400, description="Seconds an audit stays open after its plan: its tail "
                                           "request and then its input upload must come within them.")
    audit_open_max: int = Field(
        10000, ge=1, le=1 << 20, description="Open audits at most; a plan beyond it is not audited.")
    audit_keep_dir: Path | None = Field(
        None, description="Keep the inputs whose float answer disagreed here, for recalibration "
                          "(unset: every audited input is discarded once compared).")
    audit_keep_bytes: int = Field(
        256 << 20, ge=0, description="The most bytes kept in QPART_AUDIT_KEEP_DIR; the oldest files "
                                     "go first.")

    @field_validator("auth_token", "admin_token")
    @classmethod
    def _a_token_is_not_empty(cls, token: SecretStr | None) -> SecretStr | None:
        if token is not None and not token.get_secret_value().strip():
            raise ValueError("an empty or whitespace-only token is no credential: set a token, or "
                             "unset the variable to run without one")
        return token
