"""Runs a prepared model with a bit pattern applied for real (the kernels' quantize→dequantize).

Weights are fake-quantized in place per output channel and restored afterwards; the activation
at the cut is quantized per sample with the cut's group size, exactly as the device does.

On ``device="cuda"`` the model runs on the GPU; the quantizers are the numpy kernels, so each
quantized tensor makes a round trip through host memory, and every output comes back to the CPU.
(No GPU is at hand where this is developed: that path is kept this small on purpose.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import fx, nn

from qpart.kernels import QuantScheme, activation_group, fake_quantize, weight_group_size
from qpart.models.partition import Cut, cut_flops, cuts_of, prepare, split
from qpart.models.runtimes import runtime_refusals
from qpart.models.timing import median_latency
from qpart.offline.errors import CalibrationConfigError
from qpart.profiles.artifacts import FLOAT_BITS, CutProfile


@dataclass(frozen=True)
class TensorInfo:
    """A quantizable weight: its parameter name, shape and the op index that uses it."""

    name: str
    shape: tuple[int, ...]
    op_index: int

    @property
    def params(self) -> int:
        """Number of elements."""
        return int(np.prod(self.shape))


def _channels_last(gm: fx.GraphModule) -> fx.GraphModule:
    """Convolution weights in channels-last order: the same results up to float rounding, and
    1.3-1.7x faster on the CPU (oneDNN), which every pattern evaluation of the job pays."""
    for param in gm.parameters():
        if param.dim() == 4:
            param.data = param.data.contiguous(memory_format=torch.channels_last)
    return gm


def float_graph(model: nn.Module, input_shape: tuple[int, ...]) -> fx.GraphModule:
    """The float model as the job runs it (traced, batch norm folded, convolution weights
    channels-last), on the CPU: what every count's reference is computed with, and 1.5x faster
    than the module as written (fmnist-cnn, one thread, the input-image ladder)."""
    return _channels_last(prepare(model, input_shape))


class ModelRunner:
    """A traced model (batch norm folded) with its cuts, heads and tails."""

    def __init__(self, model: nn.Module, input_shape: tuple[int, ...], *, batch_size: int = 500,
                 largest_group: int = 256, device: str = "cpu") -> None:
        if device == "cuda" and not torch.cuda.is_available():
            raise CalibrationConfigError(
                f"device cuda: this torch ({torch.__version__}) sees no CUDA GPU; install a CUDA build "
                "of torch on a machine with one, or use the default device cpu")
        self.device = torch.device(device)
        self.gm: fx.GraphModule = float_graph(model, input_shape).to(self.device)
        self.cuts: list[Cut] = cuts_of(self.gm)
        self.parts = [split(self.gm, c) for c in self.cuts]
        self.batch_size = batch_size
        self.flops = cut_flops(self.gm)
        self.groups = [activation_group(c.numel, largest_group) for c in self.cuts]
        self.tensors = self._quantizable()

    def _quantizable(self) -> list[TensorInfo]:
        ops = [n for n in self.gm.graph.nodes if n.op.startswith("call")]
        found = []
        for k, node in enumerate(ops):
            if node.op != "call_module":
                continue
            mod = self.gm.get_submodule(str(node.target))
            if isinstance(mod, nn.Conv2d | nn.Linear):
                found.append(TensorInfo(f"{node.target}.weight", tuple(mod.weight.shape), k))
        return found

    def head_tensors(self, cut: int) -> list[TensorInfo]:
        """Quantizable tensors in the head of cut ``cut``."""
        pos = self.cuts[cut].position
        return [t for t in self.tensors if t.op_index <= pos]

    def float_params(self, cut: int) -> int:
        """Parameters of the head that are never quantized (biases)."""
        head = self.parts[cut][0]
        quant = {t.name for t in self.head_tensors(cut)}
        return sum(int(p.numel()) for n, p in head.named_parameters() if n not in quant)

    def start_cut(self, tensor: TensorInfo) -> int:
        """The last cut before ``tensor``'s op: its cached activation can feed the rest."""
        return max(c.index for c in self.cuts if c.position < tensor.op_index)

    def head_flops(self, cut: int) -> int:
        """FLOPs of the head of ``cut`` for one sample."""
        return int(sum(self.flops[: self.cuts[cut].position + 1]))

    @contextmanager
    def quantized_weights(self, bits: Mapping[str, int]) -> Iterator[None]:
        """Replace the named weights by their fake-quantized values; restore on exit."""
        saved: dict[str, torch.Tensor] = {}
        try:
            for name, b in bits.items():
                if b >= FLOAT_BITS:
                    continue
                param = self.gm.get_parameter(name)
                saved[name] = param.detach().clone()
                scheme = QuantScheme(b, weight_group_size(tuple(param.shape)))
                quantized = fake_quantize(param.detach().cpu().numpy(), scheme)
                param.data.copy_(torch.from_numpy(quantized).to(param.device))
            yield
        finally:
            for name, value in saved.items():
                self.gm.get_parameter(name).data.copy_(value)

    def quantize_activation(self, act: torch.Tensor, cut: int, bits: int) -> torch.Tensor:
        """Quantize→dequantize an activation batch at ``cut`` (per sample groups)."""
        if bits >= FLOAT_BITS:
            return act
        scheme = QuantScheme(bits, self.groups[cut])
        return torch.from_numpy(fake_quantize(act.detach().cpu().numpy(), scheme)).to(act.device)

    @torch.no_grad()
    def head_outputs(self, images: np.ndarray, cut: int) -> torch.Tensor:
        """Activation at ``cut`` for every image (float32, unquantized weights unless patched)."""
        head = self.parts[cut][0]
        outs = [head(torch.from_numpy(images[i : i + self.batch_size]).to(self.device)).cpu()
                for i in range(0, len(images), self.batch_size)]
        return torch.cat(outs)

    @torch.no_grad()
    def tail_outputs(self, acts: torch.Tensor, cut: int, act_bits: int = FLOAT_BITS) -> torch.Tensor:
        """Logits from activations at ``cut``, quantizing them with ``act_bits`` first."""
        tail = self.parts[cut][1]
        outs = []
        for i in range(0, len(acts), self.batch_size):
            batch = acts[i : i + self.batch_size].to(self.device)
            outs.append(tail(self.quantize_activation(batch, cut, act_bits)).cpu())
        return torch.cat(outs)

    def run_pattern(self, images: np.ndarray, cut: int, weight_bits: Mapping[str, int],
                    act_bits: int, tick: Callable[[int], None] | None = None) -> torch.Tensor:
        """Logits of the split model with a pattern applied (what device + server compute)."""
        head, tail = self.parts[cut]
        outs = []
        # One batch at a time through head, activation quantizer and tail: the same batches as
        # head_outputs then tail_outputs (so the same logits, bit for bit), without holding every
        # sample's activation at the cut (6.4 GB for 4,000 samples of a 32x112x112 activation).
        with self.quantized_weights(weight_bits), torch.no_grad():
            for i in range(0, len(images), self.batch_size):
                act = head(torch.from_numpy(images[i : i + self.batch_size]).to(self.device))
                outs.append(tail(self.quantize_activation(act, cut, act_bits)).cpu())
                if tick is not None:
                    tick(len(act))
        return torch.cat(outs)

    def cut_profiles(self, input_shape: tuple[int, ...]) -> list[CutProfile]:
        """Per cut: sizes, FLOPs and head/tail latency on this (serving) machine, batch 1."""
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            total_flops = sum(self.flops)
            profiles = []
            x = torch.zeros((1, *input_shape), device=self.device)
            for cut in self.cuts:
                head, tail = self.parts[cut.index]
                act = head(x)
                profiles.append(CutProfile(
                    index=cut.index, node=cut.node, activation_shape=list(cut.shape),
                    activation_numel=cut.numel,
                    head_tensors=[t.name for t in self.head_tensors(cut.index)],
                    head_float_params=self.float_params(cut.index),
                    head_flops=self.head_flops(cut.index),
                    tail_flops=total_flops - self.head_flops(cut.index),
                    server_head_s=median_latency(head, x, warmup=3, repeats=15),
                    server_tail_s=median_latency(tail, act, warmup=3, repeats=15),
                    runtimes_refused=runtime_refusals(head, input_shape) if cut.index else {},
                ))
            return profiles
        finally:
            torch.set_num_threads(threads)
