"""The plugin-facing types, on the package's bottom floor: what the catalog stores per kind (a dataset's `Source`, a
`Method` or `System`, a `MetaGradient`, the callables `ModelFactory`, `PretrainClient`), what those are handed
(`Setup`, `Row`, `ClientContext`, a loader's `Dataset`) and what they return (`Outcome`). The classes fedl2p registers
(data/sources.py's `Source`, methods/registry.py's methods, the meta-gradients) implement them; the catalog and the
plugin loader type their entries with them, so neither imports the layers above. The executor's interface (`Executor`,
`Job`, `Pool`) names the Runtime, which carries the catalog: it is declared beside the Runtime (runtime.py). Torch-free;
it imports only core/ and errors, and for the type checker configs.py's configs, which import only core/
(tests/test_layout.py checks)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from .configs import PartitionConfig, PersonalizeConfig
    from .core.client import ClientData, LocalConfig
    from .core.finetune import FinetuneResult, Strategy
    from .core.hypergrad import MetaGrad
    from .core.metanets import Lambda
    from .core.settings import MetaConfig


# -- models and pretraining ------------------------------------------------------------------------------------
class ModelFactory(Protocol):
    """What `registry.add_model` takes: an nn.Module for this many input channels and classes (either parameter may
    be left out). Its BatchNorm1d/2d layers become fedl2p's mixing BN; FedL2P differentiates through it twice, so
    every layer must be twice differentiable (checked when the model is built)."""

    def __call__(self, in_channels: int, num_classes: int) -> nn.Module: ...


class PretrainClient(Protocol):
    """What `registry.add_pretrain_algo` takes: one client's local update from `state` on (x, y) with this LR, its
    `LocalConfig` and the round's generator; the new state and the mean training loss."""

    def __call__(self, model: nn.Module, state: dict[str, Tensor], x: Tensor, y: Tensor, lr: float, cfg: LocalConfig,
                 gen: torch.Generator) -> tuple[dict[str, Tensor], float]: ...


class PretrainClients(Protocol):
    """`add_pretrain_algo(..., client_many=)`: `PretrainClient` for a list of clients at once (the batched executor);
    per client the same update to float rounding."""

    def __call__(self, model: nn.Module, states: list[dict[str, Tensor]], xs: list[Tensor], ys: list[Tensor],
                 lrs: list[float], cfg: LocalConfig, gens: list[torch.Generator]) -> list[tuple[dict[str, Tensor], float]]: ...


# -- datasets -----------------------------------------------------------------------------------------------------
@dataclass
class Dataset:
    """A dataset as a source loads it: uint8 images [N, C, H, W], int64 labels, class names, normalisation constants,
    and optionally a domain per image (each domain gets its own clients) or a group per image (a client each)."""
    name: str
    images: torch.Tensor  # uint8 [N, C, H, W]
    labels: torch.Tensor  # int64 [N]
    classes: list[str]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    domains: torch.Tensor | None = None  # int64 [N], only for multi-domain sources
    domain_names: list[str] | None = None
    groups: torch.Tensor | None = None  # int64 [N]: naturally partitioned sources (a speaker per clip), one client each
    group_names: list[str] | None = None
    note: str | None = None  # what loading did that the user should hear of (image-folder: kept or resized)

    def __len__(self) -> int:
        return int(self.labels.numel())


class DatasetLoader(Protocol):
    """`Source.load`: the dataset of a partition's config, `data_dir` being --data-dir (or FEDL2P_DATA; None if
    neither). Images uint8 [N, C, H, W], labels, class names, normalisation, optionally a domain per image."""

    def __call__(self, cfg: PartitionConfig, data_dir: Path | None) -> Dataset: ...


class Source(Protocol):
    """A dataset as the catalog holds it (data/sources.py's `Source` is the one a plugin builds): its loader and what
    the partition stage asks of it."""
    @property
    def name(self) -> str: ...
    @property
    def load(self) -> DatasetLoader: ...
    @property
    def about(self) -> str: ...
    @property
    def channels(self) -> int | None: ...
    @property
    def classes(self) -> int | None: ...
    @property
    def mean(self) -> tuple[float, ...] | None: ...
    @property
    def std(self) -> tuple[float, ...] | None: ...
    @property
    def domains(self) -> tuple[str, ...] | None: ...
    @property
    def corruptible(self) -> bool: ...
    @property
    def corruption_files(self) -> tuple[str, ...]: ...
    @property
    def speakers(self) -> bool: ...
    @property
    def options(self) -> tuple[str, ...]: ...
    @property
    def images_of(self) -> str | None: ...
    @property
    def resized_before(self) -> int | None: ...
    def read_paths(self, cfg: PartitionConfig, data_dir: Path | None) -> list[Path]: ...
    def generates(self, corruptions: list[str] | None) -> bool: ...
    def base(self) -> str: ...


# -- methods and systems: what a method is handed in `personalize` ----------------------------------------------
class Row(Protocol):
    """One row of a personalisation: its name in the results, its method, what the method prepared for it (a learned
    variant's meta-nets, a system's trained models)."""
    @property
    def name(self) -> str: ...
    @property
    def method(self) -> Method: ...
    @property
    def payload(self) -> Any: ...


class Setup(Protocol):
    """The personalisation being prepared: its config and the artifacts it reads. A method asks it for rows
    (`row`, `meta_row`, `pfl_row`) and the artifacts they come from (`newest_learned`, `newest_meta`, `newest_pfl`)."""
    cfg: PersonalizeConfig
    model: nn.Module | None       # the harness's model, once built (a hand-made method's `tensors` reads it)

    @property
    def n_bn(self) -> int: ...
    @property
    def n_params(self) -> int: ...
    def row(self, name: str, method: Method, art: Any = None, payload: Any = None) -> Row: ...
    def method(self, name: str) -> Method: ...  # the method registered as `name` in the personalisation's catalog
    def newest_learned(self, family: str) -> Any: ...
    def newest_meta(self, variant: str) -> Any: ...
    def meta_row(self, method: Any, art: Any) -> Row: ...
    def learned_strategy(self, row: Row, c: int) -> Strategy | None: ...
    def newest_pfl(self, algo: str) -> Any: ...
    def pfl_row(self, method: Any, art: Any) -> Row: ...


class Trial(Protocol):
    """One fine-tuning of a client under a strategy and seed; its scores are computed when asked."""

    def evaluate(self, split: str, stats: str = "running") -> tuple[float, float]:
        """(loss, accuracy) on the client's `split` (val, test) under `stats` (running, test-batch)."""
        ...


class Client(Protocol):
    """A client on the harness's device: its id and its data (train, val, test splits)."""
    id: int
    data: ClientData


class ClientContext(Protocol):
    """One client and seed of a personalisation, what `Method.personalize` gets: every fine-tuning it asks for draws
    the client's batch stream for the seed, so every method's row of a client and seed sees the same batches."""
    setup: Setup
    client: Client
    seed: int
    strategies: dict[str, Strategy | None]  # each row's strategy for this client, by row name

    def handmade(self, method: Method, factor: float) -> Trial:
        """Fine-tuning under a hand-made method's strategy at `factor` x its LR (computed once, shared)."""
        ...

    def handmade_strategy(self, method: Method, factor: float) -> Strategy:
        """The Strategy `handmade(method, factor)` fine-tunes under (for `Method.wants`)."""
        ...

    def unadapted(self, split: str) -> tuple[float, float]:
        """(loss, accuracy) of the pretrained parameters on `split`, without fine-tuning."""
        ...

    def learned(self, row: Row) -> Trial | None:
        """Fine-tuning under the row's learned strategy for this client (None: it has none)."""
        ...

    def finetune(self, strategy: Strategy) -> Trial:
        """Fine-tuning under any strategy (a learned one changed, say), on the client's batches for the seed."""
        ...

    def system(self, row: Row) -> float:
        """A pFL system's test accuracy on this client (NaN where it has no model for it)."""
        ...


@dataclass(frozen=True)
class Outcome:
    """One client's result under one method and seed: test accuracy, and a tuned method's candidate scores (rows
    [val_loss, val_acc, test_acc] in its candidates' order)."""
    acc: float
    candidates: Any = None


class Method(Protocol):
    """A personalisation method as the catalog holds it (methods/registry.py's `Method` and its kinds implement it):
    `resolve` finds the artifact a requested name needs, `prepare` turns it into a row, `strategy` is the (beta, eta)
    the row records for a client, `personalize` its result for one client and seed."""
    trained_by: ClassVar[str | None]
    kind: ClassVar[str]

    @property
    def name(self) -> str: ...
    @property
    def label(self) -> str: ...
    @property
    def pools(self) -> tuple[str, ...]: ...
    def supports(self, pool: str) -> bool: ...
    def resolve(self, setup: Setup, name: str) -> Any: ...
    def prepare(self, setup: Setup, art: Any) -> Row: ...
    def strategy(self, row: Row, setup: Setup, c: int) -> Strategy | None: ...
    def personalize(self, row: Row, run: ClientContext) -> Outcome: ...
    def wants(self, row: Row, run: ClientContext) -> list[Strategy]: ...


class System(Method, Protocol):
    """A personalised-FL system as the catalog holds it: a method whose `trainer` ("package.module:Class", an
    `api.PFLSystem`) trains it (`fedl2p pfl-train --algo NAME`)."""
    @property
    def trainer(self) -> str: ...


# -- FedL2P's own parts: the meta-nets' head and inputs, the server's step, the LRs' meta-gradient --------------------
class MetaHead(Protocol):
    """How the meta-nets' outputs become a client's strategy (`meta-train --head NAME`): `init` draws lambda (its
    tensors by name), `hyperparameters` maps (lambda, xi, x) to (beta [B], eta [|P|]), differentiably in lambda. The
    built-ins: `paper` (App. E) and `log` (algorithms/heads.py)."""

    @property
    def name(self) -> str: ...

    @property
    def about(self) -> str: ...

    def init(self, n_bn: int, n_x: int, n_params: int, cfg: MetaConfig, nets: str, seed: int) -> Lambda: ...

    def hyperparameters(self, lam: Lambda, xi: Tensor, x: Tensor, n_params: int,
                        cfg: MetaConfig) -> tuple[Tensor, Tensor]: ...


class ServerStep(Protocol):
    """How the server turns the round's combined lambda into the next one (`meta-train --meta-opt NAME`): `step(lam,
    combined, state, t, lr)` with t the server step from 1 and `state` its own tensors (checkpointed with the loop),
    returning the new lambda and state. The built-ins: `fedavg` (the paper's: the combination itself) and `fedadam`
    (algorithms/server_steps.py)."""

    @property
    def name(self) -> str: ...

    @property
    def about(self) -> str: ...

    def step(self, lam: Lambda, combined: Lambda, state: dict[str, Tensor], t: int,
             lr: float) -> tuple[Lambda, dict[str, Tensor]]: ...


class Aggregator(Protocol):
    """How the server combines the round's replies into one lambda (`meta-train --aggregate NAME`), before the server
    step: `combine(sent, lams, weights)` with `sent` the lambda the clients received, `lams` their replies and
    `weights` one per reply (`--client-weights`). The built-ins: `mean` (the paper's), `median`, `trimmed-mean` and
    `equal-norm` (algorithms/aggregators.py)."""

    @property
    def name(self) -> str: ...

    @property
    def about(self) -> str: ...

    def combine(self, sent: Lambda, lams: list[Lambda], weights: list[float]) -> Lambda: ...


class LrGradient(Protocol):
    """The learned LRs' meta-gradient (`meta-train --lr-grad NAME`): `path(ft)` is the direction along which the
    fine-tuning's LRs moved theta* (a tensor per parameter, in the order of `ft.params`, with theta* = start - eta *
    path, e.g. `ft.grad_sum`, every step's gradient summed; None: the meta-gradient's own, FOMAML+'s last step or the
    IFT's `--eta-grad`); `slope(model, ft, beta, val, x_train, val_stats)` hands the LRs' per-tensor slopes dL_V/d
    log eta [|P|] directly, in place of the path's (None: from the path): `val` is the validation batch (x, y),
    `x_train` the client's training inputs (for statistics recomputed from theta*) and `val_stats` the run's
    `--val-stats`. An entry takes no options of its own: register one name per setting. The built-ins:
    `last-step`, `trajectory`, `trajectory-bn`, `unrolled` (algorithms/lr_grads.py)."""

    @property
    def name(self) -> str: ...

    @property
    def about(self) -> str: ...

    def path(self, ft: FinetuneResult) -> list[Tensor] | None: ...

    def slope(self, model: nn.Module, ft: FinetuneResult, beta: Tensor, val: tuple[Tensor, Tensor], x_train: Tensor,
              val_stats: str) -> Tensor | None: ...


class MetaInputs(Protocol):
    """What the meta-nets read (`meta-train --input-norm NAME`): `fit(xi, x)` sees the seen clients' statistics (a
    row each: xi [N, B] the BN layers' KL distances, x [N, 2M] the layer inputs' moments) and returns the entry's own
    tensors, stored with lambda; `apply(state, xi, x)` maps one client's statistics to BNNet's and LRNet's inputs.
    BNNet's input keeps one value per BN layer ([B]); LRNet's may have any width. The built-ins: `none` (the paper's
    raw inputs), `standardize`, `robust` (algorithms/meta_inputs.py)."""

    @property
    def name(self) -> str: ...

    @property
    def about(self) -> str: ...

    def fit(self, xi: Tensor, x: Tensor) -> dict[str, Tensor]: ...

    def apply(self, state: dict[str, Tensor], xi: Tensor, x: Tensor) -> tuple[Tensor, Tensor]: ...


class MetaSignal(Protocol):
    """What a client's meta-gradient says to the federation (`meta-train --meta-signal NAME`): `weigh(grads,
    val_loss)` maps the client's meta-gradient and its validation batch's loss (a 0-dim tensor) to the gradient its
    lambda steps along, before the element-wise clip. The built-ins: `loss` (the paper's) and `log-loss`
    (algorithms/meta_signals.py)."""

    @property
    def name(self) -> str: ...

    @property
    def about(self) -> str: ...

    def weigh(self, grads: Lambda, val_loss: Tensor) -> Lambda: ...


# -- meta-gradients -------------------------------------------------------------------------------------------------
HyperMany = Callable[["Lambda", "Tensor", "Tensor"], tuple["Tensor", "Tensor"]]  # (lambda, xi, x) -> (beta, eta)


class MetaGradient(Protocol):
    """A meta-gradient as the catalog holds it: its `--meta-grad` name (and variant tag), one line about it and `one`,
    a client's meta-gradient. That is all an entry must have: a group of clients (the batched executor) runs `one` per
    client unless the entry also has `many` (`BatchesClients`)."""

    @property
    def name(self) -> str: ...

    @property
    def about(self) -> str: ...

    def one(self, model: nn.Module, ft: FinetuneResult, lam: Lambda, hyper: Callable[[Lambda], Any],
            data: ClientData, cfg: MetaConfig, gen: torch.Generator) -> MetaGrad:
        """The meta-gradient w.r.t. lambda after fine-tuning `ft` (Alg. 1 line 10), its batches drawn from `gen`
        after the fine-tuning's."""
        ...


@runtime_checkable
class BatchesClients(Protocol):
    """A meta-gradient that computes a group of clients as one computation (optional): the built-ins vmap the same
    one-client function their `one` calls (core.hypergrad's `*_client`, core.batched)."""

    def many(self, model: nn.Module, fts: list[FinetuneResult], lams: list[Lambda], hyper: HyperMany,
             inputs: list[tuple[Tensor, Tensor]], datas: list[ClientData], cfg: MetaConfig,
             gens: list[torch.Generator]) -> list[MetaGrad]:
        """`one` for a group of clients as one computation; each client draws its batches as `one` does."""
        ...


@runtime_checkable
class TakesLrGrad(Protocol):
    """A meta-gradient that takes `--lr-grad`: `with_lr_grad(entry)` is the same meta-gradient with its LRs' path
    from `entry`. One without it runs only at `--lr-grad last-step` (its own LR path)."""

    def with_lr_grad(self, entry: LrGradient) -> MetaGradient: ...
