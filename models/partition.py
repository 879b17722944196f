"""Cutting a torch model into head and tail at its legal cuts, with torch.fx.

A *position* sits between two operations of the traced graph in topological order. It is a legal
cut when exactly one activation tensor is live across it (parameters are not activations), so no
cut ever falls inside a residual block. Positions whose next operation is a free elementwise or
reshaping op (ReLU, dropout, flatten, identity, batch norm) are dropped: the same tensor, one op
later, is never larger and quantizes no worse. Cut 0 is the input (all-server); the last cut is the
output (all-device).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp
from torch.nn.utils.fusion import fuse_conv_bn_eval

from qpart.models.errors import PartitionError

_FREE_MODULES = (nn.ReLU, nn.ReLU6, nn.Dropout, nn.Flatten, nn.Identity, nn.BatchNorm2d, nn.BatchNorm1d)
_FREE_FUNCTIONS = {torch.relu, torch.flatten, nn.functional.relu, nn.functional.dropout}
_FREE_METHODS = {"relu", "flatten", "view", "reshape"}


@dataclass(frozen=True)
class Cut:
    """One legal cut: its index, the graph node whose output crosses it, and that tensor's size."""

    index: int
    node: str
    shape: tuple[int, ...]
    position: int

    @property
    def numel(self) -> int:
        """Elements of the activation for one sample."""
        n = 1
        for d in self.shape:
            n *= d
        return n


def prepare(model: nn.Module, input_shape: tuple[int, ...], *, fold_bn: bool = True) -> fx.GraphModule:
    """Trace ``model`` in eval mode (folding batch norm into the preceding conv) and record shapes."""
    model = model.eval()
    try:
        gm = fx.symbolic_trace(copy.deepcopy(model))
    except Exception as exc:  # torch.fx raises many types on untraceable code
        raise PartitionError(f"torch.fx cannot trace {type(model).__name__}: {exc}") from exc
    if fold_bn:
        _fold_batch_norm(gm)
    with torch.no_grad():
        ShapeProp(gm).propagate(torch.zeros((1, *input_shape)))
    return gm


def _fold_batch_norm(gm: fx.GraphModule) -> None:
    """Fold every eval-mode BatchNorm2d that alone consumes a Conv2d into that conv, in place."""
    for node in list(gm.graph.nodes):
        bn = gm.get_submodule(str(node.target)) if node.op == "call_module" else None
        if not isinstance(bn, nn.BatchNorm2d):
            continue
        prev = node.args[0]
        if not isinstance(prev, fx.Node) or prev.op != "call_module" or len(prev.users) != 1:
            continue
        conv = gm.get_submodule(str(prev.target))
        if not isinstance(conv, nn.Conv2d):
            continue
        parent, _, leaf = str(prev.target).rpartition(".")
        setattr(gm.get_submodule(parent) if parent else gm, leaf, fuse_conv_bn_eval(conv, bn))
        node.replace_all_uses_with(prev)
        gm.graph.erase_node(node)
    gm.graph.lint()
    gm.delete_all_unused_submodules()
    gm.recompile()


def _ops(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op in ("call_module", "call_function", "call_method")]


def _is_free(gm: fx.GraphModule, node: fx.Node) -> bool:
    if node.op == "call_module":
        return isinstance(gm.get_submodule(str(node.target)), _FREE_MODULES)
    if node.op == "call_function":
        return node.target in _FREE_FUNCTIONS
    return node.op == "call_method" and node.target in _FREE_METHODS


def _tensor_shape(node: fx.Node) -> tuple[int, ...] | None:
    """One sample's shape of the tensor ``node`` makes; None for anything else (a tuple of tensors
    from ``chunk`` or ``unbind``, a size from ``x.shape``)."""
    meta = node.meta.get("tensor_meta")
    if meta is None or not hasattr(meta, "shape"):
        return None
    return tuple(int(d) for d in meta.shape[1:])


def _shape(node: fx.Node) -> tuple[int, ...]:
    shape = _tensor_shape(node)
    if shape is None:
        raise PartitionError(f"node '{node.name}' does not produce a single tensor")
    return shape


def cuts_of(gm: fx.GraphModule) -> list[Cut]:
    """The legal cuts of a prepared graph, in order from input to output."""
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    ops = _ops(gm)
    values = [n for n in nodes if n.op in ("placeholder", "call_module", "call_function", "call_method")]
    placeholder = nodes[0]
    found: list[Cut] = [Cut(0, placeholder.name, _shape(placeholder), -1)]
    for k, op in enumerate(ops):
        boundary = order[op]
        live = [v for v in values if order[v] <= boundary and any(order[u] > boundary for u in v.users)]
        is_last = k == len(ops) - 1
        if is_last or (len(live) == 1 and not _is_free(gm, ops[k + 1])):
            value = op if is_last else live[0]
            if not is_last and (value is placeholder or _tensor_shape(value) is None):
                continue  # only one tensor can cross: not a tuple of them, not a size
            found.append(Cut(len(found), value.name, _shape(value), k))
    return found


def legal_cuts(model: nn.Module, input_shape: tuple[int, ...]) -> list[Cut]:
    """Legal cuts of ``model`` for inputs of ``input_shape`` (without the batch dimension)."""
    return cuts_of(prepare(model, input_shape))


def split(gm: fx.GraphModule, cut: Cut) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Head (input → activation at ``cut``) and tail (activation → output) modules."""
    nodes = list(gm.graph.nodes)
    ops = _ops(gm)
    if cut.position >= len(ops):
        raise PartitionError(f"cut {cut.index} is past the last operation")
    boundary = nodes.index(ops[cut.position]) if cut.position >= 0 else 0
    head, tail = fx.Graph(), fx.Graph()
    env_h: dict[fx.Node, fx.Node] = {}
    env_t: dict[fx.Node, fx.Node] = {}
    crossing = next(n for n in nodes if n.name == cut.node)
    for i, node in enumerate(nodes):
        if node.op == "output":
            head.output(env_h[crossing])
            tail.node_copy(node, lambda n: env_t[n])
        elif i <= boundary:
            env_h[node] = head.node_copy(node, lambda n: env_h[n])
            if node.op == "get_attr":
                env_t[node] = tail.node_copy(node, lambda n: env_t[n])
            if node is crossing:
                env_t[node] = tail.placeholder("activation")
        elif node.op == "get_attr":
            env_t[node] = tail.node_copy(node, lambda n: env_t[n])
        else:
            env_t[node] = tail.node_copy(node, lambda n: _lookup(env_t, n, cut))
    return fx.GraphModule(gm, head, "Head"), fx.GraphModule(gm, tail, "Tail")


def _lookup(env: dict[fx.Node, fx.Node], node: fx.Node, cut: Cut) -> fx.Node:
    if node not in env:
        raise PartitionError(f"cut {cut.index} is not legal: '{node.name}' crosses it too")
    return env[node]


def cut_flops(gm: fx.GraphModule) -> list[int]:
    """Floating-point operations per op node for one sample (2 per multiply-add)."""
    flops = []
    for node in _ops(gm):
        out = 1
        for d in _tensor_shape(node) or (0,):  # sizes and tuples of views cost nothing
            out *= d
        mod = gm.get_submodule(str(node.target)) if node.op == "call_module" else None
        if isinstance(mod, nn.Conv2d):
            kh, kw = mod.kernel_size
            flops.append(2 * out * (mod.in_channels // mod.groups) * kh * kw)
        elif isinstance(mod, nn.Linear):
            flops.append(2 * out * mod.in_features)
        else:
            flops.append(out)
    return flops
