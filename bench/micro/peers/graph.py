"""The graph every server of ``bench.micro.peer`` runs: what ``qpart serve`` runs for
``/v2/models/{m}/infer`` (``server/store/catalog.py``, ``server/engine.py``): the registered model
traced and batch-norm-folded by ``models.partition.prepare``, the tail of cut 0, its 4-D weights in
channels-last memory format, one torch thread, under ``torch.inference_mode``.

Imported inside each peer's own virtualenv (torch, numpy, safetensors and Pillow; nothing else of
this project's dependencies), with the repository on ``sys.path``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from qpart.models.partition import cuts_of, prepare, split
from qpart.models.registry import get_model

TORCH_THREADS = 1


@dataclass(frozen=True)
class ServedGraph:
    """The cut-0 tail of a registered model as ``qpart serve`` runs it."""

    tail: nn.Module
    input_shape: tuple[int, ...]
    four_d: bool

    @classmethod
    def load(cls, name: str, weights: Path | None = None) -> ServedGraph:
        """``name`` from the registry, with ``weights`` in place of the registry's when given."""
        torch.set_num_threads(TORCH_THREADS)
        spec = get_model(name)
        if weights is not None:
            spec = replace(spec, weights=weights)
        gm = prepare(spec.load(), spec.input_shape)
        cut = cuts_of(gm)[0]
        tail = split(gm, cut)[1].eval()
        four_d = len(cut.shape) == 3
        for param in tail.parameters():
            param.requires_grad_(False)
            if four_d and param.dim() == 4:
                param.data = param.data.contiguous(memory_format=torch.channels_last)
        return cls(tail, tuple(spec.input_shape), four_d)

    def logits(self, batch: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Logits of a float32 batch ``[n, *input_shape]``."""
        t = torch.from_numpy(np.ascontiguousarray(batch, dtype=np.float32))
        if self.four_d:
            t = t.contiguous(memory_format=torch.channels_last)
        with torch.inference_mode():
            out: npt.NDArray[np.float32] = self.tail(t).numpy()
        return out


def model_parser(prog: str, doc: str | None, port: int) -> argparse.ArgumentParser:
    """The command line every peer's model file takes: ``--name``, ``--port``, ``--weights``."""
    parser = argparse.ArgumentParser(prog=prog, description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", default="fmnist-cnn", help="registered model (models.registry)")
    parser.add_argument("--port", type=int, default=port, help="HTTP port on 127.0.0.1")
    parser.add_argument("--weights", type=Path, help="safetensors file (default: the registry's)")
    return parser
