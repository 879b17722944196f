"""The client's plan and answer models against the server: real plans and answers validate, and
every field the client requires is one the server's OpenAPI document requires too."""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
from typing import Any

import httpx
import numpy as np
import pytest
from pydantic import BaseModel

import qpart.server
from qpart.client import plans
from qpart.client.errors import ServerAnswerError
from qpart.client.plans import HeadSpec, PacketFormat, PlanResponse, TailResponse, parse_answer
from qpart.client.runtime import DeviceRuntime, encode_for_plan, upload_body
from qpart.client.settings import DeviceSettings
from qpart.client.transport import Transport
from qpart.kernels.coding import Coding
from qpart.profiles.devices import get_device
from qpart.server import oip_schemas, schemas
from tests.client.samples import ANSWER, PLAN
from tests.server.conftest import make_client

FAST = {"schema_version": 1, "name": "fast-board", "flops_per_s": 5e11, "power_compute_w": 2.0,
        "power_tx_w": 1.0, "rtt_s": 0.02}
REQUESTS = {
    "all-server": {"rate_bps": 1e9},
    "all-device": {"rate_bps": 1e10, "device": FAST},  # ships a segment, uploads nothing
    "lossless": {"rate_bps": 1e6, "accuracy_demand": 0.0},
    "zstd": {"rate_bps": 1e6, "upload_codings": ["zstd"]},  # with coding times: see _coded
}


@pytest.fixture(scope="module")
def app(cnn_only):
    with make_client(cnn_only) as c:
        yield c


def _coded(app) -> dict[str, Any]:
    """A Raspberry Pi profile that cannot run a head but compresses every packet in 1 us."""
    info = app.get("/v1/models/fmnist-cnn").json()
    profile = get_device("raspberry-pi-4").model_dump(mode="json")
    coded = [dict.fromkeys([*range(1, 9), 32], 1e-6)] * info["cuts"]
    slow_heads = [0.0] + [1.0] * (info["cuts"] - 1)
    profile["measured"] = {"fmnist-cnn": {"version": info["version"], "head_s": slow_heads,
                                          "zstd_s": coded, "warmup": 0, "repeats": 1}}
    return profile


def _schema_ref(prop: dict[str, Any]) -> str | None:
    """The name of the model a property holds (itself, nullable, or as list items), if any."""
    for option in [prop, *prop.get("anyOf", []), prop.get("items", {})]:
        if "$ref" in option:
            return str(option["$ref"]).rsplit("/", 1)[1]
    return None


def _nullable(prop: dict[str, Any]) -> bool:
    return any(option.get("type") == "null" for option in prop.get("anyOf", []))


def _gaps(client: dict[str, Any], server: dict[str, Any], client_defs: dict[str, Any],
          server_defs: dict[str, Any], where: str = "") -> list[str]:
    """What the client's schema needs that the server's does not promise, field by field."""
    gaps = [f"{where}{name} is not required" for name in client.get("required", [])
            if name not in server.get("required", [])]
    for name, prop in client["properties"].items():
        theirs = server["properties"].get(name)
        if theirs is None:
            gaps.append(f"{where}{name} is unknown to the server")
            continue
        if _nullable(theirs) and not _nullable(prop):
            gaps.append(f"{where}{name} may be null")
        mine, their_ref = _schema_ref(prop), _schema_ref(theirs)
        # Into models on both sides (an enum such as the coding has values, not fields).
        if mine is not None and their_ref is not None and "properties" in client_defs[mine]:
            inner = f"{where}{name}."
            gaps += _gaps(client_defs[mine], server_defs[their_ref], client_defs, server_defs, inner)
    return gaps


def _contract_gaps(model: type[PlanResponse | TailResponse], openapi: dict[str, Any], name: str) -> list[str]:
    mine = model.model_json_schema()
    server_defs = openapi["components"]["schemas"]
    return _gaps(mine, server_defs[name], mine.get("$defs", {}), server_defs)


@pytest.mark.parametrize("model", [PlanResponse, TailResponse])
def test_every_field_the_client_requires_the_server_requires(app, model):
    assert _contract_gaps(model, app.get("/openapi.json").json(), model.__name__) == []


# The device reads only these of the server's document; the rest it ignores (extra="ignore").
PARTIAL = {"ModelMetadata": {"parameters"}}


def _json_fields(model: type[BaseModel]) -> set[str]:
    return {field.alias or name for name, field in model.model_fields.items()}


def _client_wire_classes() -> dict[str, type[BaseModel]]:
    """The classes the device parses (parse_answer's kinds) and every model their fields hold."""
    read = [PlanResponse, TailResponse, plans.ModelMetadata, plans.AuditReceipt]
    held = {name for model in read for name in model.model_json_schema().get("$defs", {})}
    return {c.__name__: c for c in read} | {name: getattr(plans, name) for name in held
                                           if isinstance(getattr(plans, name, None), type)
                                           and issubclass(getattr(plans, name), BaseModel)}


def _server_classes() -> list[type]:
    """Every class defined in a module of the server package."""
    found = []
    for module in pkgutil.walk_packages(qpart.server.__path__, "qpart.server."):
        loaded = importlib.import_module(module.name)
        found += [c for _, c in inspect.getmembers(loaded, inspect.isclass) if c.__module__ == module.name]
    return found


def test_each_wire_type_has_the_servers_name():
    wire = _client_wire_classes()
    assert {"PlanResponse", "SegmentRef", "CostBreakdown", "TimeBreakdown", "TailResult", "TopK"} <= set(wire)
    for name, mine in wire.items():
        theirs = getattr(schemas, name, None) or getattr(oip_schemas, name, None)
        assert isinstance(theirs, type) and issubclass(theirs, BaseModel), f"the server has no {name}"
        expected = PARTIAL.get(name, _json_fields(theirs))
        assert _json_fields(mine) == expected and expected <= _json_fields(theirs), name
    # Every model of the client's module is a wire type or a base of one (HeadSpec, PacketFormat: the
    # plan's parts that patterns also read as), and no server class reuses a client name for
    # something else.
    ours = {c for _, c in inspect.getmembers(plans, inspect.isclass)
            if c.__module__ == plans.__name__ and issubclass(c, BaseModel)}
    bases = {b for c in wire.values() for b in c.__mro__}
    assert ours <= bases
    names = {c.__name__ for c in ours}
    def server_twin(name: str) -> object:
        return getattr(schemas, name, None) or getattr(oip_schemas, name, None)

    clashes = [f"{c.__module__}.{c.__name__}" for c in _server_classes()
               if c.__name__ in names and c is not server_twin(c.__name__)]
    assert clashes == []
    assert {c.__name__ for c in ours if server_twin(c.__name__) is None} == {
        "HeadSpec", "PacketFormat", "_Wire"}


def test_the_contract_check_sees_a_dropped_field(app):
    openapi = app.get("/openapi.json").json()
    openapi["components"]["schemas"]["PlanResponse"]["required"].remove("cut_node")
    openapi["components"]["schemas"]["SegmentRef"]["required"].remove("url")
    del openapi["components"]["schemas"]["TimeBreakdown"]["properties"]["total"]
    assert _contract_gaps(PlanResponse, openapi, "PlanResponse") == [
        "cut_node is not required",
        *(f"{c}.time_s.total is unknown to the server" for c in ("predicted", "all_server", "all_device")),
        "segment.url is not required", "input_image_plan.time_s.total is unknown to the server"]
    # and a server that makes a field nullable breaks a client that needs it
    openapi["components"]["schemas"]["PlanResponse"]["properties"]["plan_id"] = {
        "anyOf": [{"type": "string"}, {"type": "null"}]}
    assert "plan_id may be null" in _contract_gaps(PlanResponse, openapi, "PlanResponse")


@pytest.mark.parametrize("changes", REQUESTS.values(), ids=REQUESTS.keys())
def test_real_plans_and_their_answers_read_as_the_client_models(app, changes):
    body = {"model": "fmnist-cnn", "accuracy_demand": 0.01, "device": _coded(app), **changes}
    sent = app.post("/v1/plan", json=body)
    assert sent.status_code == 200, sent.text
    plan = parse_answer(PlanResponse, sent.content)
    assert (plan.segment is not None) == (changes.get("device") is FAST)
    assert plan.upload_encoding == changes.get("upload_codings", ["identity"])[0]
    # every field the server sent that the client knows reads back as sent
    known = {k: v for k, v in sent.json().items() if k in PlanResponse.model_fields}
    assert plan.model_dump(mode="json", exclude_unset=True) == known
    if plan.infer_url is None:
        return
    activation = np.random.default_rng(0).random((2, *plan.activation_shape), np.float32)
    upload, headers = upload_body(plan, encode_for_plan(activation, plan))
    answer = app.post(plan.infer_url, content=upload, headers=headers)
    assert answer.status_code == 200, answer.text
    tail = parse_answer(TailResponse, answer.content)
    assert tail.plan_id == plan.plan_id and len(tail.results) == 2 and tail.results[0].top_k


def test_patterns_read_as_the_packet_format_and_head_they_describe(app):
    info = app.get("/v1/models/fmnist-cnn").json()
    for pattern in info["patterns"]:
        packing = PacketFormat.model_validate(pattern)
        assert (packing.activation_bits, packing.upload_encoding) == (pattern["activation_bits"], "identity")
        head = HeadSpec.model_validate({**pattern, "model": info["model"], "version": info["version"],
                                        "cuts": info["cuts"]})
        assert head.cut == pattern["cut"]


def test_unknown_fields_are_ignored_and_codings_read_as_the_kernels_enum():
    plan = PlanResponse.model_validate({**PLAN, "upload_encoding": "zstd", "added_later": {"x": 1}})
    assert plan.upload_encoding is Coding.ZSTD and "added_later" not in plan.model_dump()


@pytest.mark.parametrize(("broken", "where"), [
    ({k: v for k, v in PLAN.items() if k != "cut_node"}, "cut_node"),
    ({**PLAN, "upload_encoding": "brotli"}, "upload_encoding"),
    ({**PLAN, "activation_bits": 0}, "activation_bits"),
    ({**PLAN, "segment": {"id": "x"}}, "segment.url"),
])
def test_a_plan_the_client_cannot_read_is_a_device_error_naming_the_field(broken, where):
    with pytest.raises(ServerAnswerError, match=rf"PlanResponse does not read .*\({where}"):
        parse_answer(PlanResponse, httpx.Response(200, json=broken).content)


def test_a_body_that_is_not_json_is_a_device_error():
    with pytest.raises(ServerAnswerError, match="TailResponse"):
        parse_answer(TailResponse, b"<html>bad gateway</html>")


def test_the_runtime_returns_typed_plans_and_answers(tmp_path):
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=PLAN if request.url.path == "/v1/plan" else ANSWER)

    conf = DeviceSettings(server="http://qpart.test", cache_dir=tmp_path)
    client = httpx.Client(base_url=conf.server, transport=httpx.MockTransport(handler))
    runtime = DeviceRuntime(conf, transport=Transport(conf, client=client))
    plan = runtime.plan("fmnist-cnn", 0.01, rate_bps=1e6)
    assert isinstance(plan, PlanResponse) and plan.segment is None and plan.predicted.time_s.total == 0.007
    answer = runtime.upload(plan, b"packet")
    assert answer.results[0].logits == [0.5, 2.0, -1.0] and answer.queue_s == 0.001


def test_image_qualities_read_from_metadata_and_anything_else_is_refused():
    from qpart.client.plans import ModelMetadata
    from qpart.models.image_codecs import webp_encoder

    mine, other = json.dumps(webp_encoder()), json.dumps("Pillow 9.0.0, libwebp 1.2.0, lossy, method 6")
    listed = (f'[{{"codec":"webp","quality":75,"level":0.01,"encoder":{mine}}},'
              f'{{"codec":"webp","quality":95,"level":0.0025,"encoder":{mine}}},'
              f'{{"codec":"webp","quality":60,"level":0.01,"encoder":{other}}},'
              f'{{"codec":"avif","quality":50,"level":0.01,"encoder":{mine}}}]')
    # another encoder's promise is not this device's to use: its bytes at quality 60 are others
    assert ModelMetadata(parameters={"image_qualities": listed}).image_qualities == [(75, 0.01), (95, 0.0025)]
    assert ModelMetadata(parameters={}).image_qualities == []
    unnamed = '[{"codec":"webp","quality":75,"level":0.01}]'  # a server that names no encoder
    assert ModelMetadata(parameters={"image_qualities": unnamed}).image_qualities == []
    for broken in ('{"quality": 75}', f'[{{"codec":"webp","quality":0,"level":0.01,"encoder":{mine}}}]',
                   f'[{{"codec":"webp","quality":75,"level":1.5,"encoder":{mine}}}]',
                   f'[{{"codec":"webp","quality":"75","level":0.01,"encoder":{mine}}}]',
                   f'[{{"codec":"webp","quality":true,"level":0.01,"encoder":{mine}}}]',
                   '[{"codec":"webp","quality":75,"level":0.01,"encoder":7}]', "[1]", "not json"):
        with pytest.raises(ServerAnswerError, match="image_qualities"):
            _ = ModelMetadata(parameters={"image_qualities": broken}).image_qualities
