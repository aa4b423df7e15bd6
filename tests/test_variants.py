"""Variant names come from the options' declarations (`opt(..., tag=Tag(...))`, core/config.py): the name is the
family and the declared word of each option that differs from its default. Names enter artifact metrics and result
tables, so every name the hand-written grammar gave must come out byte-identical: GOLDEN was captured from that code
(MetaTrainConfig.variant() before the declarations existed) over each option alone and 120 random mixes, when the
defaults were the paper's meta-gradient and beta init (ift, 0.5): names are measured against those reference values
(`core.config.reference_of`), so every case starts from them."""

import random
import sys
from pathlib import Path

import pytest

from fedl2p_cli.configs import MetaTrainConfig, PersonalizeConfig
from fedl2p_cli.core.config import variant_words

TOP = {"nets": ["bnnet", "lrnet"], "local": [True], "input_norm": ["standardize"], "meta_opt": ["fedadam"],
       "keep": ["last"], "seed": [1, 7], "norm_bound": [3.0, 2.5], "aggregator": ["median", "trimmed-mean"]}
META = {"meta_grad": ["fomaml"], "hessian": ["exact"], "fixed_beta": [0.0, 0.3], "psi_power": [0, 5],
        "scale_by_psi": [False], "eta_bound": [0.0, 2.5], "eta_grad": ["ift"], "hidden_bias": ["zero"],
        "beta_init": [0.9, 0.25], "init_gain": [1.0, 0.25], "client_bn": ["running"], "ift_at": ["last-step"],
        "val_stats": ["test-batch"], "eta_nonneg": [True], "beta_output": ["sigmoid"], "lr_bnnet": [0.01, 0.0],
        "lr_lrnet": [0.003], "lr_eta": [0.001], "epochs": [2], "q": [5], "psi": [0.05], "base_lr": [0.01]}


def cases() -> list[tuple[dict, dict]]:
    """The default, each option alone at each listed value, then 120 seeded random mixes."""
    out = [({}, {})]
    for k, vs in TOP.items():
        out += [({k: v}, {}) for v in vs]
    for k, vs in META.items():
        out += [({}, {k: v}) for v in vs]
    rng = random.Random(50)
    for _ in range(120):
        top = {k: rng.choice(vs) for k, vs in TOP.items() if rng.random() < 0.3}
        meta = {k: rng.choice(vs) for k, vs in META.items() if rng.random() < 0.3}
        out.append((top, meta))
    return out


GOLDEN = [
    ({}, {}, 'fedl2p'),
    ({'nets': 'bnnet'}, {}, 'fedl2p-bnnet'),
    ({'nets': 'lrnet'}, {}, 'fedl2p-lrnet-b1'),
    ({'local': True}, {}, 'l2p'),
    ({'input_norm': 'standardize'}, {}, 'fedl2p-std'),
    ({'meta_opt': 'fedadam'}, {}, 'fedl2p-adam'),
    ({'keep': 'last'}, {}, 'fedl2p-last'),
    ({'seed': 1}, {}, 'fedl2p-seed1'),
    ({'seed': 7}, {}, 'fedl2p-seed7'),
    ({'norm_bound': 3.0}, {}, 'fedl2p-nb3'),
    ({'norm_bound': 2.5}, {}, 'fedl2p-nb2.5'),
    ({'aggregator': 'median'}, {}, 'fedl2p-median'),
    ({'aggregator': 'trimmed-mean'}, {}, 'fedl2p-trim'),
    ({}, {'meta_grad': 'fomaml'}, 'fedl2p-fomaml'),
    ({}, {'hessian': 'exact'}, 'fedl2p-exact'),
    ({}, {'fixed_beta': 0.0}, 'fedl2p'),
    ({}, {'fixed_beta': 0.3}, 'fedl2p'),
    ({}, {'psi_power': 0}, 'fedl2p-psifixed'),
    ({}, {'psi_power': 5}, 'fedl2p-psipow5'),
    ({}, {'scale_by_psi': False}, 'fedl2p-unscaled'),
    ({}, {'eta_bound': 0.0}, 'fedl2p-etab0'),
    ({}, {'eta_bound': 2.5}, 'fedl2p-etab2.5'),
    ({}, {'eta_grad': 'ift'}, 'fedl2p-etaift'),
    ({}, {'hidden_bias': 'zero'}, 'fedl2p-zerobias'),
    ({}, {'beta_init': 0.9}, 'fedl2p-binit0.9'),
    ({}, {'beta_init': 0.25}, 'fedl2p-binit0.25'),
    ({}, {'init_gain': 1.0}, 'fedl2p-gain1'),
    ({}, {'init_gain': 0.25}, 'fedl2p-gain0.25'),
    ({}, {'client_bn': 'running'}, 'fedl2p-runningbn'),
    ({}, {'ift_at': 'last-step'}, 'fedl2p-laststep'),
    ({}, {'val_stats': 'test-batch'}, 'fedl2p-valtbs'),
    ({}, {'eta_nonneg': True}, 'fedl2p-etapos'),
    ({}, {'beta_output': 'sigmoid'}, 'fedl2p-sigmoid'),
    ({}, {'lr_bnnet': 0.01}, 'fedl2p-bnnetlr0.01'),
    ({}, {'lr_bnnet': 0.0}, 'fedl2p-bnnetlr0'),
    ({}, {'lr_lrnet': 0.003}, 'fedl2p-lrnetlr0.003'),
    ({}, {'lr_eta': 0.001}, 'fedl2p-etalr0.001'),
    ({}, {'epochs': 2}, 'fedl2p'),
    ({}, {'q': 5}, 'fedl2p'),
    ({}, {'psi': 0.05}, 'fedl2p'),
    ({}, {'base_lr': 0.01}, 'fedl2p'),
    ({'local': True, 'norm_bound': 3.0}, {'hessian': 'exact', 'psi_power': 5, 'hidden_bias': 'zero', 'eta_nonneg': True, 'lr_eta': 0.001, 'epochs': 2, 'q': 5, 'base_lr': 0.01}, 'l2p-exact-psipow5-zerobias-etapos-etalr0.001-nb3'),
    ({'aggregator': 'trimmed-mean'}, {'meta_grad': 'fomaml', 'fixed_beta': 0.3, 'psi_power': 5, 'init_gain': 1.0, 'ift_at': 'last-step', 'beta_output': 'sigmoid', 'lr_eta': 0.001}, 'fedl2p-fomaml-gain1-sigmoid-etalr0.001-trim'),
    ({'meta_opt': 'fedadam'}, {'psi_power': 0, 'eta_grad': 'ift', 'hidden_bias': 'zero', 'beta_init': 0.9, 'init_gain': 0.25, 'client_bn': 'running', 'ift_at': 'last-step', 'eta_nonneg': True, 'lr_lrnet': 0.003, 'epochs': 2, 'base_lr': 0.01}, 'fedl2p-psifixed-etaift-adam-zerobias-binit0.9-gain0.25-runningbn-laststep-etapos-lrnetlr0.003'),
    ({'nets': 'bnnet', 'norm_bound': 3.0, 'aggregator': 'trimmed-mean'}, {'fixed_beta': 0.0, 'scale_by_psi': False, 'hidden_bias': 'zero', 'beta_init': 0.25, 'init_gain': 1.0, 'lr_bnnet': 0.01}, 'fedl2p-bnnet-unscaled-zerobias-binit0.25-gain1-bnnetlr0.01-trim-nb3'),
    ({'local': True, 'meta_opt': 'fedadam', 'seed': 7}, {'fixed_beta': 0.0, 'eta_grad': 'ift', 'init_gain': 0.25, 'ift_at': 'last-step', 'eta_nonneg': True, 'lr_eta': 0.001}, 'l2p-etaift-adam-gain0.25-laststep-etapos-etalr0.001-seed7'),
    ({'seed': 1, 'aggregator': 'median'}, {'psi_power': 5, 'hidden_bias': 'zero', 'beta_init': 0.9, 'client_bn': 'running', 'lr_lrnet': 0.003}, 'fedl2p-psipow5-zerobias-binit0.9-runningbn-lrnetlr0.003-median-seed1'),
    ({'nets': 'lrnet', 'seed': 1, 'aggregator': 'trimmed-mean'}, {'meta_grad': 'fomaml', 'init_gain': 1.0, 'epochs': 2}, 'fedl2p-fomaml-lrnet-b1-gain1-trim-seed1'),
    ({'nets': 'lrnet', 'keep': 'last', 'seed': 7, 'aggregator': 'median'}, {'meta_grad': 'fomaml', 'fixed_beta': 0.3, 'beta_init': 0.9, 'client_bn': 'running', 'lr_eta': 0.001, 'psi': 0.05}, 'fedl2p-fomaml-lrnet-b0.3-last-binit0.9-runningbn-etalr0.001-median-seed7'),
    ({'input_norm': 'standardize', 'norm_bound': 2.5}, {'eta_nonneg': True, 'lr_eta': 0.001, 'base_lr': 0.01}, 'fedl2p-std-etapos-etalr0.001-nb2.5'),
    ({'keep': 'last', 'norm_bound': 2.5, 'aggregator': 'median'}, {'hessian': 'exact'}, 'fedl2p-exact-last-median-nb2.5'),
    ({'nets': 'lrnet', 'meta_opt': 'fedadam'}, {'eta_bound': 0.0, 'eta_grad': 'ift', 'eta_nonneg': True, 'beta_output': 'sigmoid'}, 'fedl2p-lrnet-b1-etab0-etaift-adam-etapos-sigmoid'),
    ({'nets': 'bnnet', 'local': True, 'input_norm': 'standardize', 'meta_opt': 'fedadam'}, {'meta_grad': 'fomaml', 'scale_by_psi': False, 'val_stats': 'test-batch', 'lr_bnnet': 0.0, 'epochs': 2, 'psi': 0.05}, 'l2p-fomaml-bnnet-std-adam-valtbs-bnnetlr0'),
    ({'nets': 'bnnet', 'keep': 'last'}, {'hessian': 'exact', 'scale_by_psi': False, 'hidden_bias': 'zero', 'eta_nonneg': True, 'beta_output': 'sigmoid', 'epochs': 2}, 'fedl2p-exact-bnnet-unscaled-last-zerobias-etapos-sigmoid'),
    ({'nets': 'lrnet', 'input_norm': 'standardize', 'aggregator': 'trimmed-mean'}, {'hessian': 'exact', 'psi_power': 0, 'scale_by_psi': False, 'eta_grad': 'ift', 'beta_init': 0.9, 'val_stats': 'test-batch', 'beta_output': 'sigmoid', 'epochs': 2, 'q': 5, 'psi': 0.05}, 'fedl2p-exact-lrnet-b1-psifixed-unscaled-etaift-std-binit0.9-valtbs-sigmoid-trim'),
    ({'local': True, 'meta_opt': 'fedadam', 'keep': 'last'}, {'meta_grad': 'fomaml', 'fixed_beta': 0.3, 'eta_bound': 2.5, 'eta_grad': 'ift', 'val_stats': 'test-batch', 'psi': 0.05}, 'l2p-fomaml-adam-valtbs'),
    ({'meta_opt': 'fedadam', 'keep': 'last'}, {'meta_grad': 'fomaml', 'scale_by_psi': False, 'eta_nonneg': True, 'beta_output': 'sigmoid', 'lr_lrnet': 0.003, 'lr_eta': 0.001, 'q': 5, 'psi': 0.05}, 'fedl2p-fomaml-adam-last-etapos-sigmoid-lrnetlr0.003-etalr0.001'),
    ({'keep': 'last'}, {'hessian': 'exact', 'psi_power': 0, 'ift_at': 'last-step', 'q': 5}, 'fedl2p-exact-psifixed-last-laststep'),
    ({'input_norm': 'standardize', 'aggregator': 'median'}, {'meta_grad': 'fomaml', 'eta_bound': 0.0, 'beta_init': 0.9, 'init_gain': 0.25, 'val_stats': 'test-batch', 'lr_eta': 0.001, 'q': 5, 'psi': 0.05}, 'fedl2p-fomaml-std-binit0.9-gain0.25-valtbs-etalr0.001-median'),
    ({'nets': 'bnnet', 'norm_bound': 3.0}, {'meta_grad': 'fomaml', 'fixed_beta': 0.3, 'eta_bound': 2.5, 'client_bn': 'running', 'eta_nonneg': True, 'lr_bnnet': 0.01, 'lr_lrnet': 0.003, 'psi': 0.05, 'base_lr': 0.01}, 'fedl2p-fomaml-bnnet-runningbn-etapos-bnnetlr0.01-lrnetlr0.003-nb3'),
    ({'local': True, 'keep': 'last'}, {'hessian': 'exact', 'scale_by_psi': False, 'eta_bound': 0.0, 'eta_grad': 'ift', 'init_gain': 1.0, 'ift_at': 'last-step', 'epochs': 2, 'psi': 0.05, 'base_lr': 0.01}, 'l2p-exact-unscaled-etab0-etaift-gain1-laststep'),
    ({'nets': 'lrnet', 'keep': 'last'}, {'hessian': 'exact', 'beta_init': 0.25, 'ift_at': 'last-step', 'lr_bnnet': 0.0, 'lr_eta': 0.001}, 'fedl2p-exact-lrnet-b1-last-binit0.25-laststep-bnnetlr0-etalr0.001'),
    ({'nets': 'lrnet', 'local': True}, {'meta_grad': 'fomaml', 'scale_by_psi': False, 'eta_bound': 0.0, 'ift_at': 'last-step', 'lr_bnnet': 0.0, 'lr_eta': 0.001, 'epochs': 2}, 'l2p-fomaml-lrnet-b1-bnnetlr0-etalr0.001'),
    ({'nets': 'lrnet', 'local': True, 'keep': 'last'}, {'meta_grad': 'fomaml', 'fixed_beta': 0.0, 'init_gain': 0.25, 'lr_eta': 0.001}, 'l2p-fomaml-lrnet-b0-gain0.25-etalr0.001'),
    ({'input_norm': 'standardize', 'norm_bound': 2.5}, {'fixed_beta': 0.3, 'hidden_bias': 'zero', 'beta_init': 0.9, 'beta_output': 'sigmoid', 'lr_bnnet': 0.0}, 'fedl2p-std-zerobias-binit0.9-sigmoid-bnnetlr0-nb2.5'),
    ({'nets': 'lrnet', 'meta_opt': 'fedadam'}, {'hessian': 'exact', 'psi_power': 0, 'eta_grad': 'ift', 'beta_init': 0.9, 'eta_nonneg': True, 'beta_output': 'sigmoid', 'q': 5}, 'fedl2p-exact-lrnet-b1-psifixed-etaift-adam-binit0.9-etapos-sigmoid'),
    ({}, {'meta_grad': 'fomaml', 'hessian': 'exact', 'hidden_bias': 'zero', 'init_gain': 0.25, 'ift_at': 'last-step', 'eta_nonneg': True, 'beta_output': 'sigmoid', 'lr_bnnet': 0.01, 'psi': 0.05}, 'fedl2p-fomaml-zerobias-gain0.25-etapos-sigmoid-bnnetlr0.01'),
    ({'aggregator': 'trimmed-mean'}, {'hessian': 'exact', 'psi_power': 5, 'eta_grad': 'ift', 'client_bn': 'running', 'ift_at': 'last-step', 'val_stats': 'test-batch', 'beta_output': 'sigmoid', 'lr_eta': 0.001, 'psi': 0.05, 'base_lr': 0.01}, 'fedl2p-exact-psipow5-etaift-runningbn-laststep-valtbs-sigmoid-etalr0.001-trim'),
    ({'nets': 'lrnet'}, {'fixed_beta': 0.3, 'psi_power': 5, 'client_bn': 'running', 'ift_at': 'last-step', 'val_stats': 'test-batch'}, 'fedl2p-lrnet-b0.3-psipow5-runningbn-laststep-valtbs'),
    ({'input_norm': 'standardize', 'keep': 'last', 'aggregator': 'median'}, {'hessian': 'exact', 'eta_bound': 2.5, 'hidden_bias': 'zero', 'ift_at': 'last-step', 'val_stats': 'test-batch', 'lr_eta': 0.001, 'q': 5}, 'fedl2p-exact-etab2.5-std-last-zerobias-laststep-valtbs-etalr0.001-median'),
    ({}, {'fixed_beta': 0.3, 'psi_power': 5, 'beta_init': 0.9, 'init_gain': 1.0, 'val_stats': 'test-batch', 'beta_output': 'sigmoid', 'lr_lrnet': 0.003, 'psi': 0.05}, 'fedl2p-psipow5-binit0.9-gain1-valtbs-sigmoid-lrnetlr0.003'),
    ({'nets': 'bnnet', 'seed': 1, 'norm_bound': 3.0}, {'hessian': 'exact', 'psi_power': 5, 'q': 5, 'psi': 0.05}, 'fedl2p-exact-bnnet-psipow5-nb3-seed1'),
    ({}, {'hessian': 'exact', 'psi_power': 0, 'eta_bound': 2.5, 'init_gain': 0.25, 'lr_lrnet': 0.003}, 'fedl2p-exact-psifixed-etab2.5-gain0.25-lrnetlr0.003'),
    ({'norm_bound': 2.5}, {'meta_grad': 'fomaml', 'psi_power': 0, 'scale_by_psi': False, 'beta_init': 0.9, 'client_bn': 'running', 'val_stats': 'test-batch', 'beta_output': 'sigmoid', 'epochs': 2, 'q': 5, 'psi': 0.05, 'base_lr': 0.01}, 'fedl2p-fomaml-binit0.9-runningbn-valtbs-sigmoid-nb2.5'),
    ({'meta_opt': 'fedadam'}, {'scale_by_psi': False, 'beta_init': 0.25, 'init_gain': 0.25, 'client_bn': 'running', 'ift_at': 'last-step', 'beta_output': 'sigmoid', 'lr_bnnet': 0.01}, 'fedl2p-unscaled-adam-binit0.25-gain0.25-runningbn-laststep-sigmoid-bnnetlr0.01'),
    ({}, {'psi_power': 0, 'beta_output': 'sigmoid', 'lr_bnnet': 0.01, 'lr_eta': 0.001, 'q': 5}, 'fedl2p-psifixed-sigmoid-bnnetlr0.01-etalr0.001'),
    ({}, {'hessian': 'exact', 'fixed_beta': 0.3, 'psi_power': 5, 'client_bn': 'running', 'ift_at': 'last-step', 'val_stats': 'test-batch', 'lr_bnnet': 0.01, 'q': 5, 'psi': 0.05}, 'fedl2p-exact-psipow5-runningbn-laststep-valtbs-bnnetlr0.01'),
    ({'local': True}, {'meta_grad': 'fomaml', 'fixed_beta': 0.0, 'eta_grad': 'ift', 'val_stats': 'test-batch', 'lr_bnnet': 0.0, 'lr_lrnet': 0.003, 'q': 5}, 'l2p-fomaml-valtbs-bnnetlr0-lrnetlr0.003'),
    ({'local': True, 'seed': 1, 'aggregator': 'trimmed-mean'}, {'fixed_beta': 0.3, 'hidden_bias': 'zero', 'beta_init': 0.9, 'client_bn': 'running', 'ift_at': 'last-step', 'beta_output': 'sigmoid'}, 'l2p-zerobias-binit0.9-runningbn-laststep-sigmoid-trim-seed1'),
    ({'meta_opt': 'fedadam', 'seed': 7}, {'hessian': 'exact', 'fixed_beta': 0.0, 'scale_by_psi': False, 'ift_at': 'last-step', 'eta_nonneg': True, 'beta_output': 'sigmoid', 'lr_lrnet': 0.003, 'q': 5}, 'fedl2p-exact-unscaled-adam-laststep-etapos-sigmoid-lrnetlr0.003-seed7'),
    ({'local': True, 'meta_opt': 'fedadam'}, {'hessian': 'exact', 'fixed_beta': 0.3, 'eta_bound': 0.0, 'client_bn': 'running', 'ift_at': 'last-step', 'lr_bnnet': 0.0}, 'l2p-exact-etab0-adam-runningbn-laststep-bnnetlr0'),
    ({'nets': 'bnnet', 'norm_bound': 3.0}, {'fixed_beta': 0.3, 'scale_by_psi': False, 'hidden_bias': 'zero', 'init_gain': 1.0, 'client_bn': 'running', 'ift_at': 'last-step', 'val_stats': 'test-batch', 'eta_nonneg': True, 'lr_eta': 0.001, 'q': 5}, 'fedl2p-bnnet-unscaled-zerobias-gain1-runningbn-laststep-valtbs-etapos-etalr0.001-nb3'),
    ({}, {'hessian': 'exact', 'fixed_beta': 0.0, 'eta_bound': 2.5, 'ift_at': 'last-step', 'beta_output': 'sigmoid', 'lr_bnnet': 0.01, 'psi': 0.05, 'base_lr': 0.01}, 'fedl2p-exact-etab2.5-laststep-sigmoid-bnnetlr0.01'),
    ({'local': True, 'keep': 'last'}, {'fixed_beta': 0.0, 'scale_by_psi': False, 'eta_bound': 2.5, 'eta_grad': 'ift', 'init_gain': 0.25}, 'l2p-unscaled-etab2.5-etaift-gain0.25'),
    ({'seed': 1}, {'meta_grad': 'fomaml', 'psi_power': 0, 'scale_by_psi': False, 'eta_bound': 0.0, 'hidden_bias': 'zero', 'init_gain': 0.25, 'eta_nonneg': True, 'lr_eta': 0.001}, 'fedl2p-fomaml-zerobias-gain0.25-etapos-etalr0.001-seed1'),
    ({'nets': 'bnnet', 'norm_bound': 3.0}, {'client_bn': 'running', 'ift_at': 'last-step', 'eta_nonneg': True, 'lr_bnnet': 0.0, 'lr_eta': 0.001, 'epochs': 2, 'psi': 0.05}, 'fedl2p-bnnet-runningbn-laststep-etapos-bnnetlr0-etalr0.001-nb3'),
    ({'meta_opt': 'fedadam', 'norm_bound': 3.0, 'aggregator': 'trimmed-mean'}, {'hessian': 'exact', 'fixed_beta': 0.3, 'scale_by_psi': False, 'eta_grad': 'ift', 'beta_init': 0.25, 'client_bn': 'running', 'ift_at': 'last-step', 'beta_output': 'sigmoid', 'lr_bnnet': 0.01, 'lr_lrnet': 0.003}, 'fedl2p-exact-unscaled-etaift-adam-binit0.25-runningbn-laststep-sigmoid-bnnetlr0.01-lrnetlr0.003-trim-nb3'),
    ({'seed': 7, 'norm_bound': 2.5}, {'meta_grad': 'fomaml', 'hessian': 'exact', 'fixed_beta': 0.3, 'ift_at': 'last-step', 'epochs': 2, 'psi': 0.05}, 'fedl2p-fomaml-nb2.5-seed7'),
    ({'local': True, 'meta_opt': 'fedadam', 'keep': 'last', 'norm_bound': 3.0}, {'meta_grad': 'fomaml', 'scale_by_psi': False, 'beta_init': 0.25, 'lr_bnnet': 0.0, 'lr_lrnet': 0.003, 'psi': 0.05}, 'l2p-fomaml-adam-binit0.25-bnnetlr0-lrnetlr0.003-nb3'),
    ({'local': True, 'input_norm': 'standardize', 'meta_opt': 'fedadam', 'keep': 'last', 'seed': 1, 'aggregator': 'trimmed-mean'}, {'eta_grad': 'ift', 'ift_at': 'last-step', 'lr_bnnet': 0.01, 'lr_lrnet': 0.003}, 'l2p-etaift-std-adam-laststep-bnnetlr0.01-lrnetlr0.003-trim-seed1'),
    ({'nets': 'lrnet', 'keep': 'last'}, {'scale_by_psi': False, 'val_stats': 'test-batch', 'eta_nonneg': True, 'lr_bnnet': 0.01, 'lr_eta': 0.001}, 'fedl2p-lrnet-b1-unscaled-last-valtbs-etapos-bnnetlr0.01-etalr0.001'),
    ({'input_norm': 'standardize', 'meta_opt': 'fedadam'}, {'hessian': 'exact', 'eta_grad': 'ift', 'ift_at': 'last-step', 'lr_lrnet': 0.003, 'psi': 0.05}, 'fedl2p-exact-etaift-std-adam-laststep-lrnetlr0.003'),
    ({'nets': 'bnnet', 'local': True, 'input_norm': 'standardize', 'meta_opt': 'fedadam', 'keep': 'last', 'norm_bound': 2.5}, {'meta_grad': 'fomaml', 'fixed_beta': 0.3, 'scale_by_psi': False, 'q': 5}, 'l2p-fomaml-bnnet-std-adam-nb2.5'),
    ({'input_norm': 'standardize', 'aggregator': 'median'}, {'psi_power': 5, 'client_bn': 'running', 'val_stats': 'test-batch', 'lr_lrnet': 0.003, 'lr_eta': 0.001, 'epochs': 2}, 'fedl2p-psipow5-std-runningbn-valtbs-lrnetlr0.003-etalr0.001-median'),
    ({'keep': 'last', 'aggregator': 'trimmed-mean'}, {'fixed_beta': 0.0, 'init_gain': 1.0, 'lr_bnnet': 0.01, 'epochs': 2, 'base_lr': 0.01}, 'fedl2p-last-gain1-bnnetlr0.01-trim'),
    ({'input_norm': 'standardize', 'meta_opt': 'fedadam', 'keep': 'last', 'aggregator': 'median'}, {'meta_grad': 'fomaml', 'fixed_beta': 0.0, 'eta_bound': 2.5, 'client_bn': 'running', 'ift_at': 'last-step', 'eta_nonneg': True}, 'fedl2p-fomaml-std-adam-last-runningbn-etapos-median'),
    ({'keep': 'last'}, {'meta_grad': 'fomaml', 'fixed_beta': 0.3, 'psi_power': 0, 'scale_by_psi': False, 'eta_grad': 'ift', 'hidden_bias': 'zero', 'beta_init': 0.9, 'val_stats': 'test-batch', 'beta_output': 'sigmoid'}, 'fedl2p-fomaml-last-zerobias-binit0.9-valtbs-sigmoid'),
    ({}, {'hessian': 'exact', 'eta_bound': 2.5, 'eta_grad': 'ift', 'hidden_bias': 'zero', 'beta_init': 0.9, 'client_bn': 'running', 'lr_bnnet': 0.01, 'lr_lrnet': 0.003, 'base_lr': 0.01}, 'fedl2p-exact-etab2.5-etaift-zerobias-binit0.9-runningbn-bnnetlr0.01-lrnetlr0.003'),
    ({'local': True, 'meta_opt': 'fedadam', 'norm_bound': 2.5}, {'meta_grad': 'fomaml', 'hessian': 'exact', 'fixed_beta': 0.3, 'beta_init': 0.25, 'client_bn': 'running', 'ift_at': 'last-step', 'val_stats': 'test-batch', 'lr_bnnet': 0.01, 'base_lr': 0.01}, 'l2p-fomaml-adam-binit0.25-runningbn-valtbs-bnnetlr0.01-nb2.5'),
    ({'nets': 'lrnet', 'aggregator': 'trimmed-mean'}, {'hessian': 'exact', 'fixed_beta': 0.3, 'eta_grad': 'ift', 'client_bn': 'running', 'lr_bnnet': 0.0}, 'fedl2p-exact-lrnet-b0.3-etaift-runningbn-bnnetlr0-trim'),
    ({'local': True, 'meta_opt': 'fedadam', 'seed': 7, 'norm_bound': 2.5, 'aggregator': 'median'}, {'meta_grad': 'fomaml', 'fixed_beta': 0.3, 'hidden_bias': 'zero', 'init_gain': 1.0, 'client_bn': 'running', 'eta_nonneg': True, 'lr_lrnet': 0.003}, 'l2p-fomaml-adam-zerobias-gain1-runningbn-etapos-lrnetlr0.003-median-nb2.5-seed7'),
    ({'nets': 'bnnet', 'keep': 'last', 'seed': 7, 'norm_bound': 3.0}, {'eta_bound': 0.0, 'init_gain': 1.0, 'ift_at': 'last-step', 'eta_nonneg': True, 'epochs': 2}, 'fedl2p-bnnet-etab0-last-gain1-laststep-etapos-nb3-seed7'),
    ({'aggregator': 'median'}, {'eta_bound': 0.0, 'eta_grad': 'ift', 'beta_init': 0.25, 'eta_nonneg': True}, 'fedl2p-etab0-etaift-binit0.25-etapos-median'),
    ({'nets': 'lrnet', 'norm_bound': 3.0}, {'psi_power': 0, 'scale_by_psi': False, 'client_bn': 'running', 'ift_at': 'last-step', 'eta_nonneg': True, 'lr_lrnet': 0.003, 'lr_eta': 0.001, 'epochs': 2, 'psi': 0.05, 'base_lr': 0.01}, 'fedl2p-lrnet-b1-psifixed-unscaled-runningbn-laststep-etapos-lrnetlr0.003-etalr0.001-nb3'),
    ({'local': True, 'meta_opt': 'fedadam', 'keep': 'last'}, {'meta_grad': 'fomaml', 'hessian': 'exact', 'eta_grad': 'ift', 'hidden_bias': 'zero', 'client_bn': 'running', 'val_stats': 'test-batch', 'lr_lrnet': 0.003, 'psi': 0.05}, 'l2p-fomaml-adam-zerobias-runningbn-valtbs-lrnetlr0.003'),
    ({'nets': 'bnnet', 'keep': 'last', 'norm_bound': 3.0}, {'meta_grad': 'fomaml', 'eta_grad': 'ift', 'lr_bnnet': 0.01, 'lr_lrnet': 0.003, 'lr_eta': 0.001, 'epochs': 2}, 'fedl2p-fomaml-bnnet-last-bnnetlr0.01-lrnetlr0.003-etalr0.001-nb3'),
    ({'input_norm': 'standardize', 'meta_opt': 'fedadam'}, {'fixed_beta': 0.3, 'hidden_bias': 'zero', 'beta_init': 0.25, 'init_gain': 1.0, 'ift_at': 'last-step', 'lr_bnnet': 0.0}, 'fedl2p-std-adam-zerobias-binit0.25-gain1-laststep-bnnetlr0'),
    ({'input_norm': 'standardize', 'seed': 7, 'norm_bound': 3.0}, {'meta_grad': 'fomaml', 'fixed_beta': 0.3, 'psi_power': 5, 'hidden_bias': 'zero', 'eta_nonneg': True, 'lr_eta': 0.001, 'epochs': 2, 'psi': 0.05}, 'fedl2p-fomaml-std-zerobias-etapos-etalr0.001-nb3-seed7'),
    ({'local': True, 'seed': 1, 'aggregator': 'trimmed-mean'}, {'fixed_beta': 0.0, 'eta_bound': 0.0, 'eta_grad': 'ift', 'beta_output': 'sigmoid', 'lr_eta': 0.001, 'base_lr': 0.01}, 'l2p-etab0-etaift-sigmoid-etalr0.001-trim-seed1'),
    ({'nets': 'bnnet', 'input_norm': 'standardize', 'seed': 7, 'norm_bound': 3.0}, {'hessian': 'exact', 'fixed_beta': 0.3, 'eta_bound': 2.5, 'hidden_bias': 'zero', 'client_bn': 'running', 'ift_at': 'last-step', 'beta_output': 'sigmoid', 'epochs': 2}, 'fedl2p-exact-bnnet-etab2.5-std-zerobias-runningbn-laststep-sigmoid-nb3-seed7'),
    ({'nets': 'bnnet', 'local': True, 'seed': 1, 'aggregator': 'trimmed-mean'}, {'hessian': 'exact', 'fixed_beta': 0.0, 'psi_power': 0, 'eta_bound': 0.0, 'eta_grad': 'ift', 'init_gain': 0.25, 'ift_at': 'last-step', 'lr_lrnet': 0.003, 'lr_eta': 0.001, 'q': 5, 'base_lr': 0.01}, 'l2p-exact-bnnet-psifixed-etab0-etaift-gain0.25-laststep-lrnetlr0.003-etalr0.001-trim-seed1'),
    ({'meta_opt': 'fedadam', 'keep': 'last', 'seed': 7, 'norm_bound': 3.0}, {'meta_grad': 'fomaml', 'fixed_beta': 0.0, 'scale_by_psi': False, 'init_gain': 0.25, 'beta_output': 'sigmoid', 'q': 5, 'psi': 0.05}, 'fedl2p-fomaml-adam-last-gain0.25-sigmoid-nb3-seed7'),
    ({'local': True}, {'eta_grad': 'ift', 'hidden_bias': 'zero', 'init_gain': 0.25, 'client_bn': 'running', 'val_stats': 'test-batch', 'beta_output': 'sigmoid', 'q': 5}, 'l2p-etaift-zerobias-gain0.25-runningbn-valtbs-sigmoid'),
    ({'meta_opt': 'fedadam', 'seed': 7, 'aggregator': 'trimmed-mean'}, {'meta_grad': 'fomaml', 'psi_power': 5, 'eta_grad': 'ift', 'init_gain': 0.25, 'lr_bnnet': 0.01, 'lr_eta': 0.001, 'q': 5}, 'fedl2p-fomaml-adam-gain0.25-bnnetlr0.01-etalr0.001-trim-seed7'),
    ({'meta_opt': 'fedadam', 'keep': 'last', 'norm_bound': 3.0, 'aggregator': 'trimmed-mean'}, {'meta_grad': 'fomaml', 'hessian': 'exact', 'beta_init': 0.25, 'init_gain': 1.0, 'eta_nonneg': True, 'epochs': 2, 'psi': 0.05}, 'fedl2p-fomaml-adam-last-binit0.25-gain1-etapos-trim-nb3'),
    ({'keep': 'last'}, {'meta_grad': 'fomaml', 'fixed_beta': 0.0, 'hidden_bias': 'zero', 'init_gain': 0.25, 'ift_at': 'last-step', 'epochs': 2}, 'fedl2p-fomaml-last-zerobias-gain0.25'),
    ({'local': True, 'keep': 'last', 'aggregator': 'trimmed-mean'}, {'meta_grad': 'fomaml', 'eta_grad': 'ift', 'client_bn': 'running', 'epochs': 2}, 'l2p-fomaml-runningbn-trim'),
    ({'nets': 'lrnet', 'local': True}, {'fixed_beta': 0.0, 'psi_power': 5, 'eta_grad': 'ift', 'ift_at': 'last-step', 'val_stats': 'test-batch', 'epochs': 2}, 'l2p-lrnet-b0-psipow5-etaift-laststep-valtbs'),
    ({'nets': 'bnnet'}, {'hessian': 'exact', 'beta_init': 0.9, 'client_bn': 'running', 'lr_bnnet': 0.0, 'lr_eta': 0.001, 'epochs': 2, 'q': 5, 'psi': 0.05}, 'fedl2p-exact-bnnet-binit0.9-runningbn-bnnetlr0-etalr0.001'),
    ({'input_norm': 'standardize', 'keep': 'last', 'aggregator': 'median'}, {'beta_init': 0.9, 'ift_at': 'last-step', 'val_stats': 'test-batch', 'eta_nonneg': True, 'lr_eta': 0.001, 'q': 5}, 'fedl2p-std-last-binit0.9-laststep-valtbs-etapos-etalr0.001-median'),
    ({'aggregator': 'trimmed-mean'}, {'meta_grad': 'fomaml', 'hessian': 'exact', 'hidden_bias': 'zero', 'client_bn': 'running', 'ift_at': 'last-step', 'base_lr': 0.01}, 'fedl2p-fomaml-zerobias-runningbn-trim'),
    ({'input_norm': 'standardize', 'norm_bound': 3.0}, {'meta_grad': 'fomaml', 'eta_grad': 'ift', 'beta_init': 0.9, 'lr_lrnet': 0.003, 'lr_eta': 0.001, 'psi': 0.05}, 'fedl2p-fomaml-std-binit0.9-lrnetlr0.003-etalr0.001-nb3'),
    ({}, {'hessian': 'exact', 'eta_bound': 2.5, 'beta_init': 0.25, 'init_gain': 1.0, 'beta_output': 'sigmoid', 'lr_lrnet': 0.003}, 'fedl2p-exact-etab2.5-binit0.25-gain1-sigmoid-lrnetlr0.003'),
    ({'input_norm': 'standardize', 'keep': 'last'}, {'meta_grad': 'fomaml', 'psi_power': 5, 'eta_grad': 'ift', 'eta_nonneg': True, 'lr_lrnet': 0.003}, 'fedl2p-fomaml-std-last-etapos-lrnetlr0.003'),
    ({'nets': 'bnnet', 'local': True, 'seed': 7, 'aggregator': 'median'}, {'eta_bound': 0.0, 'beta_init': 0.25, 'init_gain': 1.0, 'eta_nonneg': True, 'beta_output': 'sigmoid', 'psi': 0.05}, 'l2p-bnnet-etab0-binit0.25-gain1-etapos-sigmoid-median-seed7'),
    ({'keep': 'last', 'norm_bound': 2.5}, {'meta_grad': 'fomaml', 'fixed_beta': 0.3, 'psi_power': 5, 'eta_bound': 0.0, 'eta_grad': 'ift', 'client_bn': 'running', 'beta_output': 'sigmoid', 'lr_eta': 0.001, 'base_lr': 0.01}, 'fedl2p-fomaml-last-runningbn-sigmoid-etalr0.001-nb2.5'),
    ({}, {'hessian': 'exact', 'fixed_beta': 0.0, 'psi_power': 5, 'ift_at': 'last-step', 'val_stats': 'test-batch', 'lr_lrnet': 0.003}, 'fedl2p-exact-psipow5-laststep-valtbs-lrnetlr0.003'),
    ({'input_norm': 'standardize', 'keep': 'last'}, {'init_gain': 0.25, 'val_stats': 'test-batch', 'eta_nonneg': True, 'beta_output': 'sigmoid', 'psi': 0.05}, 'fedl2p-std-last-gain0.25-valtbs-etapos-sigmoid'),
    ({'input_norm': 'standardize', 'meta_opt': 'fedadam'}, {'meta_grad': 'fomaml', 'eta_grad': 'ift', 'beta_init': 0.9, 'client_bn': 'running', 'ift_at': 'last-step', 'val_stats': 'test-batch', 'lr_bnnet': 0.01, 'lr_lrnet': 0.003, 'base_lr': 0.01}, 'fedl2p-fomaml-std-adam-binit0.9-runningbn-valtbs-bnnetlr0.01-lrnetlr0.003'),
    ({'meta_opt': 'fedadam', 'seed': 1}, {'fixed_beta': 0.0, 'eta_bound': 0.0, 'eta_nonneg': True, 'epochs': 2}, 'fedl2p-etab0-adam-etapos-seed1'),
    ({'local': True, 'seed': 1, 'aggregator': 'median'}, {'hessian': 'exact', 'psi_power': 5, 'scale_by_psi': False, 'init_gain': 0.25, 'q': 5, 'psi': 0.05}, 'l2p-exact-psipow5-unscaled-gain0.25-median-seed1'),
    ({'input_norm': 'standardize', 'meta_opt': 'fedadam', 'seed': 7}, {'hessian': 'exact', 'psi_power': 0, 'scale_by_psi': False, 'eta_bound': 2.5, 'eta_grad': 'ift', 'init_gain': 1.0, 'epochs': 2}, 'fedl2p-exact-psifixed-unscaled-etab2.5-etaift-std-adam-gain1-seed7'),
    ({'nets': 'lrnet', 'local': True, 'meta_opt': 'fedadam', 'norm_bound': 2.5}, {'eta_bound': 0.0, 'hidden_bias': 'zero', 'client_bn': 'running', 'ift_at': 'last-step', 'beta_output': 'sigmoid', 'psi': 0.05}, 'l2p-lrnet-b1-etab0-adam-zerobias-runningbn-laststep-sigmoid-nb2.5'),
    ({'nets': 'bnnet', 'norm_bound': 2.5}, {'eta_grad': 'ift', 'beta_init': 0.25, 'lr_bnnet': 0.01, 'lr_lrnet': 0.003, 'psi': 0.05}, 'fedl2p-bnnet-etaift-binit0.25-bnnetlr0.01-lrnetlr0.003-nb2.5'),
    ({'local': True, 'keep': 'last'}, {'hessian': 'exact', 'psi_power': 5, 'scale_by_psi': False, 'lr_bnnet': 0.01, 'lr_lrnet': 0.003, 'psi': 0.05}, 'l2p-exact-psipow5-unscaled-bnnetlr0.01-lrnetlr0.003'),
    ({'nets': 'lrnet', 'seed': 1, 'norm_bound': 3.0, 'aggregator': 'median'}, {'fixed_beta': 0.0, 'client_bn': 'running', 'ift_at': 'last-step', 'eta_nonneg': True}, 'fedl2p-lrnet-b0-runningbn-laststep-etapos-median-nb3-seed1'),
    ({'norm_bound': 3.0, 'aggregator': 'median'}, {'scale_by_psi': False, 'eta_grad': 'ift', 'hidden_bias': 'zero', 'client_bn': 'running', 'ift_at': 'last-step', 'beta_output': 'sigmoid', 'q': 5}, 'fedl2p-unscaled-etaift-zerobias-runningbn-laststep-sigmoid-median-nb3'),
    ({'nets': 'lrnet'}, {'fixed_beta': 0.3, 'psi_power': 5, 'eta_bound': 0.0, 'beta_init': 0.9, 'val_stats': 'test-batch', 'eta_nonneg': True, 'lr_lrnet': 0.003}, 'fedl2p-lrnet-b0.3-psipow5-etab0-binit0.9-valtbs-etapos-lrnetlr0.003'),
    ({'nets': 'bnnet', 'input_norm': 'standardize'}, {'psi_power': 5, 'eta_bound': 0.0, 'eta_grad': 'ift', 'lr_lrnet': 0.003, 'epochs': 2}, 'fedl2p-bnnet-psipow5-etab0-etaift-std-lrnetlr0.003'),
    ({'seed': 7}, {'hessian': 'exact', 'psi_power': 0, 'eta_bound': 0.0, 'client_bn': 'running', 'val_stats': 'test-batch', 'eta_nonneg': True, 'beta_output': 'sigmoid', 'lr_bnnet': 0.01, 'lr_lrnet': 0.003, 'lr_eta': 0.001, 'q': 5}, 'fedl2p-exact-psifixed-etab0-runningbn-valtbs-etapos-sigmoid-bnnetlr0.01-lrnetlr0.003-etalr0.001-seed7'),
    ({}, {'scale_by_psi': False, 'beta_init': 0.25, 'client_bn': 'running', 'val_stats': 'test-batch', 'beta_output': 'sigmoid'}, 'fedl2p-unscaled-binit0.25-runningbn-valtbs-sigmoid'),
    ({'nets': 'bnnet', 'local': True, 'meta_opt': 'fedadam', 'aggregator': 'median'}, {'eta_bound': 0.0, 'eta_grad': 'ift', 'hidden_bias': 'zero', 'client_bn': 'running', 'eta_nonneg': True, 'beta_output': 'sigmoid', 'lr_eta': 0.001}, 'l2p-bnnet-etab0-etaift-adam-zerobias-runningbn-etapos-sigmoid-etalr0.001-median'),
    ({'seed': 7}, {'eta_bound': 2.5, 'eta_grad': 'ift', 'hidden_bias': 'zero', 'beta_init': 0.9, 'init_gain': 1.0, 'ift_at': 'last-step', 'lr_bnnet': 0.0, 'q': 5}, 'fedl2p-etab2.5-etaift-zerobias-binit0.9-gain1-laststep-bnnetlr0-seed7'),
    ({'meta_opt': 'fedadam', 'keep': 'last', 'aggregator': 'median'}, {'hessian': 'exact', 'eta_bound': 0.0, 'hidden_bias': 'zero', 'beta_init': 0.9, 'val_stats': 'test-batch', 'lr_bnnet': 0.01, 'lr_lrnet': 0.003, 'lr_eta': 0.001}, 'fedl2p-exact-etab0-adam-last-zerobias-binit0.9-valtbs-bnnetlr0.01-lrnetlr0.003-etalr0.001-median'),
    ({'local': True, 'meta_opt': 'fedadam', 'seed': 7, 'norm_bound': 2.5}, {'fixed_beta': 0.0, 'psi_power': 5, 'hidden_bias': 'zero', 'val_stats': 'test-batch', 'eta_nonneg': True, 'beta_output': 'sigmoid', 'lr_bnnet': 0.0, 'lr_eta': 0.001, 'base_lr': 0.01}, 'l2p-psipow5-adam-zerobias-valtbs-etapos-sigmoid-bnnetlr0-etalr0.001-nb2.5-seed7'),
    ({'input_norm': 'standardize', 'meta_opt': 'fedadam', 'keep': 'last', 'norm_bound': 3.0}, {'hessian': 'exact', 'fixed_beta': 0.3, 'scale_by_psi': False, 'eta_bound': 0.0, 'beta_init': 0.25, 'lr_eta': 0.001, 'epochs': 2, 'base_lr': 0.01}, 'fedl2p-exact-unscaled-etab0-std-adam-last-binit0.25-etalr0.001-nb3'),
    ({'input_norm': 'standardize', 'meta_opt': 'fedadam', 'norm_bound': 2.5}, {'meta_grad': 'fomaml', 'init_gain': 1.0, 'psi': 0.05}, 'fedl2p-fomaml-std-adam-gain1-nb2.5'),
    ({'nets': 'lrnet', 'local': True, 'input_norm': 'standardize', 'keep': 'last', 'aggregator': 'median'}, {'hessian': 'exact', 'scale_by_psi': False, 'eta_grad': 'ift', 'hidden_bias': 'zero', 'beta_init': 0.25, 'val_stats': 'test-batch', 'epochs': 2, 'base_lr': 0.01}, 'l2p-exact-lrnet-b1-unscaled-etaift-std-zerobias-binit0.25-valtbs-median'),
    ({}, {'psi_power': 0, 'scale_by_psi': False, 'init_gain': 1.0, 'client_bn': 'running', 'lr_eta': 0.001, 'base_lr': 0.01}, 'fedl2p-psifixed-unscaled-gain1-runningbn-etalr0.001'),
    ({'local': True}, {'scale_by_psi': False, 'hidden_bias': 'zero', 'beta_init': 0.9, 'ift_at': 'last-step', 'beta_output': 'sigmoid', 'epochs': 2}, 'l2p-unscaled-zerobias-binit0.9-laststep-sigmoid'),
    ({'input_norm': 'standardize', 'aggregator': 'median'}, {'beta_output': 'sigmoid', 'lr_bnnet': 0.01, 'lr_lrnet': 0.003, 'lr_eta': 0.001, 'base_lr': 0.01}, 'fedl2p-std-sigmoid-bnnetlr0.01-lrnetlr0.003-etalr0.001-median'),
    ({}, {'ift_at': 'last-step', 'val_stats': 'test-batch', 'eta_nonneg': True, 'lr_eta': 0.001}, 'fedl2p-laststep-valtbs-etapos-etalr0.001'),
    ({'local': True, 'aggregator': 'trimmed-mean'}, {'meta_grad': 'fomaml', 'scale_by_psi': False, 'eta_bound': 2.5, 'hidden_bias': 'zero', 'beta_init': 0.25, 'ift_at': 'last-step', 'val_stats': 'test-batch', 'beta_output': 'sigmoid', 'lr_lrnet': 0.003, 'q': 5, 'psi': 0.05}, 'l2p-fomaml-zerobias-binit0.25-valtbs-sigmoid-lrnetlr0.003-trim'),
    ({'local': True, 'input_norm': 'standardize', 'meta_opt': 'fedadam', 'keep': 'last'}, {'meta_grad': 'fomaml', 'hidden_bias': 'zero', 'init_gain': 0.25, 'client_bn': 'running', 'eta_nonneg': True, 'lr_lrnet': 0.003}, 'l2p-fomaml-std-adam-zerobias-gain0.25-runningbn-etapos-lrnetlr0.003'),
    ({'nets': 'bnnet', 'local': True, 'input_norm': 'standardize', 'meta_opt': 'fedadam', 'keep': 'last', 'seed': 1, 'norm_bound': 2.5}, {'fixed_beta': 0.3, 'psi_power': 0, 'lr_lrnet': 0.003, 'epochs': 2, 'psi': 0.05}, 'l2p-bnnet-psifixed-std-adam-lrnetlr0.003-nb2.5-seed1'),
    ({'keep': 'last'}, {'meta_grad': 'fomaml', 'hidden_bias': 'zero', 'beta_init': 0.25, 'init_gain': 1.0, 'client_bn': 'running', 'ift_at': 'last-step', 'beta_output': 'sigmoid', 'epochs': 2, 'psi': 0.05}, 'fedl2p-fomaml-last-zerobias-binit0.25-gain1-runningbn-sigmoid'),
    ({'input_norm': 'standardize', 'meta_opt': 'fedadam', 'aggregator': 'trimmed-mean'}, {'beta_init': 0.25, 'init_gain': 1.0, 'val_stats': 'test-batch', 'beta_output': 'sigmoid', 'lr_bnnet': 0.01}, 'fedl2p-std-adam-binit0.25-gain1-valtbs-sigmoid-bnnetlr0.01-trim'),
    ({'meta_opt': 'fedadam', 'keep': 'last', 'norm_bound': 2.5, 'aggregator': 'median'}, {'meta_grad': 'fomaml', 'hidden_bias': 'zero', 'client_bn': 'running', 'q': 5}, 'fedl2p-fomaml-adam-last-zerobias-runningbn-median-nb2.5'),
    ({'seed': 7, 'aggregator': 'trimmed-mean'}, {'hessian': 'exact', 'eta_grad': 'ift', 'ift_at': 'last-step', 'val_stats': 'test-batch', 'beta_output': 'sigmoid', 'lr_lrnet': 0.003, 'lr_eta': 0.001, 'q': 5, 'base_lr': 0.01}, 'fedl2p-exact-etaift-laststep-valtbs-sigmoid-lrnetlr0.003-etalr0.001-trim-seed7'),
    ({'meta_opt': 'fedadam'}, {'meta_grad': 'fomaml', 'scale_by_psi': False, 'eta_grad': 'ift', 'beta_output': 'sigmoid', 'lr_lrnet': 0.003, 'epochs': 2, 'psi': 0.05, 'base_lr': 0.01}, 'fedl2p-fomaml-adam-sigmoid-lrnetlr0.003'),
    ({'nets': 'bnnet', 'input_norm': 'standardize'}, {'scale_by_psi': False, 'init_gain': 1.0, 'ift_at': 'last-step', 'val_stats': 'test-batch', 'eta_nonneg': True, 'base_lr': 0.01}, 'fedl2p-bnnet-unscaled-std-gain1-laststep-valtbs-etapos'),
]


def test_the_cases_are_the_ones_the_golden_table_was_captured_over():
    assert [(t, m) for t, m, _ in GOLDEN] == cases()


@pytest.mark.parametrize("top,meta,want", GOLDEN, ids=[w for _, _, w in GOLDEN])
def test_every_variant_name_is_byte_identical_to_the_hand_written_grammar(top, meta, want):
    assert MetaTrainConfig.preset("paper", **top, **meta).variant() == want


def test_the_default_run_is_named_by_its_preset_and_the_others_word_by_word():
    """The defaults are the learn preset: one word, then each option that differs from the preset's value. A run
    off any named preset is spelled against the paper's values, as every name before the presets was."""
    assert MetaTrainConfig().variant() == "fedl2p-learn"
    assert MetaTrainConfig(seed=1).variant() == "fedl2p-learn-seed1"
    assert MetaTrainConfig(keep="best").variant() == "fedl2p-fomaml-trajbn-rstd-log-bnnetlr0.01-lrnetlr0.01-eqw"
    assert MetaTrainConfig.preset("fomaml").variant() == "fedl2p-fomaml-binit0.9"
    assert MetaTrainConfig.preset("fomaml", seed=1, keep="last").variant() == "fedl2p-fomaml-last-binit0.9-seed1"
    assert MetaTrainConfig.preset("paper").variant() == "fedl2p"
    assert MetaTrainConfig().spelled() == "fedl2p-fomaml-trajbn-rstd-last-log-bnnetlr0.01-lrnetlr0.01-eqw"


def test_a_personalisation_with_test_batch_statistics_tags_its_learned_rows():
    assert variant_words(PersonalizeConfig()) == []
    assert variant_words(PersonalizeConfig(eval_stats="test-batch", epochs=2, seeds=[4])) == ["tbs"]


def test_bench_finds_variants_by_config_not_by_name():
    sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
    from dataclasses import asdict

    import accuracy
    assert accuracy.is_stable_ift(asdict(MetaTrainConfig.preset("paper", seed=2, rounds=5)))
    for other in (MetaTrainConfig.preset("paper", local=True), MetaTrainConfig.preset("fomaml", meta_grad="ift"),
                  MetaTrainConfig.preset("paper", keep="last"), MetaTrainConfig()):
        assert not accuracy.is_stable_ift(asdict(other))
    v = {"mean": 0.5, "sd": 0.1}
    merged = accuracy.over_meta_seeds({"fedl2p": v, "fedl2p-seed1": v | {"mean": 0.7}, "fedl2p-tbs": v, "ft-bnc": v},
                                      {"fedl2p": "fedl2p", "fedl2p-seed1": "fedl2p"})
    assert merged["fedl2p"]["meta_seeds"] == 2 and merged["fedl2p"]["mean"] == pytest.approx(0.6)
    assert merged["fedl2p-tbs"]["meta_seeds"] == 1 and merged["ft-bnc"] is v
