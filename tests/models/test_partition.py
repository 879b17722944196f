"""Partitioning: every legal cut is exact, and no cut falls inside a residual block."""

import pytest
import torch

from qpart.models.architectures import BasicBlock, fmnist_cnn, fmnist_resnet, resnet18_style
from qpart.models.errors import PartitionError
from qpart.models.partition import Cut, cut_flops, cuts_of, prepare, split

ARCHS = [
    pytest.param(fmnist_cnn, (1, 28, 28), id="fmnist-cnn"),
    pytest.param(fmnist_resnet, (1, 28, 28), id="fmnist-resnet"),
    pytest.param(resnet18_style, (3, 64, 64), id="resnet18-style"),
]


def _randomized(factory):
    torch.manual_seed(0)
    model = factory().eval()
    for mod in model.modules():  # non-trivial batch-norm statistics so folding matters
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.5, 0.5)
    return model


@pytest.mark.parametrize(("factory", "shape"), ARCHS)
@pytest.mark.parametrize("fold_bn", [False, True])
def test_tail_of_head_equals_the_model_at_every_cut(factory, shape, fold_bn):
    model = _randomized(factory)
    gm = prepare(model, shape, fold_bn=fold_bn)
    x = torch.randn(3, *shape)
    with torch.no_grad():
        ref = gm(x)
        if not fold_bn:
            assert torch.equal(ref, model(x))
        for cut in cuts_of(gm):
            head, tail = split(gm, cut)
            act = head(x)
            assert tuple(act.shape[1:]) == cut.shape
            torch.testing.assert_close(tail(act), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("factory", "shape"), ARCHS)
def test_folding_batch_norm_keeps_the_function(factory, shape):
    model = _randomized(factory)
    x = torch.randn(3, *shape)
    with torch.no_grad():
        torch.testing.assert_close(prepare(model, shape)(x), model(x), atol=1e-4, rtol=1e-4)


def _block_of(node, blocks):
    """The residual block whose forward created ``node`` (torch.fx records the module stack)."""
    stack = node.meta.get("nn_module_stack", {})
    inside = [b for b in blocks if b in stack]
    return inside[-1] if inside else None


@pytest.mark.parametrize(("factory", "shape"), ARCHS)
def test_no_cut_falls_inside_a_residual_block(factory, shape):
    model = factory()
    gm = prepare(model, shape, fold_bn=False)
    blocks = {name for name, mod in model.named_modules() if isinstance(mod, BasicBlock)}
    by_name = {n.name: n for n in gm.graph.nodes}
    cuts = cuts_of(gm)
    assert cuts[0].index == 0 and cuts[-1].shape == (10,)
    for cut in cuts:
        node = by_name[cut.node]
        block = _block_of(node, blocks)
        if block is not None:  # only a block's output may cross a cut: no user is inside the block
            assert all(_block_of(user, blocks) != block for user in node.users), (cut, block)
    if blocks:  # each block boundary is a cut: the block's output relu
        assert len(cuts) >= len(blocks) + 2
        inner = [n for n in gm.graph.nodes if _block_of(n, blocks) and n.op.startswith("call")]
        assert len(inner) > 2 * len(blocks)  # the module stack really is recorded


def test_first_and_last_cut_are_all_server_and_all_device():
    gm = prepare(fmnist_cnn(), (1, 28, 28))
    cuts = cuts_of(gm)
    x = torch.randn(2, 1, 28, 28)
    head0, _ = split(gm, cuts[0])
    head_l, tail_l = split(gm, cuts[-1])
    with torch.no_grad():
        assert torch.equal(head0(x), x)
        assert torch.equal(tail_l(head_l(x)), head_l(x))
    assert len(list(head0.parameters())) == 0 and len(list(tail_l.parameters())) == 0


def test_a_cut_inside_a_block_is_rejected():
    gm = prepare(fmnist_resnet(), (1, 28, 28), fold_bn=False)
    inner = next(n for n in gm.graph.nodes if n.name == "stages_0_conv1")
    ops = [n for n in gm.graph.nodes if n.op.startswith("call")]
    bogus = Cut(99, inner.name, (16, 28, 28), ops.index(inner))
    with pytest.raises(PartitionError, match="crosses it too"):
        split(gm, bogus)


def test_flops_count_convolutions_and_linears():
    gm = prepare(fmnist_cnn(), (1, 28, 28))
    flops = cut_flops(gm)
    assert flops[0] == 2 * 32 * 28 * 28 * 9  # first conv: 1 -> 32 channels, 3x3
    assert sum(flops) > 37_000_000
