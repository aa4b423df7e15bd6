"""The IFT hypergradient (Alg. 2) and FOMAML+ against independent oracles, in float64 on a smooth model.
Every oracle computes its losses with tests/oracle.py (its own forward and β-mixed BN), never the project's."""

import pytest
import torch

from fedl2p_cli.core import hypergrad
from fedl2p_cli.core.hypergrad import fomaml_gradient, ift_hypergradient

from . import oracle
from .helpers import old_meta, smooth_setup


def o_train(model, theta, beta, eta, batch, hessian="exact"):
    return oracle.train_loss(theta, oracle.buffers_of(model), beta, eta, batch, hessian)


def o_val(model, theta, beta, batch, bn):
    return oracle.val_loss(theta, oracle.buffers_of(model), beta, batch, (bn.mean, bn.var))



@pytest.fixture(autouse=True, scope="module")
def float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def flat(d):
    return torch.cat([v.reshape(-1) for v in d.values()])


def unflat(vec, like):
    out, i = {}, 0
    for k, v in like.items():
        out[k] = vec[i:i + v.numel()].view_as(v)
        i += v.numel()
    return out


def dense_pieces(model, theta, lam, hyper, tb, vb, bn, hessian="exact", theta_val=None):
    """H = d2 L_T/dtheta2, J = d2 L_T/dtheta dlambda, v = dL_V/dtheta, direct = dL_V/dlambda, as dense arrays;
    L_V at theta_val when given (the last-step reading), else at theta."""
    t0, l0 = flat(theta), flat(lam)
    tv = t0 if theta_val is None else flat(theta_val)

    def lt(t, l):
        beta, eta = hyper(unflat(l, lam))
        return o_train(model, unflat(t, theta), beta, eta, tb, hessian)

    def lv(t, l):
        beta, _ = hyper(unflat(l, lam))
        return o_val(model, unflat(t, theta), beta, vb, bn)

    H = torch.autograd.functional.hessian(lambda t: lt(t, l0), t0)
    J = torch.autograd.functional.jacobian(
        lambda l: torch.autograd.functional.jacobian(lambda t: lt(t, l), t0, create_graph=True), l0)
    v = torch.autograd.functional.jacobian(lambda t: lv(t, l0), tv)
    direct = torch.autograd.functional.jacobian(lambda l: lv(tv, l), l0)
    return H, J, v, direct


def neumann_oracle(pieces, q=3, psi=0.1):
    H, J, v, direct = pieces
    p, vv = v.clone(), v.clone()
    for _ in range(q):
        vv = vv - psi * H @ vv
        p = p + vv
    return direct - J.T @ p


@pytest.fixture(scope="module")
def setup(float64):
    model, theta, lam, hyper, (x, y), bn = smooth_setup()
    tb, vb = (x[:12], y[:12]), (x[12:], y[12:])
    return model, theta, lam, hyper, tb, vb, bn, dense_pieces(model, theta, lam, hyper, tb, vb, bn)


@pytest.mark.parametrize("hessian", ["exact", "fo"])
def test_oracle_losses_agree_with_the_project(setup, hessian):
    """The two independent implementations compute the same numbers (if not, one of them is wrong)."""
    model, theta, lam, hyper, tb, vb, bn, _ = setup
    beta, eta = hyper(lam)
    theta = {k: v.clone().requires_grad_() for k, v in theta.items()}
    torch.testing.assert_close(hypergrad.train_loss(model, theta, beta, eta, tb, hessian), o_train(model, theta, beta, eta, tb, hessian),
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(hypergrad.val_loss(model, theta, beta, vb, bn), o_val(model, theta, beta, vb, bn),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("scaled,hessian", [(False, "exact"), (True, "exact"), (False, "fo")])
def test_neumann_matches_dense_formula(setup, scaled, hessian):
    model, theta, lam, hyper, tb, vb, bn, pieces = setup
    H, J, v, direct = pieces if hessian == "exact" else dense_pieces(model, theta, lam, hyper, tb, vb, bn, "fo")
    q, psi = 3, 0.1
    p, vv = v.clone(), v.clone()
    for _ in range(q):
        vv = vv - psi * H @ vv
        p = p + vv
    if scaled:
        p = psi * p
    oracle = direct - J.T @ p
    got = ift_hypergradient(model, theta, lam, hyper, tb, vb, bn, q=q, psi=psi, scale_by_psi=scaled, hessian=hessian)
    g = flat(got.grads)
    for group in ("bnnet", "lrnet", "eta"):  # every block of lambda, separately
        mask = torch.cat([torch.full((t.numel(),), k.startswith(group)) for k, t in lam.items()])
        assert oracle[mask].abs().max() > 1e-8, group
        torch.testing.assert_close(g[mask], oracle[mask], rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("hessian", ["exact", "fo"])
def test_last_step_reading_matches_dense_formula(setup, hessian):
    """--ift-at last-step: L_T differentiated at theta_prev (theta' = theta* is the last fine-tuning step), L_V at
    theta*; with fo the step's own gradient is passed in instead of recomputed."""
    model, theta_prev, lam, hyper, tb, vb, bn, _ = setup
    beta, eta = (t.detach() for t in hyper(lam))
    const = {k: v.clone().requires_grad_() for k, v in theta_prev.items()}
    g = torch.autograd.grad(oracle.ce(const, oracle.buffers_of(model), *tb, beta, True), list(const.values()))
    theta_star = {k: v - e * gk for (k, v), e, gk in zip(theta_prev.items(), eta, g)}
    want = neumann_oracle(dense_pieces(model, theta_prev, lam, hyper, tb, vb, bn, hessian, theta_val=theta_star))
    got = ift_hypergradient(model, theta_star, lam, hyper, tb, vb, bn, hessian=hessian, theta_train=theta_prev,
                            inner_grad=list(g) if hessian == "fo" else None)
    torch.testing.assert_close(flat(got.grads), want, rtol=1e-7, atol=1e-10)
    star = flat(ift_hypergradient(model, theta_star, lam, hyper, tb, vb, bn, hessian=hessian).grads)
    assert (star - want).abs().max() > 1e-6  # the two readings differ: the test can tell them apart


def test_hypergradient_against_finite_differences(setup):
    """With p held fixed the hypergradient is the gradient of L_V(theta*, lam) - p . dL_T/dtheta(theta*, lam)."""
    model, theta, lam, hyper, tb, vb, bn, (H, J, v, direct) = setup
    q, psi = 3, 0.1
    p, vv = v.clone(), v.clone()
    for _ in range(q):
        vv = vv - psi * H @ vv
        p = p + vv
    t0 = flat(theta)

    def psi_fn(l):
        lt_t = t0.clone().requires_grad_()
        beta, eta = hyper(unflat(l, lam))
        g = torch.autograd.grad(o_train(model, unflat(lt_t, theta), beta, eta, tb), lt_t)[0]
        return (o_val(model, theta, beta, vb, bn) - p @ g).item()

    got = flat(ift_hypergradient(model, theta, lam, hyper, tb, vb, bn, q=q, psi=psi).grads)
    l0 = flat(lam)
    idx = oracle.finite_difference_indices(got, [(k, v.numel()) for k, v in lam.items()])
    h = 1e-6
    for i in idx:
        e = torch.zeros_like(l0)
        e[i] = h
        fd = (psi_fn(l0 + e) - psi_fn(l0 - e)) / (2 * h)
        assert abs(fd - got[i].item()) < 1e-6 + 1e-4 * abs(fd), (i, fd, got[i].item())


def test_ift_equals_unrolled_differentiation_at_a_stationary_point():
    """psi-scaled Neumann(Q) = d/dlambda of L_V after Q+1 gradient steps (lr psi) on L_T from theta* (Lorraine et al.)."""
    model, theta, lam, hyper, (x, y), bn = smooth_setup(n=40, noisy=True, seed=2)
    tb, vb = (x[:24], y[:24]), (x[24:], y[24:])
    t = flat(theta).clone().requires_grad_()
    lam_d = {k: v.detach() for k, v in lam.items()}
    beta, eta = (h.detach() for h in hyper(lam_d))
    opt = torch.optim.LBFGS([t], lr=1, max_iter=500, tolerance_grad=1e-13, tolerance_change=1e-16,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = o_train(model, unflat(t, theta), beta, eta, tb)
        loss.backward()
        return loss

    for _ in range(6):
        opt.step(closure)
    theta_star = {k: v.detach() for k, v in unflat(t.detach(), theta).items()}
    lt_leaf = {k: v.clone().requires_grad_() for k, v in theta_star.items()}
    gnorm = flat(dict(zip(lt_leaf, torch.autograd.grad(o_train(model, lt_leaf, beta, eta, tb), list(lt_leaf.values()))))).norm()
    assert gnorm < 1e-7, gnorm

    q, psi = 3, 0.1
    lam_l = {k: v.clone().requires_grad_() for k, v in lam_d.items()}
    b, e = hyper(lam_l)
    th = dict(theta_star)
    for _ in range(q + 1):  # unrolled, fully differentiated
        leaf = {k: v if v.requires_grad else v.clone().requires_grad_() for k, v in th.items()}
        g = torch.autograd.grad(o_train(model, leaf, b, e, tb), list(leaf.values()), create_graph=True)
        th = {k: v - psi * gk for (k, v), gk in zip(leaf.items(), g)}
    unrolled = torch.autograd.grad(o_val(model, th, b, vb, bn), list(lam_l.values()), allow_unused=True)
    unrolled = torch.cat([(torch.zeros_like(v) if u is None else u).reshape(-1) for u, v in zip(unrolled, lam_l.values())])
    got = flat(ift_hypergradient(model, theta_star, lam_d, hyper, tb, vb, bn, q=q, psi=psi, scale_by_psi=True).grads)
    torch.testing.assert_close(got, unrolled, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("val_stats", ["running", "test-batch"])
def test_fomaml_against_finite_differences(setup, val_stats):
    """test-batch: the validation loss normalises with the validation batch's statistics mixed by beta (the oracle's
    training-mode forward), for meta-nets learned for `personalize --eval-stats test-batch`."""
    model, theta, lam, hyper, tb, vb, bn, _ = setup

    def f(l):
        beta, eta = hyper(unflat(l, lam))
        leaf = {k: v.clone().requires_grad_() for k, v in theta.items()}
        g = torch.autograd.grad(oracle.ce(leaf, oracle.buffers_of(model), *tb, beta, True), list(leaf.values()))
        stepped = {k: v - e * gk for (k, v), e, gk in zip(theta.items(), eta, g)}
        if val_stats == "test-batch":
            return oracle.ce(stepped, oracle.buffers_of(model), *vb, beta, True).item()
        return o_val(model, stepped, beta, vb, bn).item()

    got = flat(fomaml_gradient(model, theta, lam, hyper, tb, vb, bn, val_stats).grads)
    l0 = flat(lam)
    h = 1e-6
    for i in oracle.finite_difference_indices(got, [(k, v.numel()) for k, v in lam.items()]):
        e = torch.zeros_like(l0)
        e[i] = h
        fd = (f(l0 + e) - f(l0 - e)) / (2 * h)
        assert abs(fd - got[i].item()) < 1e-7 + 1e-4 * abs(fd), (i, fd, got[i].item())


def dense_ritz_max(H, v, m):
    """max |Ritz value| of H on span{v, Hv, .., H^(m-1) v}, by a dense QR of those vectors (independent of
    core.hypergrad.krylov)."""
    cols = [v / v.norm()]
    for _ in range(m - 1):
        w = H @ cols[-1]
        cols.append(w / w.norm())
    q, _ = torch.linalg.qr(torch.stack(cols, 1))
    return torch.linalg.eigvalsh(q.T @ H @ q).abs().max().item()


@pytest.mark.parametrize("q,n", [(0, 1), (0, 2), (3, 3), (3, 5), (1, 4)])
def test_krylov_lambda_max_is_rayleigh_ritz_never_above_eigvalsh(setup, q, n):
    """--psi-power N: lambda_max is the largest |Ritz value| on the Krylov space of the max(Q, N) products the IFT
    makes from dL_V/dtheta (read back from the psi it used, PSI_MARGIN / estimate). Against a dense QR of that space,
    never above the dense eigendecomposition's max |eigenvalue|, never below the power iteration's Rayleigh quotient
    with as many products."""
    model, theta, lam, hyper, tb, vb, bn, (H, J, v, direct) = setup
    m = max(q, n)
    got = ift_hypergradient(model, theta, lam, hyper, tb, vb, bn, q=q, psi=1e6, hessian="exact", psi_power=n)
    est = hypergrad.PSI_MARGIN / got.psi
    assert est == pytest.approx(dense_ritz_max(H, v, m), rel=1e-9)
    assert est <= torch.linalg.eigvalsh(H).abs().max().item() * (1 + 1e-12)
    u = torch.linalg.matrix_power(H, m - 1) @ v
    assert est >= abs(u @ H @ u / (u @ u)).item() * (1 - 1e-12)


def test_krylov_lambda_max_converges_to_eigvalsh(setup):
    """With enough products the estimate is the dense eigendecomposition's max |eigenvalue| (the Krylov space
    outgrows the parameter count: Arnoldi's breakdown leaves the estimate exact), and the result is the dense
    formula at psi = PSI_MARGIN / lambda_max."""
    model, theta, lam, hyper, tb, vb, bn, (H, J, v, direct) = setup
    lam_max = torch.linalg.eigvalsh(H).abs().max().item()
    psi = hypergrad.PSI_MARGIN / lam_max
    assert psi < 10.0  # the cap min(10, PSI_MARGIN/lambda_max) is not what decides here
    got = ift_hypergradient(model, theta, lam, hyper, tb, vb, bn, q=3, psi=10.0, hessian="exact",
                            psi_power=H.shape[0] + 5)
    assert got.psi == pytest.approx(psi, rel=1e-9)
    torch.testing.assert_close(flat(got.grads), neumann_oracle((H, J, v, direct), psi=psi), rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("hessian", ["exact", "fo"])
def test_stable_ift_matches_dense_formula(setup, hessian):
    """The stable IFT (MetaConfig's --psi-power, --scale-by-psi, --eta-grad last-step), psi's cap lifted so that the
    Krylov estimate decides it: p = psi * sum_{k<=Q} (I - psi H)^k v with psi = PSI_MARGIN / the dense Rayleigh-Ritz
    value on {v, .., H^(Q-1) v}, for BNNet, LRNet and eta~ separately."""
    cfg = old_meta()
    model, theta_prev, lam, hyper, tb, vb, bn, _ = setup
    beta0, eta0 = (t.detach() for t in hyper(lam))
    g = [torch.randn_like(t) for t in theta_prev.values()]
    theta_star = {k: t - e * gk for (k, t), e, gk in zip(theta_prev.items(), eta0, g)}
    H, J, v, _ = dense_pieces(model, theta_star, lam, lambda l: (hyper(l)[0], eta0), tb, vb, bn, hessian)

    def lv_through_step(l):
        beta, eta = hyper(unflat(l, lam))
        return o_val(model, {k: t - e * gk for (k, t), e, gk in zip(theta_prev.items(), eta, g)}, beta, vb, bn)

    direct = torch.autograd.functional.jacobian(lv_through_step, flat(lam))
    psi = hypergrad.PSI_MARGIN / dense_ritz_max(H, v, max(cfg.q, cfg.psi_power))
    p, vv = v.clone(), v.clone()
    for _ in range(cfg.q):
        vv = vv - psi * H @ vv
        p = p + vv
    want = direct - J.T @ (psi * p)
    got = ift_hypergradient(model, theta_star, lam, hyper, tb, vb, bn, cfg.q, 10.0, cfg.scale_by_psi, hessian,
                            cfg.psi_power, eta_step=g)
    assert got.psi == pytest.approx(psi, rel=1e-9) and psi < 10.0
    g_all = flat(got.grads)
    for group in ("bnnet", "lrnet", "eta"):
        mask = torch.cat([torch.full((t.numel(),), k.startswith(group)) for k, t in lam.items()])
        assert want[mask].abs().max() > 1e-8, group
        torch.testing.assert_close(g_all[mask], want[mask], rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("q,n", [(3, 3), (3, 5), (3, 0), (5, 3)])
def test_the_ift_makes_max_q_n_plus_one_second_order_products(setup, q, n):
    """One Krylov space serves lambda_max and the Neumann series: max(Q, N) Hessian-vector products and the mixed
    one, counted by wrapping torch.autograd.grad (bench/counting.py). The default (Q = 3 = N) makes the paper's 4."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from counting import count_backward
    model, theta, lam, hyper, tb, vb, bn, _ = setup
    with count_backward() as counts:
        ift_hypergradient(model, theta, lam, hyper, tb, vb, bn, q=q, psi_power=n, scale_by_psi=True, hessian="fo")
    assert counts.second_order == max(q, n) + 1


@pytest.mark.parametrize("hessian", ["exact", "fo"])
def test_eta_grad_last_step_matches_dense_formula(setup, hessian):
    """--eta-grad last-step (the default): theta* = theta_prev - eta * g. The learned LRs reach L_V through that step
    (its derivative, taken densely by the oracle on L_V(theta_prev - eta(lambda) g, beta(lambda))); the implicit term
    J^T p holds eta constant in L_T, so only beta's paths remain in it."""
    model, theta_prev, lam, hyper, tb, vb, bn, _ = setup
    beta0, eta0 = (t.detach() for t in hyper(lam))
    g = [torch.randn_like(v) for v in theta_prev.values()]  # any step direction: the last step's gradient in use
    theta_star = {k: v - e * gk for (k, v), e, gk in zip(theta_prev.items(), eta0, g)}
    beta_only = lambda l: (hyper(l)[0], eta0)  # noqa: E731 - L_T with the LRs held at their value
    H, J, v, _ = dense_pieces(model, theta_star, lam, beta_only, tb, vb, bn, hessian)

    def lv_through_step(l):
        beta, eta = hyper(unflat(l, lam))
        stepped = {k: t - e * gk for (k, t), e, gk in zip(theta_prev.items(), eta, g)}
        return o_val(model, stepped, beta, vb, bn)

    direct = torch.autograd.functional.jacobian(lv_through_step, flat(lam))
    want = neumann_oracle((H, J, v, direct))
    got = flat(ift_hypergradient(model, theta_star, lam, hyper, tb, vb, bn, hessian=hessian, eta_step=g).grads)
    for group in ("bnnet", "lrnet", "eta"):
        mask = torch.cat([torch.full((t.numel(),), k.startswith(group)) for k, t in lam.items()])
        torch.testing.assert_close(got[mask], want[mask], rtol=1e-7, atol=1e-10)
    paper = flat(ift_hypergradient(model, theta_star, lam, hyper, tb, vb, bn, hessian=hessian).grads)
    assert (paper - want).abs().max() > 1e-6  # --eta-grad ift differs: the test can tell them apart
