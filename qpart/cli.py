"""The ``qpart`` command: one entry point whose subcommands import their packages lazily.

Lazy imports keep ``qpart device`` usable on a device that installed only the ``client`` extra.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from qpart.cli_calibrate import calibrate, calibrate_images, measure_coding
from qpart.client.cli import VersionOpt, device_app
from qpart.errors import MODE, UsageError, run
from qpart.flags import env_help, settings_from
from qpart.server.settings import ServerSettings

if TYPE_CHECKING:
    from qpart.models.preprocess import PreprocessSpec
    from qpart.models.registry import ModelSpec

app = typer.Typer(
    help="QPART serving: plan, quantize and split inference between edge devices and a server.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
models_app = typer.Typer(help="List registered models (default) or register your own.")
app.add_typer(models_app, name="models")
app.add_typer(device_app, name="device")
app.command()(calibrate)
app.command("measure-coding")(measure_coding)
app.command("calibrate-images")(calibrate_images)


@app.callback()
def options(
    version: VersionOpt = False,
    debug: Annotated[bool, typer.Option(
        "--debug", envvar="QPART_DEBUG", help="On an error, print its traceback too.")] = False,
) -> None:
    """QPART serving: plan, quantize and split inference between edge devices and a server."""
    MODE.debug = debug


@app.command()
def train(
    model: Annotated[str, typer.Option(
        help="Reference model to train (fmnist-cnn, fmnist-resnet, fmnist-mobilenet).")],
    out: Annotated[Path | None, typer.Option(help="Output folder; default: the model zoo.")] = None,
    threads: Annotated[int, typer.Option(help="torch threads (fixed for reproducibility).")] = 2,
    image_folder: Annotated[Path | None, typer.Option(help=(
        "Where fmnist-mobilenet's splits are exported as PNGs and read back (default "
        "~/.cache/qpart/fashion-mnist-png)."))] = None,
    limit: Annotated[int | None, typer.Option(help="Only the first N samples of each split.")] = None,
    epochs: Annotated[int | None, typer.Option(help="In place of the recipe's epochs (timing).")] = None,
) -> None:
    """Train a reference model from scratch with its fixed seed; writes safetensors + card."""
    from rich.progress import BarColumn, TextColumn, TimeRemainingColumn

    from qpart.models.registry import ZOO_DIR
    from qpart.models.training import DEFAULT_IMAGE_FOLDER, train_model
    from qpart.progress import progress_bars

    with progress_bars(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[loss]}"),
        TimeRemainingColumn(),
    ) as bar:
        task = bar.add_task(f"training {model}", total=None, loss="")

        def report(step: int, total: int, loss: float) -> None:
            bar.update(task, completed=step, total=total, loss=f"loss {loss:.3f}")

        card = train_model(model, out or ZOO_DIR, threads=threads, progress=report,
                           image_folder=image_folder or DEFAULT_IMAGE_FOLDER, limit=limit, epochs=epochs)
    typer.echo(f"{model}: test accuracy {card['test_accuracy']:.4f} "
               f"({card['train_seconds']} s); wrote {(out or ZOO_DIR)}")


@models_app.callback(invoke_without_command=True)
def models_list(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    artifacts: Annotated[Path, typer.Option(help=(
        "Folder of calibration artifacts, one sub-folder per model as qpart serve reads it: each "
        "model's levels kept lossless (too few check samples to certify them) are shown."))
    ] = Path("artifacts"),
    version: VersionOpt = False,
) -> None:
    """List registered models: test accuracy, number of legal cuts and parameters, and the levels
    its artifact keeps lossless-only (float32, untested: calibrate --uncertified lossless).
    Your own models' factories are not imported: their counts are those registration recorded."""
    if ctx.invoked_subcommand is not None:
        return
    from qpart.models.registry import list_models
    from qpart.offline.sizing import percent

    rows = []
    for spec in list_models():
        facts = _artifact_facts(artifacts / spec.name)
        rows.append({
            "name": spec.name,
            "test_accuracy": spec.card.get("test_accuracy"),
            "trained": spec.weights.is_file(),
            "input_shape": list(spec.input_shape),
            **_model_sizes(spec, facts.pop("artifact_cuts")),
            **facts,
        })
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        row.update({k: "?" for k in ("cuts", "params") if row[k] is None})  # an entry from before counts
        accuracy = row["test_accuracy"] if row["trained"] else "untrained"
        if accuracy is None and row["calibration_test_accuracy"] is not None:  # a user's model
            accuracy = f"{row['calibration_test_accuracy']:.4f} (calibration's test split)"
        kept = row["lossless_only_levels"]
        shown = ",".join(percent(a) for a in kept) if isinstance(kept, list) else ""
        note = f"  levels in {row['metric']}" if row["metric"] else ""
        note += f"  lossless-only={shown}" if shown else ""
        calibrated = row["calibrated_cuts"]
        if isinstance(calibrated, list):
            shown = "all" if len(calibrated) == row["cuts"] else ",".join(map(str, calibrated))
            note += f"  calibrated cuts: {shown}"
        runtimes = row["runtimes"]
        if isinstance(runtimes, dict):
            note += "  runtimes: " + ", ".join(f"{name} {len(r['cuts'])}/{row['cuts']}"
                                               for name, r in runtimes.items())
        typer.echo(f"{row['name']:<20} acc={accuracy}  cuts={row['cuts']}  params={row['params']}{note}")


def _model_sizes(spec: ModelSpec, artifact_cuts: object) -> dict[str, object]:
    """A listed model's legal cuts and parameters. A built-in model is built (its code is ours); a
    registered one is never imported by a listing (its factory runs when it is built to calibrate or
    serve): its card's counts, which registration records, else its artifact's cuts (None: neither)."""
    from qpart.models.partition import legal_cuts
    from qpart.models.registry import is_builtin

    if not is_builtin(spec.name):
        return {"cuts": spec.card.get("legal_cuts", artifact_cuts), "params": spec.card.get("params")}
    model = spec.load() if spec.weights.is_file() else spec.build().eval()
    return {"cuts": len(legal_cuts(model, spec.input_shape)),
            "params": sum(int(p.numel()) for p in model.parameters())}


def _artifact_facts(folder: Path) -> dict[str, object]:
    """What the artifact in ``folder`` says of its model (None each: no artifact there): the float
    model's top-1 on the calibration's test split, what its levels bound (``metric``), the levels it
    keeps lossless, per device runtime
    the cuts calibration found it runs and why not the others (``cuts[i].runtimes_refused``), and
    its number of cuts (``artifact_cuts``) and those it calibrated (``calibrated_cuts``, ADR 0025)."""
    from qpart.profiles.artifacts import ARTIFACT_FILE, load_artifact

    if not (folder / ARTIFACT_FILE).is_file():
        return {"metric": None, "lossless_only_levels": None, "runtimes": None, "calibrated_cuts": None,
                "calibration_test_accuracy": None, "artifact_cuts": None}
    artifact = load_artifact(folder)
    return {"metric": artifact.metric, "lossless_only_levels": artifact.lossless_levels,
            "runtimes": artifact.runtime_table(), "calibrated_cuts": artifact.calibrated_cuts,
            "calibration_test_accuracy": artifact.fp32_test_accuracy, "artifact_cuts": len(artifact.cuts)}


@models_app.command("register")
def models_register(
    name: Annotated[str, typer.Option(help="Name to serve the model under (a-z, 0-9, . _ -).")],
    factory: Annotated[str, typer.Option(help="Importable factory, package.module:function.")],
    weights: Annotated[Path, typer.Option(help="safetensors file of the model's state_dict.")],
    input_shape: Annotated[str | None, typer.Option(help=(
        "Input shape without batch, C,H,W, e.g. 1,28,28; default: the preprocessing's output."))] = None,
    registry: Annotated[Path | None, typer.Option(
        help="Registry file to write; default $QPART_MODEL_REGISTRY.")] = None,
    preprocess_file: Annotated[Path | None, typer.Option(help=(
        "JSON file (a model card) whose 'preprocess' object and 'labels' list declare the model's "
        "input and class names; or give the flags below."))] = None,
    color: Annotated[str | None, typer.Option(
        help="Preprocessing color mode: L or RGB; --color, --mean and --std go together.")] = None,
    resize: Annotated[str | None, typer.Option(help="Resize: N (shorter side) or H,W (exactly).")] = None,
    center_crop: Annotated[str | None, typer.Option(help="Center crop H,W after the resize.")] = None,
    scale: Annotated[float | None, typer.Option(help="Factor on 0-255 pixels (default 1/255).")] = None,
    mean: Annotated[str | None, typer.Option(
        help="Per-channel mean, comma-separated (0 for none).")] = None,
    std: Annotated[str | None, typer.Option(
        help="Per-channel std, comma-separated (1 for none).")] = None,
    labels: Annotated[str | None, typer.Option(help="Class names in logit order, comma-separated.")] = None,
) -> None:
    """Register your own model with its preprocessing and labels: it must load from safetensors,
    run on one preprocessed sample, give one logit per label and trace with torch.fx."""
    from qpart.models.errors import LabelsError, PreprocessError
    from qpart.models.partition import legal_cuts
    from qpart.models.registry import register_model, registry_path
    from qpart.models.runtimes import refusals_by_cut

    target = registry or registry_path()
    if target is None:
        raise UsageError("give --registry FILE or set QPART_MODEL_REGISTRY")
    flags = {"color": color, "resize": resize, "center_crop": center_crop, "scale": scale, "mean": mean,
             "std": std}
    try:
        spec, names = declared_input(preprocess_file, flags, labels)
        shape = _register_shape(input_shape, spec)
        registered = register_model(name, factory, weights, shape, target, preprocess=spec, labels=names)
    except (PreprocessError, LabelsError) as exc:  # a declaration the user gave that does not fit
        raise UsageError(str(exc)) from exc
    cuts = legal_cuts(registered.load(), shape)
    declared = (f"; input {list(shape)} from {spec.color} images" if spec is not None else
                "; no preprocessing declared (calibrate it on fashion-mnist or arrays)")
    declared += f", {len(names)} labels" if names is not None else ""
    typer.echo(f"registered {name} in {target}: {len(cuts)} legal cuts{declared}")
    _warn_runtimes(refusals_by_cut(registered.load(), shape), len(cuts))


def _warn_runtimes(table: dict[str, dict[int, str]], cuts: int) -> None:
    """Per device runtime: how many cuts it can run, and each distinct reason it cannot (up to
    five, with the cuts each keeps off that runtime)."""
    from qpart.models.runtimes import distinct_refusals

    for runtime, refused in table.items():
        if not refused:
            typer.echo(f"  {runtime} devices: every cut")
            continue
        typer.echo(f"  warning: {runtime} devices: {cuts - len(refused)} of {cuts} cuts (cut 0 always); "
                   f"{len(refused)} refused:", err=True)
        reasons, more = distinct_refusals(refused)
        for reason, at in reasons:
            shown = ", ".join(map(str, at[:8])) + (", ..." if len(at) > 8 else "")
            typer.echo(f"    {len(at)} {'cut' if len(at) == 1 else 'cuts'} ({shown}): {reason}", err=True)
        if more:
            typer.echo(f"    and {more} more {'reason' if more == 1 else 'reasons'} (after calibration, "
                       "artifact.json lists every cut's: cuts[i].runtimes_refused)", err=True)


def _register_shape(text: str | None, spec: PreprocessSpec | None) -> tuple[int, ...]:
    if text is not None:
        return parse_shape(text)
    if spec is None or spec.output_shape is None:
        raise UsageError("give --input-shape C,H,W (or preprocessing with a center crop or an H,W resize)")
    return tuple(int(d) for d in spec.output_shape)


def declared_input(file: Path | None, flags: dict[str, Any],
                   labels: str | None) -> tuple[PreprocessSpec | None, tuple[str, ...] | None]:
    """The preprocessing spec (or None) and labels of ``qpart models register``: from a card file,
    or from the flags; never both."""
    from qpart.models.preprocess import PreprocessSpec
    from qpart.models.registry import check_labels

    given = {k: v for k, v in flags.items() if v is not None}
    if file is not None:
        if given or labels is not None:
            raise UsageError("give --preprocess-file or the preprocessing and label flags, not both")
        try:
            card = json.loads(file.read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"--preprocess-file {file}: not a readable JSON file ({exc})") from exc
        if not isinstance(card, dict) or not isinstance(card.get("preprocess"), dict):
            raise UsageError(f"--preprocess-file {file}: needs a 'preprocess' object, e.g. "
                             '{"preprocess": {"color": "RGB", "resize": [64, 64], "mean": [0.5, 0.5, 0.5], '
                             '"std": [0.25, 0.25, 0.25]}, "labels": ["cat", "dog"]}')
        raw_labels = card.get("labels")
        return (PreprocessSpec.from_mapping(card["preprocess"]),
                None if raw_labels is None else check_labels(raw_labels, f"labels in {file}"))
    names = None if labels is None else check_labels([n.strip() for n in labels.split(",")], "--labels")
    if not given:
        return None, names
    missing = [f"--{k.replace('_', '-')}" for k in ("color", "mean", "std") if k not in given]
    if missing:
        raise UsageError(f"preprocessing flags need {', '.join(missing)} too (or give --preprocess-file)")
    raw: dict[str, Any] = {"color": given["color"], "mean": _numbers(given["mean"], "--mean"),
                           "std": _numbers(given["std"], "--std")}
    if "resize" in given:
        sizes = _numbers(given["resize"], "--resize")
        raw["resize"] = int(sizes[0]) if len(sizes) == 1 else [int(v) for v in sizes]
    if "center_crop" in given:
        raw["center_crop"] = [int(v) for v in _numbers(given["center_crop"], "--center-crop")]
    if "scale" in given:
        raw["scale"] = given["scale"]
    return PreprocessSpec.from_mapping(raw), names


def _numbers(text: str, flag: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise UsageError(f"{flag} {text!r}: give numbers separated by commas, e.g. 0.5,0.5,0.5") from None


def parse_shape(text: str) -> tuple[int, ...]:
    """``--input-shape``: positive sizes separated by commas."""
    sizes = text.split(",")
    if not all(s.strip().isdigit() and int(s) > 0 for s in sizes):
        raise UsageError(f"--input-shape {text!r}: the form is C,H,W (positive sizes without the batch, "
                         "separated by commas), e.g. 1,28,28")
    return tuple(int(s) for s in sizes)


@app.command()
def serve(
    artifacts: Annotated[Path | None, typer.Option(help=env_help(ServerSettings, "artifacts"))] = None,
    host: Annotated[str | None, typer.Option(help=env_help(ServerSettings, "host"))] = None,
    port: Annotated[int | None, typer.Option(help=env_help(ServerSettings, "port"))] = None,
) -> None:
    """Serve plans, head segments and tail inference over HTTP (uvicorn). Other settings: QPART_*."""
    settings = settings_from(ServerSettings, {"artifacts": artifacts, "host": host, "port": port})
    check_artifacts(settings.artifacts)
    from qpart.server.api.main import serve as run_server

    run_server(settings)


SERVE_FIX = "pass --artifacts or set QPART_ARTIFACTS to a folder of `qpart calibrate` outputs"


def check_artifacts(folder: Path, fix: str = SERVE_FIX) -> None:
    """Refuse to serve a folder the catalog would find no artifact in (it scans ``**/artifact.json``)."""
    from qpart.profiles.artifacts import ARTIFACT_FILE

    if not folder.is_dir():
        raise UsageError(f"artifacts folder {folder} does not exist; {fix}")
    if next(folder.glob(f"**/{ARTIFACT_FILE}"), None) is None:
        raise UsageError(f"artifacts folder {folder} holds no {ARTIFACT_FILE}; {fix}")


@app.command()
def demo(
    artifacts: Annotated[Path, typer.Option(help="Calibration artifacts to serve.")] = Path("artifacts"),
    images: Annotated[int, typer.Option(help="Test images per row.")] = 200,
    demand: Annotated[float, typer.Option(help="Accuracy demand (max top-1 drop).")] = 0.01,
    port: Annotated[int, typer.Option(help="Loopback port for the demo server.")] = 8765,
) -> None:
    """Serve --artifacts, run three device profiles at three rates on each model, print a table."""
    check_artifacts(artifacts, "pass --artifacts, or run `make artifacts` to calibrate the reference models")
    from qpart.demo import run_demo

    run_demo(artifacts, images=images, demand=demand, port=port)


def main() -> None:
    """Console-script entry point: errors a person can act on print one line (qpart.errors)."""
    run(app)
