"""Every stage's config: one typed, documented declaration per option. `fedl2p COMMAND`'s options
(cli/generate.py), a pipeline file's keys (stages/pipeline.py) and their validation (core/config.py) all come from
these dataclasses. Torch-free, so `fedl2p --help` and refused input start fast."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal, get_args

from .core.config import (
    AT_LEAST_1,
    BELOW_1,
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    UNIT,
    ConfigError,
    Tag,
    between,
    from_flat,
    opt,
    spells_off,
    stored,
    variant_words,
)
from .core.settings import AGGREGATE_TAGS, DEFAULT_META_LR, LEARN_META_LR, ClientBNMode, EvalStats, MetaConfig

Scheme = Literal["dirichlet", "shards"]
Normalize = Literal["source", "partition"]
PFLOrder = Literal["first", "second"]
PFLOuter = Literal["adam", "sgd"]
MODEL_HELP = ("small-cnn | resnet18-cifar | resnet18 | resnet18-speech | package.module:factory (any nn.Module with "
              "BatchNorm).<plugin-models>")


@dataclass(kw_only=True)
class PartitionConfig:
    """`fedl2p partition`: how a dataset is split into clients."""
    dataset: str = opt("fmnist-c", "fmnist | fmnist-c | fmnist-r | digits | digits-c | cifar10 | cifar10-c | "
                                   "image-folder | speechcommands | speech-synth.<plugin-datasets>")
    alpha: float = opt(0.1, "Dirichlet concentration of each client's label mix (> 0; 1000 is ~IID, 0.1 very skewed).",
                       POSITIVE)
    # added after partitions existed: left out of the id at their defaults, so existing partitions keep theirs
    scheme: Scheme = opt("dirichlet", "dirichlet = each client's labels ~ Dir(alpha) (FedL2P) | shards = "
                                      "--shard-classes classes per client in equal amounts.", identity_default=True)
    shard_classes: int = opt(4, "Classes per client with --scheme shards (pFedLA: 4; CAFeMe: 2).", between(1),
                             identity_default=True)
    clients: int = opt(70, "Number of clients, split evenly across domains (speech: one per speaker, the speakers with "
                           "the most clips).", AT_LEAST_1)
    samples_per_client: int = opt(200, "Samples per client (equal for every client, as in the paper).", between(3))
    val_fraction: float = opt(0.2, "Share of each client's non-test samples held out for validation.", BELOW_1)
    test_fraction: float = opt(0.2, "Share of each client's samples held out for testing.",
                               between(0, 1, lo_open=True, hi_open=True))
    unseen_fraction: float = opt(0.2, "Share of each domain's clients in the unseen pool, never trained on (speech: "
                                      "share of held-out speakers).",
                                 BELOW_1)
    unseen_domains: list[str] = opt([], "Comma-separated domains whose clients are all unseen.")
    corruptions: list[str] | None = opt(None, "Comma-separated domains: corruptions (fmnist-c, digits-c), "
                                              "rotate<degrees> (fmnist-r) or CIFAR-10-C types. Defaults: "
                                              "docs/guide/data.md.")
    severity: int = opt(3, "Corruption severity 1..5.", between(1, 5))
    # per-domain overrides of alpha, samples_per_client and severity ({domain: value}; a domain not named takes the
    # global value): clients of different domains with different label skew, size or shift (the planted-signal cell)
    domain_alpha: dict[str, float] = opt({}, "Per-domain --alpha, e.g. clean=0.05,invert=1000: clients of those domains "
                                         "draw their label mix from Dir(value); the others from --alpha.", POSITIVE,
                                         identity_default=True)
    domain_samples: dict[str, int] = opt({}, "Per-domain --samples-per-client, e.g. clean=60 (>= 3).", between(3),
                                         identity_default=True)
    domain_severity: dict[str, int] = opt({}, "Per-domain --severity of generated corruptions, e.g. contrast=5.",
                                          between(1, 5), identity_default=True)
    # speech datasets: log-mel bins = frames of each one-second clip (the authors' code: 128 x 128 at 10 ms hops)
    spectrogram: int = opt(32, "Speech datasets: log-mel bins and frames per one-second clip (8..256; the authors' code "
                           "uses 128 x 128, 32 keeps the CPU benchmark practical).", between(8, 256), identity_default=True)
    image_size: int | None = opt(None, "image-folder: resize every image to N x N pixels (default: keep the images' "
                                 "size; they must all share one).", between(4))
    normalize: Normalize = opt("source", "Normalisation of generated domains: source = the source dataset's constants "
                                         "| partition = this partition's own mean and SD.")
    seed: int = opt(0, "Seed of every random draw; the same seed gives an identical partition.", NON_NEGATIVE)
    data_dir: str | None = opt(None, "Where the dataset files are (docs/guide/data.md lists each dataset's layout).",
                               option="--data-dir", envvar="FEDL2P_DATA", path=True)  # a location, not the identity
    download: bool = opt(False, "Allow torchvision to download the dataset when it is not found.")
    exclude: str | None = opt(None, "A partition id whose source images these clients must not get (e.g. the model's "
                                    "pretraining partition).", option="--exclude")

    def speakers(self) -> tuple[int, int]:
        """Seen and unseen speakers of a speech partition: --clients in all, round(--clients x --unseen-fraction)
        of them held-out speakers."""
        unseen = int(round(self.clients * self.unseen_fraction))
        return self.clients - unseen, unseen


@dataclass(kw_only=True)
class PretrainConfig:
    """`fedl2p pretrain`: the global model's federated pretraining (or an imported state dict)."""
    algo: str = opt("fedavg", "fedavg | fedbabu (head frozen while training) | perfedavg-hf (Per-FedAvg, Hessian-free "
                    "MAML steps).<plugin-pretrain-algos>")
    model: str = opt("small-cnn", MODEL_HELP)
    rounds: int = opt(30, "Communication rounds.", AT_LEAST_1)
    fraction: float = opt(0.1, "Share r of the seen clients sampled per round.", FRACTION)
    local_epochs: int = opt(1, "Local epochs per round.", AT_LEAST_1)
    batch_size: int = opt(32, "Batch size.", between(2))
    lr: float = opt(0.1, "SGD learning rate (x0.1 at 50% and 75% of the rounds); Per-FedAvg's outer step beta.", POSITIVE)
    pf_alpha: float = opt(0.01, "Per-FedAvg (HF) inner step size alpha.", POSITIVE)
    eval_every: int = opt(5, "Evaluate the global model on the seen and unseen clients' test data every k rounds.",
                          AT_LEAST_1)
    seed: int = opt(0, "Seed (model init, client sampling, batches).", NON_NEGATIVE)
    init: str | None = opt(None, "Import a state dict (safetensors or torch.save) instead of training.", path=True)
    init_sha256: str | None = opt(None, cli=False)  # the imported file's hash, filled in by the stage
    reset_head: bool = opt(False, "With --init: start a new classifier when the class count differs.")


@dataclass(kw_only=True)
class StatsConfig:
    """`fedl2p stats`: each client's statistics under the pretrained model."""
    batch_size: int = opt(512, "Forward batch size (speed only; batches are merged exactly).", AT_LEAST_1)


Nets = Literal["both", "bnnet", "lrnet"]
ClientWeights = Literal["samples", "equal"]
Keep = Literal["best", "last"]
NETS, KEEPS = (get_args(t) for t in (Nets, Keep))
INPUT_NORM_TAGS = {"standardize": "std", "robust": "rstd"}  # --input-norm's words in variant names

# Named sets of meta-train options (`--preset NAME`, a [[meta-train]] table's `preset = NAME`): the options a preset
# names take its values unless given. `learn` is the defaults: the log head (every client starts at the same strategy,
# so a split between kinds can only be learned), its LRs' gradient through the whole fine-tuning, robust inputs, one
# vote per client, the last round's lambda (docs/method/fedl2p.md#presets). `fomaml`: the
# defaults before (FOMAML+ from beta 0.9 under the paper's head). `paper`: the paper's setting (the IFT, App. E).
_PAPER_HEAD = {"head": "paper", "lr_grad": "last-step", "input_norm": "none", "client_weights": "samples",
               "lr_bnnet": DEFAULT_META_LR["bnnet"], "lr_lrnet": DEFAULT_META_LR["lrnet"], "keep": "best",
               "meta_signal": "loss"}
PRESETS: dict[str, dict[str, Any]] = {
    "learn": {"meta_grad": "fomaml", "head": "log", "lr_grad": "trajectory-bn", "input_norm": "robust",
              "client_weights": "equal", "beta_init": 0.5, "lr_bnnet": LEARN_META_LR, "lr_lrnet": LEARN_META_LR,
              "keep": "last", "meta_signal": "loss"},
    "fomaml": {"meta_grad": "fomaml", "beta_init": 0.9} | _PAPER_HEAD,
    "paper": {"meta_grad": "ift", "beta_init": 0.5} | _PAPER_HEAD,
}
NAMED_PRESETS = ("learn",)  # presets that name a variant with one word (the others' values name themselves)


def meta_of(preset: str, **values: Any) -> MetaConfig:
    """A preset's client-update settings (its MetaConfig keys) with `values` over them: what a script that calls the
    client update directly, without a MetaTrainConfig, hands it."""
    own = MetaConfig.__dataclass_fields__
    return MetaConfig(**{k: v for k, v in PRESETS[preset].items() if k in own} | values)
@dataclass(kw_only=True)
class MetaTrainConfig:
    """`fedl2p meta-train`'s options (and a [[meta-train]] table's keys): the federation around the client update
    (MetaConfig), whose fields are options of the same command."""
    PRESETS: ClassVar[dict[str, dict[str, Any]]] = PRESETS  # --preset NAME (cli/generate.py) and `preset = NAME`
    rounds: int = opt(30, "Communication rounds (paper: up to 500).", AT_LEAST_1)
    fraction: float = opt(0.1, "Share r of the seen clients sampled per round.", FRACTION)
    meta: MetaConfig = field(default_factory=MetaConfig)
    nets: Nets = opt("both", "both | bnnet (LRs fixed at --base-lr) | lrnet (beta fixed at --beta).",
                     tag=Tag(lambda v, c: "bnnet" if v == "bnnet" else f"lrnet-b{c.meta.fixed_beta:g}", 30))
    local: bool = opt(False, "L2P: each client learns its own lambda alone, same compute budget.", flag=True)
    patience: int = opt(0, "Stop after this many rounds without a lower mean validation loss (0: never).", NON_NEGATIVE)
    # a catalog entry (algorithms/meta_inputs.py; the stage checks the name), fitted on the seen clients
    input_norm: str = opt("robust", "Meta-net inputs: none = raw xi and x (the paper) | standardize = z-scored over "
                                    "the seen clients | robust = SD floored, |z| <= 3 | a plugin's.<plugin-meta-inputs>",
                          tag=Tag(lambda v, _c: INPUT_NORM_TAGS.get(v, v), 80), reference="none")
    # a catalog entry (algorithms/server_steps.py; the stage checks the name): fedadam's word is "adam", a plugin's
    # its name
    meta_opt: str = opt("fedavg", "Server update of lambda: fedavg (the paper's) | fedadam = Adam on the mean client "
                        "change (Reddi et al. 2021) | a plugin's.<plugin-server-steps>",
                        tag=Tag(lambda v, c: "adam" if v == "fedadam" else v, 90))
    server_lr: float = opt(1e-3, "Step size of a server step that takes one (fedadam).", POSITIVE)
    keep: Keep = opt("last", "Which lambda to keep: best = the round with the lowest mean validation loss (the paper) "
                             "| last = the final aggregate.",
                     tag=Tag("last", 100, lambda c: not c.local), reference="best")
    # meta-train seeds side by side in one table (seed 0 keeps the name it always had)
    seed: int = opt(0, "Seed (meta-net init, sampling, batches).", NON_NEGATIVE, tag=Tag("seed{v}", 240))
    # untrusted replies (not in the paper); left out of the artifact id at their defaults (added later)
    norm_bound: float = opt(0.0, "Drop a client whose lambda moved more than K times the round's median move (0: no "
                                 "bound). Not in the paper.", NON_NEGATIVE, identity_default=True,
                           tag=Tag("nb{v:g}", 230))
    client_weights: ClientWeights = opt("equal", "Weights of the clients' lambdas in the server's mean: samples = "
                                                   "by training size (the paper) | equal = one vote per client.",
                                        identity_default=True, tag=Tag({"equal": "eqw"}, 225), reference="samples")
    # a catalog entry (algorithms/aggregators.py; the stage checks the name)
    aggregator: str = opt("mean", "How the server combines lambdas: mean (the paper) | median | trimmed-mean | "
                                  "equal-norm (changes at the median norm) | equal-norm-tensor | a plugin's."
                                  "<plugin-aggregators>", option="--aggregate",
                          identity_default=True, tag=Tag(lambda v, _c: AGGREGATE_TAGS.get(v, v.replace("-", "")), 220))

    def family(self) -> str:
        """The learned method (methods.Learned.family) its artifact belongs to: L2P with --local, else FedL2P."""
        return "l2p" if self.local else "fedl2p"

    def variant(self) -> str:
        """The variant's name in result tables: its family, then the preset that names it (`learn`, where every option
        off its values still spells a word of its own, e.g. `fedl2p-learn-unroll`; the paper's and fomaml's values
        name themselves, word by word), then the word each option declares (`Tag`) that differs from that preset's
        value, else from its reference value."""
        for name in NAMED_PRESETS:
            base = PRESETS[name]
            if spells_off(self, base):
                return "-".join([self.family(), name, *variant_words(self, base)])
        return self.spelled()

    def spelled(self) -> str:
        """The variant's name word by word against the reference values, no preset word: what an artifact's id
        hashes, so a preset naming a set of values never moves an id."""
        return "-".join([self.family(), *variant_words(self)])

    @classmethod
    def preset(cls, name: str, meta: MetaConfig | None = None, **values: Any) -> MetaTrainConfig:
        """The preset's settings (`PRESETS`) with `values` (flat keys) over them, what `--preset NAME` and a
        [[meta-train]] table's `preset = NAME` give; `meta`: a whole client-update config in place of the preset's."""
        if name not in PRESETS:
            raise ConfigError(f"unknown --preset '{name}'; choose one of: {', '.join(PRESETS)}")
        base = PRESETS[name]
        if meta is not None:
            own = {f.name for f in fields(MetaConfig)}
            base = {k: v for k, v in base.items() if k not in own} | {f.name: getattr(meta, f.name) for f in fields(meta)}
        return from_flat(cls, base | values)



def config_from_dict(d: dict) -> MetaTrainConfig:
    """A meta-train artifact's settings (its stored config: the inverse of dataclasses.asdict, as a deployment's run
    config carries them too); runtime keys (a run config written when they were settings) are left to
    `Runtime.from_dict`."""
    known = set(MetaTrainConfig.__dataclass_fields__) - {"meta"}
    top = stored(MetaTrainConfig, {k: v for k, v in d.items() if k in known})
    return MetaTrainConfig(**top, meta=MetaConfig(**stored(MetaConfig, d["meta"])))

@dataclass(kw_only=True)
class PFLConfig:
    """`fedl2p pfl-train`: another personalised-FL system trained on the seen clients."""
    algo: str = opt("pfedla", "pfedla (pFedLA, CVPR 2022) | heurpfedla (its --k layers kept local) | cafeme (CAFeMe, "
                              "SDM 2024).<plugin-systems>")
    model: str = opt("small-cnn", "Base model: " + MODEL_HELP)
    rounds: int = opt(100, "Communication rounds (pFedLA paper: 600 for 10 clients; CAFeMe: 1000).", AT_LEAST_1)
    fraction: float = opt(1.0, "Share of the seen clients per round (pFedLA: 1.0 with 10 clients; CAFeMe: 5 clients of "
                          "80, 0.0625).", FRACTION)
    batch_size: int = opt(32, "Batch size (pFedLA: 32; CAFeMe: 30).", between(2))
    lr: float = opt(0.005, "pFedLA: local SGD learning rate (paper: 0.005 for Fashion-MNIST). CAFeMe: the inner step "
                    "alpha (authors' code: 0.05 CIFAR-10).", POSITIVE)
    local_epochs: int = opt(10, "pFedLA: local epochs per round (paper: 10 with 10 clients).", AT_LEAST_1)
    hn_lr: float = opt(5e-3, "pFedLA: SGD step of the hypernetworks and embeddings (authors' re-implementation default; "
                       "the paper leaves it to its supplement).", POSITIVE)
    embed_dim: int = opt(100, "pFedLA: client embedding size (ours, as the public re-implementation).", AT_LEAST_1)
    hn_hidden: int = opt(100, "pFedLA: width of the hypernetwork's three hidden layers.", AT_LEAST_1)
    k: int = opt(1, "HeurpFedLA: layers kept local (paper: 1).", AT_LEAST_1)
    steps: int = opt(5, "CAFeMe: inner personalisation steps S per round (paper: 5).", AT_LEAST_1)
    outer_lr: float = opt(1e-3, "CAFeMe: outer step beta (authors' code: Adam at 1e-3).", POSITIVE)
    order: PFLOrder = opt("first", "CAFeMe inner gradients: first = no graph through the inner steps (authors' code) | "
                                   "second = through them (slower).")
    outer: PFLOuter = opt("adam", "CAFeMe outer step: adam = Adam with per-client moments (authors' code) | sgd = the "
                                  "plain step of Alg. 1 line 8.")
    eval_every: int = opt(10, "Rounds between validation-accuracy records in history.csv.", AT_LEAST_1)
    seed: int = opt(0, "Seed (init, sampling, batches).", NON_NEGATIVE)
    options: dict[str, str | int | float | bool] = opt(
        {}, "A plugin system's own options as name=value pairs, e.g. head_lr=0.01 (the system declares them; "
            "fedl2p's systems take none).")


# the hand-made recipes and the newest FedL2P run of the model, whatever its variant (`fedl2p` names the method)
DEFAULT_METHODS = ["ft-bnc", "ft-bng", "ft-bni", "fedl2p"]


@dataclass(kw_only=True)
class PersonalizeConfig:
    """`fedl2p personalize`: which clients, which methods, and the fine-tuning budget every method shares."""
    unseen: bool = opt(False, "Evaluate the unseen pool (clients never used in meta-training).", flag=True)
    methods: list[str] = opt(DEFAULT_METHODS, "Comma-separated methods: ft-bnc, ft-bng, ft-bni, ft-tuned, fedl2p (newest "
                                              "run), fedl2p-checked, a variant by name, pfedla, heurpfedla, "
                                              "cafeme.<plugin-methods><plugin-systems>")
    # CAFeMe's personalisation steps for every evaluated client (paper: 50); added later, so out of the id at 50
    pfl_steps: int = opt(50, "CAFeMe: personalisation steps of every evaluated client before testing (paper: 50).",
                         AT_LEAST_1, identity_default=True)
    epochs: int = opt(5, "Fine-tuning epochs, the same budget for every method.", AT_LEAST_1, option="--epochs", short="-e")
    batch_size: int = opt(32, "Fine-tuning batch size (also the test batch size of BN I).", between(2))
    base_lr: float = opt(1e-3, "Learning rate of the FT baselines.", POSITIVE)
    seeds: list[int] = opt([0, 1, 2], "Comma-separated seeds; the table reports mean ± SD over them.", NON_NEGATIVE)
    client_bn: ClientBNMode = opt("precise", "Client BN statistics at test time, for every method: precise = "
                                             "recomputed after fine-tuning (not in the paper) | running = the paper's.")
    # the learned methods' test-time statistics (see core.finetune.personalized_accuracy); added later
    eval_stats: EvalStats = opt("running", "Learned methods' test-time BN statistics: running = beta mixes the "
                                           "client's (the paper) | test-batch = each test batch's (-tbs).",
                                identity_default=True, tag=Tag("tbs", 10))  # its rows must not pass for the paper's


@dataclass(kw_only=True)
class ClustersConfig:
    """`fedl2p analyze clusters`."""
    method: str | None = opt(None, "Meta-net method whose beta/eta to cluster; default: the first one.")
    seed: int = opt(0, "Seed of the spectral clustering.", NON_NEGATIVE)


@dataclass(kw_only=True)
class BetaGridConfig:
    """`fedl2p analyze beta-grid`: does a cell's data ask for a different beta per domain, before any training?"""
    lr: float = opt(0.01, "Learning rate of every tensor while fine-tuning under each beta vector.", POSITIVE)
    levels: list[float] = opt([0.0, 0.5, 1.0], "Comma-separated beta levels; every BN layer takes each, so the grid "
                              "has levels^(BN layers) vectors.", UNIT)
    seeds: list[int] = opt([0], "Comma-separated batch-order seeds; the report gives mean ± SD over them.", NON_NEGATIVE)
    epochs: int = opt(5, "Fine-tuning epochs per vector.", AT_LEAST_1, option="--epochs", short="-e")
    batch_size: int = opt(32, "Fine-tuning batch size.", between(2))


@dataclass(kw_only=True)
class DecomposeConfig:
    """`fedl2p analyze decompose`: which half of a learned strategy (beta, eta) helps."""
    method: str | None = opt(None, "The learned method (a meta-train variant of the personalisation) to take apart; "
                             "default: its first.")
    beta: float | None = opt(None, "The fixed beta that replaces the learned one in every BN layer; default: the "
                             "meta-train's --beta-init (the beta every client starts from).", UNIT)
    eta_scales: list[float] = opt([], "Comma-separated factors: also the learned strategy with every learned LR times "
                                  "each (does the pool want more or less fine-tuning than it was given?).", POSITIVE)
    layer_betas: list[float] = opt([], "Comma-separated betas: also re-run the learned strategy with one BN layer's "
                                       "beta at each value, layer by layer.", UNIT, identity_default=True)
