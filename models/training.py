"""Seeded training of the reference models on the ``train`` split, writing weights and a card.

The test split is read once, after training, to record the accuracy on the card; no choice
made during training depends on it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn

from qpart.models.data import Split, describe_splits, load_split
from qpart.models.registry import ModelSpec, get_model


@dataclass(frozen=True)
class TrainingRecipe:
    """Hyper-parameters of one reference model's training run."""

    epochs: int
    batch_size: int = 128
    lr: float = 2e-3
    weight_decay: float = 5e-4
    seed: int = 0


RECIPES: dict[str, TrainingRecipe] = {
    "fmnist-cnn": TrainingRecipe(epochs=10),
    "fmnist-resnet": TrainingRecipe(epochs=15),
}


def _augment(batch: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random horizontal flip and a random shift of up to 2 pixels (zero padded)."""
    flip = torch.rand(batch.shape[0], generator=gen) < 0.5
    batch = torch.where(flip[:, None, None, None], batch.flip(3), batch)
    padded = nn.functional.pad(batch, (2, 2, 2, 2))
    dx, dy = (int(v) for v in torch.randint(0, 5, (2,), generator=gen))
    return padded[:, :, dy : dy + batch.shape[2], dx : dx + batch.shape[3]]


def evaluate(model: nn.Module, images: np.ndarray, labels: np.ndarray, batch: int = 1000) -> float:
    """Top-1 accuracy of ``model`` on the given images."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(labels), batch):
            x = torch.from_numpy(images[start : start + batch])
            pred = model(x).argmax(1).numpy()
            correct += int((pred == labels[start : start + batch]).sum())
    return correct / len(labels)


def train_model(
    name: str,
    out_dir: Path,
    *,
    threads: int = 2,
    progress: Callable[[int, int, float], None] | None = None,
) -> dict[str, object]:
    """Train a registered reference model from scratch and write ``NAME.safetensors`` + card.

    Args:
        name: a model with a recipe in :data:`RECIPES`.
        out_dir: folder for the weights and ``NAME.card.json``.
        threads: torch intra-op threads (fixed, so that runs are comparable).
        progress: called as ``progress(step, total_steps, loss)``.

    Returns:
        The model card written next to the weights.
    """
    spec: ModelSpec = get_model(name)
    recipe = RECIPES[name]
    torch.set_num_threads(threads)
    torch.manual_seed(recipe.seed)
    gen = torch.Generator().manual_seed(recipe.seed)
    model = spec.build()
    train = load_split(Split.TRAIN)
    x_all = torch.from_numpy(train.images)
    y_all = torch.from_numpy(train.labels)
    steps_per_epoch = (len(train) + recipe.batch_size - 1) // recipe.batch_size
    total = steps_per_epoch * recipe.epochs
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=recipe.lr, total_steps=total)
    loss_fn = nn.CrossEntropyLoss()
    started = time.perf_counter()
    step = 0
    for _epoch in range(recipe.epochs):
        model.train()
        order = torch.randperm(len(train), generator=gen)
        for start in range(0, len(train), recipe.batch_size):
            idx = order[start : start + recipe.batch_size]
            xb = _augment(x_all[idx], gen)
            loss = loss_fn(model(xb), y_all[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if progress is not None:
                progress(step, total, float(loss.detach()))
    train_s = time.perf_counter() - started
    test = load_split(Split.TEST)
    accuracy = evaluate(model, test.images, test.labels)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out_dir / f"{name}.safetensors"), metadata={"model": name})
    card: dict[str, object] = {
        "name": name,
        "factory": spec.factory,
        "input_shape": list(spec.input_shape),
        "params": sum(int(p.numel()) for p in model.parameters()),
        "test_accuracy": accuracy,
        "recipe": recipe.__dict__,
        "splits": describe_splits(),
        "threads": threads,
        "train_seconds": round(train_s, 1),
        "torch": torch.__version__,
        "command": f"qpart train --model {name}",
    }
    (out_dir / f"{name}.card.json").write_text(json.dumps(card, indent=2) + "\n")
    return card
