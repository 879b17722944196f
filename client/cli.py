"""``qpart device …``: the device CLI (infer, profile, cache). Heavy imports stay inside commands."""

from __future__ import annotations

import json
import re
import unicodedata
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from qpart.client.settings import DeviceSettings

if TYPE_CHECKING:
    from qpart.client.device import DeviceClient, InferenceRun
    from qpart.client.plans import ModelMetadata

device_app = typer.Typer(help="Run inference as an edge device, profile it, manage its segment cache.",
                         no_args_is_help=True)
cache_app = typer.Typer(help="List and prune the segment cache.", no_args_is_help=True)
device_app.add_typer(cache_app, name="cache")


def _env_help(field: str) -> str:
    """Help of the option for a device setting: its description, default and variable."""
    info = DeviceSettings.model_fields[field]
    default = "none" if info.default is None else info.default
    return f"{info.description} (default: {default}, env QPART_DEVICE_{field.upper()})"


def print_version(value: bool) -> None:
    """``--version``: print ``qpart <version>`` of the installed distribution and exit."""
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        shown = version("qpart-serving")
    except PackageNotFoundError:
        shown = "(not installed)"
    typer.echo(f"qpart {shown}")
    raise typer.Exit


VersionOpt = Annotated[bool, typer.Option("--version", callback=print_version, is_eager=True,
                                          help="Print the version and exit.")]
ServerOpt = Annotated[str | None, typer.Option(help=_env_help("server"))]
CacheOpt = Annotated[Path | None, typer.Option(help=_env_help("cache_dir"))]


@device_app.callback()
def device_options(version: VersionOpt = False) -> None:
    """Run inference as an edge device, profile it, manage its segment cache."""


@cache_app.callback()
def cache_options(version: VersionOpt = False) -> None:
    """List and prune the segment cache."""


def _settings(**flags: object) -> DeviceSettings:
    """Device settings from the environment, with the flags that were given (not None) on top."""
    given: dict[str, Any] = {name: value for name, value in flags.items() if value is not None}
    return DeviceSettings(**given)


def _load_inputs(card: ModelMetadata, images: list[Path], idx: Path | None,
                 labels: Path | None, limit: int | None) -> tuple[Any, Any]:
    """IDX tensors as they are, or image files preprocessed as the model's card declares."""
    from qpart.client.errors import DeviceInputError
    from qpart.client.inputs import read_idx_images, read_image_files, read_labels

    if idx is not None:
        x = read_idx_images(idx, limit)
    else:
        x = read_image_files(images[:limit] if limit else images, card.input_spec)
    y = read_labels(labels, limit) if labels is not None else None
    if y is not None and len(y) != len(x):
        raise DeviceInputError(f"{labels} holds {len(y)} labels for {len(x)} inputs: give one label "
                               "per input, in the same order")
    return x, y


def terminal_text(text: str) -> str:
    """``text`` from the server made safe to print: every control character (ESC of ANSI and OSC
    sequences, CR, BEL, newlines, C1 controls) and every Unicode line or bidi control shown as its
    escape (``\\x1b``), so a label or an error string cannot drive the terminal or forge lines."""
    return "".join(ascii(ch)[1:-1] if _unsafe(ch) else ch for ch in text)


def _unsafe(ch: str) -> bool:
    return unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")


def _say(run: InferenceRun, accuracy: float | None, names: tuple[str, ...] | None) -> None:
    """``infer``'s lines for a person; text from the server with its control characters escaped."""
    predicted = run.plan.predicted.time_s
    p = run.plan
    if p.upload_content_type in ("image/png", "image/webp"):
        coding = "PNG" if p.upload_content_type == "image/png" else f"WebP, level {p.level}"
        typer.echo(f"plan: the input image itself ({coding}, preprocessed and run on the server); "
                   f"uploaded {run.uploaded_bytes} B")
    else:
        lossless = " (lossless: no quantized pattern is certified at this demand)" if p.lossless else ""
        typer.echo(f"plan: cut {p.cut}/{p.cuts - 1} level {p.level} activation "
                   f"{p.activation_bits} bits{lossless}; downloaded {run.downloaded_bytes} B, "
                   f"uploaded {run.uploaded_bytes} B")
    typer.echo(f"time: measured {run.timings_s['total']:.3f} s, predicted {predicted.total:.3f} s")
    if run.audit is not None:  # ADR 0024: after the answers, the input of the plan's first upload
        typer.echo(f"audit: {terminal_text(run.audit)}")
    if accuracy is not None:
        typer.echo(f"accuracy: {accuracy:.4f} on {len(run.predictions)} inputs")
    else:
        shown = _shown(_named(run.predictions, names))
        typer.echo(f"predictions: {terminal_text(shown)}")


def _named(predictions: list[int], names: tuple[str, ...] | None) -> list[dict[str, Any]]:
    """Each predicted class index as ``{"label": index}``, with its card ``name`` when known."""
    if names is None:
        return [{"label": i} for i in predictions]
    return [{"label": i, "name": names[i]} if 0 <= i < len(names) else {"label": i} for i in predictions]


def _shown(predictions: list[dict[str, Any]]) -> str:
    """The first 20 predictions as ``index (name)``."""
    shown = [f"{p['label']} ({p['name']})" if "name" in p else str(p["label"]) for p in predictions[:20]]
    return ", ".join(shown) + (" …" if len(predictions) > 20 else "")


def _document(run: InferenceRun, accuracy: float | None,
              names: tuple[str, ...] | None = None) -> dict[str, Any]:
    """``infer --json``: the plan and results as the server sent them, what the run measured, and
    the predicted classes with their card names."""
    return {"plan": run.plan.model_dump(mode="json", exclude_unset=True),
            "results": [r.model_dump(mode="json", exclude_unset=True) for r in run.results],
            "predictions": _named(run.predictions, names),
            "accuracy": accuracy, "timings_s": run.timings_s,
            "predicted_s": run.plan.predicted.time_s.model_dump(mode="json"),
            "downloaded_bytes": run.downloaded_bytes, "uploaded_bytes": run.uploaded_bytes,
            "audit": run.audit}


def _device_runtime(name: str) -> type[DeviceClient]:
    """The device class for ``--runtime``: only the chosen one is imported (torch for 'torch')."""
    if name == "onnx":
        from qpart.client.onnx_runtime import OnnxDeviceRuntime

        return OnnxDeviceRuntime
    from qpart.client.runtime import DeviceRuntime

    return DeviceRuntime


@device_app.command()
def infer(
    images: Annotated[list[Path] | None, typer.Argument(
        help="Image files (JPEG, PNG, WebP, …), made into the model's input as its card declares (the "
        "preprocessing the server announces in /v2 metadata).")] = None,
    model: Annotated[str, typer.Option(help="Model to run.")] = "fmnist-cnn",
    demand: Annotated[float, typer.Option(help="Max accepted level in the model's metric (its card's "
                                                "promise: top-1 drop by default), e.g. 0.01 for 1%.")] = 0.01,
    idx: Annotated[Path | None, typer.Option(help="IDX images file (.gz or raw) instead of images.")] = None,
    labels: Annotated[Path | None, typer.Option(help=(
        "Labels of the inputs, in their order, to also report accuracy: an IDX1 file (.gz or raw), a "
        ".npy integer array, or a text file of one class index a line."))] = None,
    limit: Annotated[int | None, typer.Option(help="Use only the first N inputs.")] = None,
    rate_mbps: Annotated[float | None, typer.Option(help="Fix the channel rate (default: measured).")] = None,
    device: Annotated[str | None, typer.Option(help="Shipped device profile name.")] = None,
    device_profile: Annotated[Path | None, typer.Option(help="Device profile JSON file.")] = None,
    preset: Annotated[str | None, typer.Option(help="latency-first, energy-first or qpart-paper.")] = None,
    deadline_s: Annotated[float | None, typer.Option(help="End-to-end deadline in seconds.")] = None,
    server: ServerOpt = None,
    cache_dir: CacheOpt = None,
    token: Annotated[str | None, typer.Option(help=_env_help("token"))] = None,
    audit: Annotated[bool | None, typer.Option("--audit/--no-audit", help=_env_help("audit"))] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
    runtime_name: Annotated[str, typer.Option(
        "--runtime", help="What runs the head: 'torch' (PyTorch and the model's code) or 'onnx' "
        "(ONNX Runtime and the server's ONNX segment; no torch needed).")] = "torch",
) -> None:
    """Plan, fetch the head segment, run the head, upload the quantized activation, print results."""
    import numpy as np
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    from qpart.client.errors import DeviceError, DeviceInputError
    from qpart.client.inputs import check_image_files
    from qpart.profiles.devices import load_device_profile

    if runtime_name not in ("torch", "onnx"):
        raise typer.BadParameter(f"--runtime must be torch or onnx, not {runtime_name!r}")
    if idx is None and not images:
        raise typer.BadParameter("give image files or --idx FILE")
    check_image_files([] if idx is not None else images or [])  # before any network use
    settings = _settings(server=server, cache_dir=cache_dir, token=token, audit=audit)
    profile = load_device_profile(device_profile) if device_profile else None
    runtime = _device_runtime(runtime_name)(settings, device=device, device_profile=profile)
    try:
        card = runtime.metadata(model)  # once: the preprocessing, then the class names
        x, y = _load_inputs(card, images or [], idx, labels, limit)
        if y is not None and card.labels and int(y.max(initial=0)) >= len(card.labels):
            raise DeviceInputError(f"{labels} holds class {int(y.max())}, and {model} has "
                                   f"{len(card.labels)} classes (0 to {len(card.labels) - 1})")
        with Progress(BarColumn(), DownloadColumn(), TransferSpeedColumn(), transient=True,
                      disable=as_json) as bar:
            task = bar.add_task("segment", total=None)
            options: dict[str, Any] = {
                "rate_bps": rate_mbps * 1e6 if rate_mbps else None, "preset": preset,
                "deadline_s": deadline_s,
                "progress": lambda done, total: bar.update(task, completed=done, total=total)}
            files = (images or [])[:limit] if limit else images or []
            if idx is None and len(files) == 1 and settings.offer_input_image:  # offer the image (ADR 0014)
                run = runtime.infer_file(files[0], x, model, demand, **options)
            else:
                run = runtime.infer(x, model, demand, **options)
        names = card.labels
    except DeviceError as exc:
        typer.echo(f"error: {terminal_text(str(exc))}", err=True)
        raise typer.Exit(2) from exc
    finally:
        runtime.close()
    accuracy = float(np.mean(np.array(run.predictions) == y)) if y is not None else None
    if as_json:
        typer.echo(json.dumps(_document(run, accuracy, names)))
        return
    _say(run, accuracy, names)


def _server_version(settings: DeviceSettings, model: str) -> str:
    """The newest version of ``model`` the server lists, asked through the device's Transport (its
    answer cap, deadline, retries, token and origin rules); a bad answer exits with one line."""
    from qpart.client.errors import DeviceError
    from qpart.client.transport import Transport

    transport = Transport(settings)
    try:
        answer = transport.request("GET", f"/v2/models/{urllib.parse.quote(model, safe='')}").json()
        version = answer["versions"][-1]
        if not isinstance(version, str | int) or isinstance(version, bool):
            raise TypeError(f"version {version!r} is not a string")
    except (DeviceError, KeyError, IndexError, TypeError, ValueError) as exc:
        typer.echo(f"error: cannot ask {settings.server} for the version of {model}; pass --version "
                   f"({terminal_text(str(exc))})", err=True)
        raise typer.Exit(2) from exc
    finally:
        transport.client.close()
    return str(version)


@device_app.command()
def profile(
    model: Annotated[str, typer.Option(help="Model whose heads to time.")],
    out: Annotated[Path, typer.Option(help="Device profile JSON to write.")],
    version: Annotated[str | None, typer.Option(help="Artifact version (default: ask the server).")] = None,
    base: Annotated[str, typer.Option(help="Shipped profile to start from.")] = "raspberry-pi-4",
    name: Annotated[str | None, typer.Option(help=(
        "Name of the written profile, as plan requests give it (default: --out's file name without "
        ".json, e.g. my-phone for my-phone.json)."))] = None,
    repeats: Annotated[int, typer.Option(help="Least timed rounds; each runs every cut once (after 2 "
                                               "warm-ups).")] = 5,
    seconds: Annotated[float, typer.Option(
        min=0.0, max=3600.0, help="Keep timing rounds until this long has passed, for each of heads, "
        "encodes and upload codings (deflate, zstd): a busy or throttling device's medians "
        "settle over seconds.")] = 2.0,
    server: ServerOpt = None,
) -> None:
    """Time every cut's head on this device and write a profile the server's planner accepts."""
    from qpart.client.profiler import profile_device
    from qpart.profiles.devices import get_device, save_device_profile

    if version is None:
        version = _server_version(_settings(server=server), model)
    name = name if name is not None else out.stem
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", name):
        raise typer.BadParameter(f"profile name {name!r}: use 1-64 letters, digits, '.', '_' or '-' "
                                 "(give --name or rename --out)")
    result = profile_device(get_device(base), model, str(version), name=name, repeats=repeats,
                            min_seconds=seconds)
    save_device_profile(result, out)
    times = result.measured[model].head_s
    shown = ", ".join(f"{t * 1e3:.2f}" for t in times)
    typer.echo(f"wrote {out} (profile {result.name}): {len(times)} cuts, head times {shown} ms")


@cache_app.command("list")
def cache_list(cache_dir: CacheOpt = None, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Segments in the cache, least recently used first."""
    from qpart.client.segment_cache import SegmentCache
    from qpart.client.transport import Transport

    settings = _settings(cache_dir=cache_dir)
    entries = SegmentCache(settings.cache_dir, settings.cache_max_bytes, Transport(settings)).entries()
    if as_json:
        typer.echo(json.dumps([e.__dict__ for e in entries]))
        return
    for e in entries:
        typer.echo(f"{e.segment_id}  {e.size_bytes:>10} B")
    typer.echo(f"{len(entries)} segments, {sum(e.size_bytes for e in entries)} bytes in {settings.cache_dir}")


@cache_app.command("prune")
def cache_prune(
    max_bytes: Annotated[int, typer.Option(help="Keep at most this many bytes (0 empties the cache).")],
    cache_dir: CacheOpt = None,
) -> None:
    """Delete least recently used segments until the cache fits ``--max-bytes``."""
    from qpart.client.segment_cache import SegmentCache
    from qpart.client.transport import Transport

    settings = _settings(cache_dir=cache_dir)
    removed = SegmentCache(settings.cache_dir, settings.cache_max_bytes, Transport(settings)).prune(
        max_bytes=max_bytes)
    typer.echo(f"removed {len(removed)} segments")
