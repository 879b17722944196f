"""Seeded training of the reference models on the ``train`` split, writing weights and a card.

The 28×28 models read the IDX tensors; ``fmnist-mobilenet`` reads the same split *through the
ImageFolder path*: the split exported to PNGs once (:func:`models.sources.export_image_folder`),
then decoded and preprocessed by its card's spec a shuffled batch at a time. The test split is read
once, after training, to record the accuracy on the card; no choice made during training depends
on it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn

from qpart.models.data import Split, describe_splits, load_split, split_indices
from qpart.models.errors import DatasetError, PreprocessError
from qpart.models.metrics import get_metric, hits_of
from qpart.models.registry import ModelSpec, get_model
from qpart.models.sources import DataSource, ImageFolderSource, export_image_folder

DEFAULT_IMAGE_FOLDER = Path.home() / ".cache" / "qpart" / "fashion-mnist-png"
"""Where the Fashion-MNIST splits are exported as PNGs for the models trained through an ImageFolder
(``qpart train --image-folder`` chooses another folder)."""


@dataclass(frozen=True)
class TrainingRecipe:
    """Hyper-parameters of one reference model's training run."""

    epochs: int
    batch_size: int = 128
    lr: float = 2e-3
    weight_decay: float = 5e-4
    seed: int = 0
    data: Literal["idx", "image-folder"] = "idx"
    """``idx``: the IDX tensors in memory. ``image-folder``: the split's PNG export, decoded and
    preprocessed by the card's spec a batch at a time."""
    channels_last: bool = False
    """Train in torch's channels-last memory format (the same values, another summation order):
    depthwise convolutions on CPU ran about 3× faster in it, measured on fmnist-mobilenet."""


RECIPES: dict[str, TrainingRecipe] = {
    "fmnist-cnn": TrainingRecipe(epochs=10),
    "fmnist-resnet": TrainingRecipe(epochs=15),
    "fmnist-mobilenet": TrainingRecipe(epochs=12, batch_size=128, lr=4e-3, weight_decay=4e-5,
                                       data="image-folder", channels_last=True),
}


class _Samples:
    """The training or test samples of one recipe: in memory (IDX) or an ImageFolder streamed."""

    def __init__(self, spec: ModelSpec, recipe: TrainingRecipe, split: Split, folder: Path,
                 limit: int | None) -> None:
        self.source: DataSource | None = None
        self.tensors: tuple[torch.Tensor, torch.Tensor] | None = None
        if recipe.data == "idx":
            data = load_split(split, limit)
            self.tensors = (torch.from_numpy(data.images), torch.from_numpy(data.labels))
            self.count = len(data)
            return
        preprocess = spec.preprocess
        if preprocess is None:
            raise PreprocessError(f"'{spec.name}' trains through an ImageFolder but its card declares no "
                                  f"preprocess")
        root = exported_split(split, folder / str(split), limit)
        self.source = ImageFolderSource(root, preprocess)
        self.count = len(self.source)

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples at positions ``idx``."""
        if self.tensors is not None:
            return self.tensors[0][idx], self.tensors[1][idx]
        assert self.source is not None, "a recipe reads tensors or a source"
        chosen = np.sort(idx.numpy())
        images, labels = next(self.source.select(chosen).batches(len(chosen)))
        return torch.from_numpy(images), torch.from_numpy(labels)

    def all(self, batch_size: int = 1000) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Every sample in order, ``batch_size`` at a time."""
        if self.tensors is not None:
            for start in range(0, self.count, batch_size):
                yield (self.tensors[0][start:start + batch_size].numpy(),
                       self.tensors[1][start:start + batch_size].numpy())
            return
        assert self.source is not None, "a recipe reads tensors or a source"
        yield from self.source.batches(batch_size)


def exported_split(split: Split, root: Path, limit: int | None = None) -> Path:
    """``root``, holding the PNG export of ``split`` (its first ``limit`` samples); exported on
    first use, and refused if a folder already there holds another number of images.

    Raises:
        DatasetError: ``root`` holds an export of another size (remove it to export again).
    """
    expected = len(split_indices(split)) if limit is None else min(limit, len(split_indices(split)))
    if not root.exists() or not any(root.iterdir()):
        export_image_folder(split, root, limit=limit)
    held = sum(1 for f in root.glob("*/*.png"))
    if held != expected:
        raise DatasetError(f"{root} holds {held} images but the {split} split exports {expected}; remove the "
                           f"folder to export it again, or give --image-folder another folder")
    return root


def _augment(batch: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random horizontal flip and a random shift of up to 2 pixels (zero padded)."""
    flip = torch.rand(batch.shape[0], generator=gen) < 0.5
    batch = torch.where(flip[:, None, None, None], batch.flip(3), batch)
    padded = nn.functional.pad(batch, (2, 2, 2, 2))
    dx, dy = (int(v) for v in torch.randint(0, 5, (2,), generator=gen))
    return padded[:, :, dy : dy + batch.shape[2], dx : dx + batch.shape[3]]


TOP1 = get_metric("top1-drop")
"""Training reports top-1 accuracy against the labels."""


def evaluate(model: nn.Module, images: np.ndarray, labels: np.ndarray, batch: int = 1000) -> float:
    """Top-1 accuracy of ``model`` on the given images."""
    return evaluate_batches(model, ((images[s:s + batch], labels[s:s + batch])
                                    for s in range(0, len(labels), batch)))


def evaluate_batches(model: nn.Module, batches: Iterator[tuple[np.ndarray, np.ndarray]]) -> float:
    """Top-1 accuracy of ``model`` over streamed (float32 images, int64 labels) batches."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in batches:
            correct += int(hits_of(TOP1, model(torch.from_numpy(images)), labels).sum())
            total += len(labels)
    return correct / total


def train_model(
    name: str,
    out_dir: Path,
    *,
    threads: int = 2,
    progress: Callable[[int, int, float], None] | None = None,
    image_folder: Path = DEFAULT_IMAGE_FOLDER,
    limit: int | None = None,
    epochs: int | None = None,
) -> dict[str, object]:
    """Train a registered reference model from scratch and write ``NAME.safetensors`` + card.

    Args:
        name: a model with a recipe in :data:`RECIPES`.
        out_dir: folder for the weights and ``NAME.card.json``.
        threads: torch intra-op threads (fixed, so that runs are comparable).
        progress: called as ``progress(step, total_steps, loss)``.
        image_folder: where an ``image-folder`` recipe's splits are exported (``<folder>/train``,
            ``<folder>/test``) on first use.
        limit: train and test on the first ``limit`` samples of each split only (a timing or smoke
            run; the card says so).
        epochs: in place of the recipe's (a timing or smoke run).

    Returns:
        The model card written next to the weights.
    """
    spec: ModelSpec = get_model(name)
    if name not in RECIPES:
        raise DatasetError(f"'{name}' has no training recipe; train it yourself and register it "
                           f"(qpart models register)")
    recipe = RECIPES[name]
    epoch_count = recipe.epochs if epochs is None else epochs
    torch.set_num_threads(threads)
    torch.manual_seed(recipe.seed)
    gen = torch.Generator().manual_seed(recipe.seed)
    model = spec.build()
    memory_format = torch.channels_last if recipe.channels_last else torch.contiguous_format
    model = model.to(memory_format=memory_format)  # type: ignore[call-overload]  # torch's stubs omit it
    train = _Samples(spec, recipe, Split.TRAIN, image_folder, limit)
    steps_per_epoch = (train.count + recipe.batch_size - 1) // recipe.batch_size
    total = steps_per_epoch * epoch_count
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=recipe.lr, total_steps=total)
    loss_fn = nn.CrossEntropyLoss()
    started = time.perf_counter()
    step = 0
    for _epoch in range(epoch_count):
        model.train()
        order = torch.randperm(train.count, generator=gen)
        for start in range(0, train.count, recipe.batch_size):
            xb, yb = train.batch(order[start : start + recipe.batch_size])
            loss = loss_fn(model(_augment(xb, gen).contiguous(memory_format=memory_format)), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if progress is not None:
                progress(step, total, float(loss.detach()))
    train_s = time.perf_counter() - started
    accuracy = evaluate_batches(model, _Samples(spec, recipe, Split.TEST, image_folder, limit).all())
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out_dir / f"{name}.safetensors"), metadata={"model": name})
    card: dict[str, object] = {
        "name": name,
        "factory": spec.factory,
        "input_shape": list(spec.input_shape),
        "preprocess": spec.card.get("preprocess"),
        "labels": spec.card.get("labels"),
        "params": sum(int(p.numel()) for p in model.parameters()),
        "test_accuracy": accuracy,
        "recipe": {**recipe.__dict__, "epochs": epoch_count},
        "splits": describe_splits(),
        "data": recipe.data if recipe.data == "idx" else f"image-folder export of the splits: {image_folder}",
        "limit": limit,
        "threads": threads,
        "train_seconds": round(train_s, 1),
        "torch": torch.__version__,
        "command": f"qpart train --model {name}",
    }
    (out_dir / f"{name}.card.json").write_text(json.dumps(card, indent=2) + "\n")
    return card
