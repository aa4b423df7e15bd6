"""The stage table: every stage once, in pipeline order, with what the store, the pipeline compiler, the report and
the command line need to know about it. Nothing else in the package lists the stages (tests/test_layout.py checks).

Torch-free and free of the stage modules, beside the store (artifacts.py) that reads it, so no import runs up from
the store, the report or `fedl2p --help` into stages/. One object holds it (`TABLE`); the rest of the package reads
it at call time, never a copy made at import, and a pipeline may be given another (`TABLE.with_row`: a stage added
without touching any module's names)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from . import configs


@dataclass(frozen=True)
class Stage:
    name: str  # the store's folder and each artifact's `stage`; a pipeline file's section of the same name
    configs: dict[str, type] = field(default_factory=dict)  # its config type; analyze: one per `analysis`
    command: str | None = None  # its `fedl2p` command (None: the stage has none of its own)
    cli: str | None = None  # "module:attribute" of the command: a function, or a typer app for a group of commands
    help: str = ""  # its line in `fedl2p --help`
    example: str = ""  # the example its --help ends with
    section: bool = True  # a pipeline file may have a section of its name
    required: bool = False  # ... and must
    repeated: bool = False  # ... given as [[name]]: one table per artifact
    trains: bool = False  # federated rounds: the report's training table
    method: bool = False  # an artifact of it is a personalisation method (personalize's learned and pFL rows)
    label: tuple[str, str] | None = None  # (config or metrics, key): the short name of one of its artifacts
    colour: str = "#fff"  # its boxes in the report's lineage graph
    module: str | ModuleType | None = None  # the module that runs it (`execute(cfg, inputs, ctx)`, stages/interface.py):
    # its name, or the module itself for a stage defined outside the package (a test's)
    parents: tuple[str, ...] = ()  # the stages whose artifacts a pipeline's step of it reads (its default plan; the
    # compiler refuses a step that reads another, stages/pipeline.py `undeclared_reads`)
    implied: bool = False  # a pipeline runs it with its defaults where the file has no section of it
    reader: str | None = None  # "module:function": one of its artifacts -> what it wrote, as a later stage reads it
    # (`inputs.get(name).value`, stages/interface.py); None: no stage reads it

    def config_type(self, config: dict[str, Any]) -> type | None:
        """The config class an artifact's config was made from (None: a stage without one)."""
        return self.configs.get(config.get("analysis", "")) if "analysis" in config else self.configs.get("")


@dataclass(frozen=True)
class Table:
    """The stages in pipeline order."""
    rows: tuple[Stage, ...]

    @property
    def names(self) -> tuple[str, ...]:
        """The stages' names: the store's folders, in pipeline order."""
        return tuple(s.name for s in self.rows)

    @property
    def sections(self) -> tuple[str, ...]:
        """A pipeline file's stage sections, in order."""
        return tuple(s.name for s in self.rows if s.section)

    def stage(self, name: str) -> Stage:
        """The stage of this name (KeyError: none; the store and the CLI refuse unknown names before asking)."""
        for s in self.rows:
            if s.name == name:
                return s
        raise KeyError(name)

    def with_row(self, row: Stage, before: str) -> Table:
        """This table with `row` added before the stage `before`."""
        at = self.names.index(before)
        return Table((*self.rows[:at], row, *self.rows[at:]))


TABLE = Table((
    Stage("partition", {"": configs.PartitionConfig}, "partition", "fedl2p_cli.cli.partition:partition",
          "1. Split a dataset into clients -> partition.h5.",
          "fedl2p partition --dataset fmnist-c --alpha 0.1 --clients 70",
          required=True, label=("config", "dataset"), colour="#ddf4ff", module="fedl2p_cli.stages.partition",
          reader="fedl2p_cli.stages.partition:read"),
    Stage("pretrain", {"": configs.PretrainConfig}, "pretrain", "fedl2p_cli.cli.pretrain:pretrain",
          "2. Pretrain the global model federatedly (or import one with --init).",
          "fedl2p pretrain --algo fedavg --rounds 40", required=True, trains=True, colour="#fff8c5",
          module="fedl2p_cli.stages.pretrain", reader="fedl2p_cli.stages.pretrain:read", parents=("partition",)),
    Stage("stats", {"": configs.StatsConfig}, "stats", "fedl2p_cli.cli.stats:stats",
          "3. Each client's data statistics under the pretrained model (the meta-nets' inputs).", "fedl2p stats",
          colour="#f6f8fa", module="fedl2p_cli.stages.stats", reader="fedl2p_cli.stages.stats:read",
          parents=("partition", "pretrain"), implied=True),
    Stage("meta-train", {"": configs.MetaTrainConfig}, "meta-train", "fedl2p_cli.cli.meta_train:meta_train",
          "4. Federatedly learn the meta-nets BNNet and LRNet (FedL2P).",
          "fedl2p meta-train --meta-grad fomaml --rounds 20", repeated=True, trains=True, method=True,
          label=("metrics", "variant"), colour="#fbefff", module="fedl2p_cli.stages.meta_train", reader="fedl2p_cli.stages.meta_train:read",
          parents=("pretrain", "stats")),
    Stage("pfl", {"": configs.PFLConfig}, "pfl-train", "fedl2p_cli.cli.pfl:pfl_train",
          "4b. Train another personalised-FL system (pFedLA, HeurpFedLA, CAFeMe, or a plugin's).", "fedl2p pfl-train --algo pfedla",
          repeated=True, trains=True, method=True, label=("config", "algo"), colour="#ffebe9",
          module="fedl2p_cli.stages.pfl", reader="fedl2p_cli.stages.pfl:read", parents=("partition",)),
    Stage("personalize", {"": configs.PersonalizeConfig}, "personalize", "fedl2p_cli.cli.personalize:personalize",
          "5. Fine-tune every client under each method and compare them.",
          "fedl2p personalize --unseen --seeds 0,1,2", label=("metrics", "pool"), colour="#dafbe1",
          module="fedl2p_cli.stages.personalize", reader="fedl2p_cli.stages.personalize:read",
          parents=("pretrain", "stats", "meta-train", "pfl")),
    Stage("analyze", {"clusters": configs.ClustersConfig, "beta-grid": configs.BetaGridConfig,
                      "decompose": configs.DecomposeConfig}, "analyze", "fedl2p_cli.cli.analyze:app",
          "6. Analyse the results (clusters of the learned strategies).", "fedl2p analyze clusters",
          label=("config", "analysis"), colour="#fff1e5", module="fedl2p_cli.stages.analyze",
          parents=("personalize", "stats")),  # stats: beta-grid's
    Stage("report", {}, "report", "fedl2p_cli.cli.report:report",
          "Write one HTML page of pipelines or artifacts (lineage, results, plots).",
          "fedl2p report quickstart quickstart-planted -o report.html", section=False,
          module="fedl2p_cli.stages.report"),
))


def stage(name: str) -> Stage:
    """The stage of this name in the table (KeyError: none)."""
    return TABLE.stage(name)
