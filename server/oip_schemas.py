"""Wire models of the Open Inference Protocol (KServe v2) as this server speaks it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Datatype = Literal["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                   "FP16", "FP32", "FP64", "BYTES"]
Parameter = bool | int | float | str


class InferInputTensor(BaseModel):
    """A v2 request input; ``data`` is absent when the tensor travels as binary data."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=256)
    shape: list[Annotated[int, Field(ge=0, le=1 << 31)]] = Field(max_length=16)
    datatype: Datatype
    parameters: dict[str, Parameter] | None = None
    data: list[Any] | None = None


class InferRequestedOutput(BaseModel):
    """A v2 requested output."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=256)
    parameters: dict[str, Parameter] | None = None


class InferRequest(BaseModel):
    """A v2 inference request (JSON part)."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(None, max_length=256)
    parameters: dict[str, Parameter] | None = None
    inputs: list[InferInputTensor] = Field(min_length=1, max_length=16)
    outputs: list[InferRequestedOutput] | None = Field(None, max_length=16)


class InferOutputTensor(BaseModel):
    """A v2 response output."""

    name: str
    shape: list[int]
    datatype: Datatype
    parameters: dict[str, Parameter] | None = None
    data: list[Any] | None = None


class InferResponse(BaseModel):
    """A v2 inference response (JSON part)."""

    model_name: str
    model_version: str | None = None
    id: str | None = None
    parameters: dict[str, Parameter] | None = None
    outputs: list[InferOutputTensor]


class TensorMetadata(BaseModel):
    """Name, datatype and shape of a model input or output (-1 = variable)."""

    name: str
    datatype: Datatype
    shape: list[int]


class ModelMetadata(BaseModel):
    """``GET /v2/models/{m}``; ``parameters`` holds what the model card declares, each a JSON
    string (protocol parameters are strings, numbers or booleans): ``preprocess`` (the
    :class:`models.preprocess.PreprocessSpec` object) and ``labels`` (class names in logit order)."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]
    parameters: dict[str, Parameter] | None = None


class ServerMetadata(BaseModel):
    """``GET /v2``."""

    name: str
    version: str
    extensions: list[str]
