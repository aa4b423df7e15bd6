"""An independent oracle for the hypergradient tests: its own forward of the tiny-smooth model and its own losses.
Nothing here imports the project's model, BN layer, policy or loss code; β-mixed batch norm is written out by hand
from `torch.var_mean`, so a mistake in `core.bn`, `core.functional` or
`core.hypergrad`'s losses cannot cancel out against the oracle.

Layout of tiny-smooth (models.registry.tiny_smooth), by parameter name:
    0: Conv2d(c,3,3,pad 1,bias)  1: BN(3)  2: Softplus  3: AvgPool2d(2)
    4: Conv2d(3,4,3,pad 1)       5: BN(4)  6: Softplus  7: global average  8: Flatten  9: Linear(4,k)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

EPS = 1e-5
BN = ("1", "5")  # BN layer prefixes, in order


def mixed_bn(x, w, b, pt_mean, pt_var, beta, train, client_mean=None, client_var=None):
    """(1-β)·pretrained + β·client statistics; client = this batch's (biased var) when training."""
    if train:
        var, mean = torch.var_mean(x, dim=(0, 2, 3), unbiased=False)
    else:
        mean, var = client_mean, client_var
    m = (1 - beta) * pt_mean + beta * mean
    v = (1 - beta) * pt_var + beta * var
    # written out: F.batch_norm cannot differentiate through its statistics arguments (β and the batch moments)
    return w[:, None, None] * (x - m[:, None, None]) / torch.sqrt(v[:, None, None] + EPS) + b[:, None, None]


def logits(theta, buffers, x, beta, train, client=None):
    def bn(h, i, name):
        cm, cv = (client[0][i], client[1][i]) if client is not None else (None, None)
        return mixed_bn(h, theta[f"{name}.weight"], theta[f"{name}.bias"], buffers[f"{name}.running_mean"],
                        buffers[f"{name}.running_var"], beta[i], train, cm, cv)

    h = F.conv2d(x, theta["0.weight"], theta["0.bias"], padding=1)
    h = F.avg_pool2d(F.softplus(bn(h, 0, BN[0])), 2)
    h = F.conv2d(h, theta["4.weight"], None, padding=1)
    h = F.softplus(bn(h, 1, BN[1])).mean(dim=(2, 3))
    return h @ theta["9.weight"].T + theta["9.bias"]


def ce(theta, buffers, x, y, beta, train, client=None):
    return F.cross_entropy(logits(theta, buffers, x, beta, train, client), y)


def train_loss(theta, buffers, beta, eta, batch, hessian="exact"):
    """Eq. 9-10: CE after one in-graph step θ' = θ − η ⊙ ∇CE(θ). "fo": the inner gradient as a constant in θ and β."""
    x, y = batch
    names = list(theta)
    if hessian == "exact":
        g = torch.autograd.grad(ce(theta, buffers, x, y, beta, True), [theta[n] for n in names], create_graph=True)
    else:
        const = {n: theta[n].detach().requires_grad_() for n in names}
        g = torch.autograd.grad(ce(const, buffers, x, y, beta.detach(), True), [const[n] for n in names])
    stepped = {n: theta[n] - e * gn for n, e, gn in zip(names, eta, g)}
    return ce(stepped, buffers, x, y, beta, True)


def val_loss(theta, buffers, beta, batch, client):
    """CE in evaluation mode: the client's running statistics mixed with the pretrained ones."""
    x, y = batch
    return ce(theta, buffers, x, y, beta, False, client)


def buffers_of(model):
    return {n: b.detach() for n, b in model.named_buffers() if "running" in n}


def finite_difference_indices(grad, names_sizes, per_block=8, tol=1e-6):
    """Indices into the flat λ where the gradient is clearly non-zero, per block (bnnet, lrnet, eta): the largest
    entries and a spread of the rest, plus every output bias. A block with no clearly non-zero entry is an error."""
    blocks: dict[str, list[int]] = {}
    i = 0
    out_bias = []
    for name, n in names_sizes:
        blocks.setdefault(name.split(".")[0], []).extend(range(i, i + n))
        if name.endswith(".bias") and name.split(".")[1] == "2":
            out_bias.extend(range(i, i + n))
        i += n
    chosen = []
    for block, idx in blocks.items():
        idx_t = torch.tensor(idx)
        nz = idx_t[grad[idx_t].abs() > tol]
        assert len(nz) > 0, f"no clearly non-zero hypergradient entry in {block}"
        order = nz[grad[nz].abs().argsort(descending=True)]
        chosen += order[:per_block // 2].tolist() + order[torch.linspace(0, len(order) - 1, per_block // 2).long()].tolist()
    return sorted(set(chosen + out_bias))
