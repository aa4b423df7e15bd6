
from fedl2p_cli.stages import pipeline
from fedl2p_cli.stages.common import NoProgress

TOML = """
name = "tiny"
[partition]
dataset = "digits-c"
alpha = 0.5
clients = 12
samples_per_client = 40
unseen_fraction = 0.25
corruptions = ["clean", "invert", "contrast"]
severity = 4
[pretrain]
rounds = 2
fraction = 0.5
batch_size = 16
[stats]
[[meta-train]]
rounds = 2
fraction = 0.5
epochs = 1
batch_size = 16
base_lr = 0.01
[[pfl]]
algo = "cafeme"
rounds = 2
fraction = 0.5
batch_size = 16
[personalize]
pools = ["seen", "unseen"]
epochs = 1
batch_size = 16
base_lr = 0.01
seeds = [0]
[analyze]
pool = "seen"
"""


def test_second_run_reuses_everything(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text(TOML)
    first = pipeline.run(pipeline.load(f, tmp_path / "store"), None, NoProgress)
    assert [r.stage for r in first] == ["partition", "pretrain", "stats", "meta-train", "pfl", "personalize", "analyze",
                                        "personalize"]
    assert all("pfl:cafeme" in r.artifact.parents for r in first if r.stage == "personalize")
    assert not any(r.reused for r in first)
    second = pipeline.run(pipeline.load(f, tmp_path / "store"), None, NoProgress)
    assert all(r.reused for r in second) and [r.artifact.id for r in first] == [r.artifact.id for r in second]
    forced = pipeline.run(pipeline.load(f, tmp_path / "store"), "personalize", NoProgress)
    assert [r.reused for r in forced] == [True] * 5 + [False] * 3


def test_unknown_key_is_one_clear_error(tmp_path):
    import pytest

    from fedl2p_cli.errors import FedL2PError
    f = tmp_path / "p.toml"
    f.write_text(TOML.replace("rounds = 2\nfraction = 0.5\nbatch_size = 16", "rounds = 2\nfraktion = 0.5", 1))
    with pytest.raises(FedL2PError, match="unknown key 'fraktion' in \\[pretrain\\]"):
        pipeline.run(pipeline.load(f, tmp_path / "store"), None, NoProgress)

