"""The defaults moved twice: from the paper's meta-gradient and beta init (ift, 0.5) to FOMAML+ from 0.9 (now
`--preset fomaml`), then to the learn preset. Ids and variant names are measured against the paper's values
(`opt(..., reference=...)`, core/config.reference_of), so no artifact made before a move changes id, and an
artifact's stored settings read back as what it was made with. The pins below were computed by the code before the
first move."""

import dataclasses
import hashlib
from pathlib import Path

from fedl2p_cli import plugins
from fedl2p_cli.artifacts import canonical_json
from fedl2p_cli.configs import MetaTrainConfig
from fedl2p_cli.core.settings import MetaConfig
from fedl2p_cli.stage_table import stage
from fedl2p_cli.stages import meta_train, pipeline_files
from fedl2p_cli.stages.interface import SectionFile, default_plan

ROOT = Path(__file__).resolve().parents[1]
# sha256 of an identity (what a meta-train id hashes, its parents aside), from the code before the defaults moved
BEFORE = {("ift", 0.5): "8ec39b56e777cb98", ("fomaml", 0.5): "777ac555ee152855", ("fomaml", 0.9): "2b5c0cf828bd4e50"}
# the same over every [[meta-train]] table of every shipped pipeline file (139 runs in 40 files). A deliberate change
# to a shipped file's runs moves it: update it then, and say why in the commit
# issue 79: quickstart.toml meta-trains at the new defaults (the learn preset); every other run, quickstart-planted's
# included, keeps its id (the shipped files name `preset = "fomaml"`, quickstart-planted held the learn values already)
PIPELINES = "b4cafb44b8d8bc92"
# files shipped after the pin (issue 60's planted family): their runs are new artifacts, nothing to keep
ADDED = {f"pipelines/bench/planted-{k}.toml" for k in ("invert", "3kinds", "blur", "4kinds")}


def digest(obj) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:16]


def test_every_run_keeps_the_identity_it_had_before_the_defaults_moved():
    for (grad, b0), want in BEFORE.items():
        assert digest(meta_train.identity(MetaTrainConfig.preset("paper", meta_grad=grad, beta_init=b0))) == want


def test_the_fomaml_preset_is_the_artifact_the_default_was_and_the_paper_preset_the_papers():
    cfg = MetaTrainConfig.preset("fomaml")
    assert (cfg.meta.meta_grad, cfg.meta.beta_init) == ("fomaml", 0.9)
    assert digest(meta_train.identity(cfg)) == BEFORE[("fomaml", 0.9)]
    assert cfg.variant() == "fedl2p-fomaml-binit0.9"
    assert digest(meta_train.identity(MetaTrainConfig.preset("paper"))) == BEFORE[("ift", 0.5)]


def test_the_default_is_the_learn_preset_and_its_id_is_named_word_by_word():
    """The learn preset's one word names the variant; the id hashes the name spelled word by word, so a preset naming
    a set of values never moves an id (a run given the same values one by one is the same artifact)."""
    cfg = MetaTrainConfig()
    assert cfg == MetaTrainConfig.preset("learn")
    assert cfg.variant() == "fedl2p-learn"
    assert meta_train.identity(cfg)["variant"] == cfg.spelled() != cfg.variant()
    spelled = MetaTrainConfig.preset("fomaml", head="log", lr_grad="trajectory-bn", input_norm="robust",
                                     client_weights="equal", beta_init=0.5, lr_bnnet=0.01, lr_lrnet=0.01, keep="last")
    assert digest(meta_train.identity(spelled)) == digest(meta_train.identity(cfg))


def shipped_identities() -> dict:
    out = {}
    for f in sorted(ROOT.glob("pipelines/**/*.toml")):
        if f.name.startswith("_"):
            continue
        file = SectionFile(pipeline_files.resolve(f), f.name, plugins.current())
        cfgs = [p.config for p in default_plan(stage("meta-train"), meta_train, file)]
        out[str(f.relative_to(ROOT))] = [canonical_json(meta_train.identity(c)) for c in cfgs]
    return out


def test_every_shipped_pipeline_builds_the_meta_train_artifacts_it_built_before():
    found = {k: v for k, v in shipped_identities().items() if k not in ADDED}
    assert sum(len(v) for v in found.values()) == 139
    assert digest(found) == PIPELINES


def test_a_stored_config_reads_back_as_made_not_as_todays_default():
    """An id leaves beta_init out at 0.5; reading that artifact's settings back must give 0.5, not the new 0.9
    (personalize rebuilds its meta-nets and decompose its fixed beta from them)."""
    old = meta_train.identity(MetaTrainConfig.preset("paper"))
    assert "beta_init" not in old["meta"] and "head" not in old["meta"] and "meta_signal" not in old["meta"]
    back = meta_train.config_from_dict(old)
    assert (back.meta.beta_init, back.meta.head, back.meta.meta_signal, back.client_weights) == (0.5, "paper", "loss",
                                                                                                 "samples")
    new = meta_train.identity(MetaTrainConfig.preset("fomaml"))
    assert meta_train.config_from_dict(new).meta.beta_init == 0.9
    full = dataclasses.asdict(MetaTrainConfig(meta=MetaConfig(beta_init=0.3)))  # a run config: every key present
    assert meta_train.config_from_dict(full).meta.beta_init == 0.3
