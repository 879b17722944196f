"""The ``qpart`` command: one entry point whose subcommands import their packages lazily.

Lazy imports keep ``qpart device`` usable on a device that installed only the ``client`` extra.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="QPART serving: plan, quantize and split inference between edge devices and a server.",
    no_args_is_help=True,
    add_completion=False,
)
models_app = typer.Typer(help="List registered models (default) or register your own.")
app.add_typer(models_app, name="models")


@app.command()
def train(
    model: Annotated[str, typer.Option(help="Reference model to train (fmnist-cnn, fmnist-resnet).")],
    out: Annotated[Path | None, typer.Option(help="Output folder; default: the model zoo.")] = None,
    threads: Annotated[int, typer.Option(help="torch threads (fixed for reproducibility).")] = 2,
) -> None:
    """Train a reference model from scratch with its fixed seed; writes safetensors + card."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from models.registry import ZOO_DIR
    from models.training import train_model

    with Progress(
        TextColumn(f"training {model}"), BarColumn(), TextColumn("{task.fields[loss]}"),
        TimeRemainingColumn(),
    ) as bar:
        task = bar.add_task("train", total=None, loss="")

        def report(step: int, total: int, loss: float) -> None:
            bar.update(task, completed=step, total=total, loss=f"loss {loss:.3f}")

        card = train_model(model, out or ZOO_DIR, threads=threads, progress=report)
    typer.echo(f"{model}: test accuracy {card['test_accuracy']:.4f} "
               f"({card['train_seconds']} s); wrote {(out or ZOO_DIR)}")


@models_app.callback(invoke_without_command=True)
def models_list(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List registered models: test accuracy, number of legal cuts and parameters."""
    if ctx.invoked_subcommand is not None:
        return
    from models.partition import legal_cuts
    from models.registry import list_models

    rows = []
    for spec in list_models():
        model = spec.load() if spec.weights.is_file() else spec.build().eval()
        rows.append({
            "name": spec.name,
            "test_accuracy": spec.card.get("test_accuracy"),
            "cuts": len(legal_cuts(model, spec.input_shape)),
            "params": sum(int(p.numel()) for p in model.parameters()),
        })
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        typer.echo(f"{row['name']:<20} acc={row['test_accuracy']}  cuts={row['cuts']}  "
                   f"params={row['params']}")


@models_app.command("register")
def models_register(
    name: Annotated[str, typer.Option(help="Name to serve the model under (a-z, 0-9, . _ -).")],
    factory: Annotated[str, typer.Option(help="Importable factory, package.module:function.")],
    weights: Annotated[Path, typer.Option(help="safetensors file of the model's state_dict.")],
    input_shape: Annotated[str, typer.Option(help="Input shape without batch, e.g. 1,28,28.")],
    registry: Annotated[Path | None, typer.Option(
        help="Registry file to write; default $QPART_MODEL_REGISTRY.")] = None,
) -> None:
    """Register your own model; it must load from safetensors and trace with torch.fx."""
    from models.partition import legal_cuts
    from models.registry import register_model, registry_path

    target = registry or registry_path()
    if target is None:
        raise typer.BadParameter("give --registry or set QPART_MODEL_REGISTRY")
    shape = tuple(int(d) for d in input_shape.split(","))
    spec = register_model(name, factory, weights, shape, target)
    cuts = legal_cuts(spec.load(), shape)
    typer.echo(f"registered {name} in {target}: {len(cuts)} legal cuts")


def main() -> None:
    """Console-script entry point."""
    app()
