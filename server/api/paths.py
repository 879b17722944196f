"""Every route's path, written once: the routers register these templates, the fast path and the
metrics labels match them, and the HTTP layer fills them in to make links."""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RoutePath:
    """A route's path template in Starlette's form (``{name}`` matches one path segment)."""

    template: str
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = re.split(r"\{(\w+)\}", self.template)
        pattern = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>[^/]+)" for i, p in enumerate(parts))
        object.__setattr__(self, "regex", re.compile(pattern))

    def match(self, path: str) -> dict[str, str] | None:
        """The path's parameters if ``path`` is this route's, else None."""
        found = self.regex.fullmatch(path)
        return found.groupdict() if found else None

    def format(self, **params: str) -> str:
        """The path with ``params`` filled in."""
        return self.template.format(**params)


PLAN = RoutePath("/v1/plan")
MODEL_INFO = RoutePath("/v1/models/{model}")
SEGMENT = RoutePath("/v1/segments/{segment_id}")
TAIL_INFER = RoutePath("/v1/models/{model}/versions/{version}/patterns/{pattern_id}/infer")
ADMIN_SEGMENT_CACHE = RoutePath("/v1/admin/segment-cache")
AUDIT = RoutePath("/v1/audits/{audit_id}")

V2_SERVER = RoutePath("/v2")
V2_LIVE = RoutePath("/v2/health/live")
V2_READY = RoutePath("/v2/health/ready")
V2_MODEL = RoutePath("/v2/models/{model}")
V2_MODEL_VERSION = RoutePath("/v2/models/{model}/versions/{version}")
V2_MODEL_READY = RoutePath("/v2/models/{model}/ready")
V2_MODEL_VERSION_READY = RoutePath("/v2/models/{model}/versions/{version}/ready")
V2_INFER = RoutePath("/v2/models/{model}/infer")
V2_INFER_VERSION = RoutePath("/v2/models/{model}/versions/{version}/infer")

METRICS = RoutePath("/metrics")

# The requests metric's route label of each path (bounded: no ids). Paths not listed here are
# "v2_meta" under /v2 and "other" elsewhere.
LABELS: tuple[tuple[RoutePath, str], ...] = (
    (TAIL_INFER, "tail_infer"), (V2_INFER, "v2_infer"), (V2_INFER_VERSION, "v2_infer"),
    (PLAN, "plan"), (SEGMENT, "segment"), (METRICS, "metrics"), (AUDIT, "audit"),
)


def route_label(path: str) -> str:
    """A bounded route label for metrics (no ids in it)."""
    for route, label in LABELS:
        if route.regex.fullmatch(path):
            return label
    return "v2_meta" if path == "/v2" or path.startswith("/v2/") else "other"
