
from fedl2p_cli import plugins
from fedl2p_cli.stages import pipeline
from fedl2p_cli.stages.common import NoProgress

from .helpers import handed

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
    first = pipeline.run(pipeline.load(f, tmp_path / "store"), None, NoProgress, runtime=handed())
    assert [r.stage for r in first] == ["partition", "pretrain", "stats", "meta-train", "pfl", "personalize", "personalize",
                                        "analyze"]  # the stage table's order
    assert all("pfl:cafeme" in r.artifact.parents for r in first if r.stage == "personalize")
    assert not any(r.reused for r in first)
    second = pipeline.run(pipeline.load(f, tmp_path / "store"), None, NoProgress, runtime=handed())
    assert all(r.reused for r in second) and [r.artifact.id for r in first] == [r.artifact.id for r in second]
    forced = pipeline.run(pipeline.load(f, tmp_path / "store"), "personalize", NoProgress, runtime=handed())
    assert [r.reused for r in forced] == [True] * 5 + [False] * 3


def test_unknown_key_is_one_clear_error(tmp_path):
    import pytest

    from fedl2p_cli.errors import FedL2PError
    f = tmp_path / "p.toml"
    f.write_text(TOML.replace("rounds = 2\nfraction = 0.5\nbatch_size = 16", "rounds = 2\nfraktion = 0.5", 1))
    with pytest.raises(FedL2PError, match="unknown key 'fraktion' in \\[pretrain\\]") as e:
        pipeline.run(pipeline.load(f, tmp_path / "store"), None, NoProgress, runtime=handed())
    assert ", engine, " in str(e.value) and ", workers)" in str(e.value)  # its runtime keys are known keys too


def test_an_unknown_key_lists_every_key_the_section_takes(tmp_path):
    """[personalize]'s known keys include its pools and runtime key, which are not fields of its config."""
    import pytest

    from fedl2p_cli.errors import FedL2PError
    f = tmp_path / "p.toml"
    f.write_text(TOML.replace("[personalize]\n", "[personalize]\nengine = \"local\"\n", 1))
    with pytest.raises(FedL2PError, match="unknown key 'engine' in \\[personalize\\]") as e:
        pipeline.run(pipeline.load(f, tmp_path / "store"), None, NoProgress, runtime=handed())
    assert ", client_batch, " in str(e.value) and ", pools, " in str(e.value)
    f.write_text(TOML.replace("[personalize]\n", "[personalize]\nunseen = true\n", 1))  # pools says which
    with pytest.raises(FedL2PError, match="takes pools = .* not unseen"):
        pipeline.run(pipeline.load(f, tmp_path / "store"), None, NoProgress, runtime=handed())



def test_a_stage_is_its_module_and_one_table_row(tmp_path):
    """A stage added between stats and meta-train: its module (execute) and a row of the stage table are all the
    pipeline needs: the section compiles, its step runs with its parent's id, and its artifact is reused. The table
    is one value the pipeline is given: adding a row patches no module's names."""
    import dataclasses
    import types

    from fedl2p_cli.core.config import opt
    from fedl2p_cli.stage_table import TABLE, Stage
    from fedl2p_cli.stages.common import build_or_reuse, config_dict

    @dataclasses.dataclass
    class CheckConfig:
        threshold: float = opt(0.5, "How much is enough.")

    seen = []

    def execute(cfg, inputs, ctx):
        stats = inputs.get("stats")  # the stats row's reader: the table the stats stage wrote
        seen.append((stats.artifact.id, len(stats.value.client)))
        return build_or_reuse(ctx.store, "check", config_dict(cfg), {"stats": stats.artifact.id},
                              lambda draft: setattr(draft, "metrics", {"threshold": cfg.threshold}), ctx.force, ctx.runtime)

    module = types.ModuleType("check_demo")
    module.execute = execute
    table = TABLE.with_row(Stage("check", {"": CheckConfig}, module=module, parents=("stats",)), before="meta-train")
    f = tmp_path / "p.toml"
    f.write_text(TOML.split("[[pfl]]")[0].replace("[[meta-train]]", "[check]\nthreshold = 0.7\n[[meta-train]]"))
    first = pipeline.run(pipeline.load(f, tmp_path / "store", table), None, NoProgress, runtime=handed())
    assert [r.stage for r in first] == ["partition", "pretrain", "stats", "check", "meta-train"]
    stats_id, check = first[2].artifact.id, first[3].artifact
    assert seen == [(stats_id, first[0].artifact.metrics["clients"])] and check.parents == {"stats": stats_id}
    assert check.metrics == {"threshold": 0.7}
    again = pipeline.run(pipeline.load(f, tmp_path / "store", table), None, NoProgress, runtime=handed())
    assert [r.reused for r in again] == [True] * 5
    assert "check" not in TABLE.names  # the package's own table is as it was


def test_a_step_reads_only_what_its_row_names(tmp_path):
    """The compiler checks a step's parents against its row's: a plan that reads a stage its row does not list is
    refused before anything runs."""
    import dataclasses

    import pytest

    from fedl2p_cli.errors import FedL2PError
    from fedl2p_cli.stage_table import TABLE, Table, stage
    from fedl2p_cli.stages.interface import Planned

    check = dataclasses.replace(stage("stats"), name="check", parents=())
    reads = Planned("check", "check", "check", None, {"stats": ("stats",), "meta-train": ("meta-train:",)})
    known = {"stats": "stats", "meta-train:0": "meta-train", "meta-train:1": "meta-train"}
    assert pipeline.undeclared_reads(check, reads, known) == ["meta-train", "stats"]
    assert pipeline.undeclared_reads(dataclasses.replace(check, parents=("stats", "meta-train")), reads, known) == []
    f = tmp_path / "p.toml"
    f.write_text(TOML)
    pipeline.compile(pipeline.load(f, tmp_path / "store"), plugins.current())  # the table's rows name what their steps read
    rows = Table(tuple(dataclasses.replace(s, parents=()) if s.name == "pretrain" else s for s in TABLE.rows))
    with pytest.raises(FedL2PError, match=r"stage pretrain: its step pretrain reads partition, which its row's parents"):
        pipeline.compile(pipeline.load(f, tmp_path / "store", rows), plugins.current())
