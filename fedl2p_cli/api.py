"""fedl2p's extension API: the one module a plugin imports. Everything else in `fedl2p_cli` is internal and may change
in any release; what is named here changes only with `API_VERSION`.

A plugin is a module with `register(registry: api.Registry)`; it may say which API it was written for with
`FEDL2P_API = 1` at its top (a plugin written for another version is refused in one line). What a user brings:

- a model: `registry.add_model(name, factory)`, `factory(in_channels, num_classes) -> nn.Module` (`ModelFactory`);
- a dataset: `registry.add_dataset(Source(name, load))`, `load(cfg, data_dir) -> Dataset` (`DatasetLoader`);
- a method: `registry.add_method(HandMade(...))`, `Tuned(...)` or `Learned(...)`; a `Method` subclass's
  `personalize(row, run)` gets a typed `ClientContext`;
- a pFL system: `registry.add_system(System(name, label, trainer="package.module:Class"))`, the class a
  `PFLSystem`, whose rounds run through the same executors as fedl2p's own (`--workers`, `--engine flower`);
- a pretraining algorithm: `registry.add_pretrain_algo(name, client)`, `client` a `PretrainClient`;
- an executor (where a round's clients run, `--engine NAME`): `registry.add_executor(executor)`, an `Executor` whose
  `open(job: Job)` returns a `Pool`;
- a meta-gradient (`meta-train --meta-grad NAME`, its name the variant's tag): `registry.add_meta_grad(meta_grad)`,
  a `MetaGradient` with `one(...)` for a client, returning a `MetaGrad` (a group runs it per client, or its
  optional `many(...)`, `BatchesClients`; the built-ins `Fomaml` and `Ift` to build on);
- a meta-net head (`meta-train --head NAME`: how BNNet's and LRNet's outputs become beta and eta, and how lambda is
  drawn): `registry.add_meta_head(head)`, a `MetaHead`;
- a server step (`meta-train --meta-opt NAME`: how the server moves lambda each round): `registry.add_server_step(
  step)`, a `ServerStep`;
- an LR meta-gradient (`meta-train --lr-grad NAME`: the path along which the fine-tuning's LRs moved the weights):
  `registry.add_lr_grad(entry)`, an `LrGradient`; a meta-gradient takes it through `with_lr_grad` (`TakesLrGrad`);
- the meta-nets' inputs (`meta-train --input-norm NAME`: how a client's statistics become BNNet's and LRNet's inputs,
  fitted on the seen clients): `registry.add_meta_inputs(entry)`, a `MetaInputs`;
- a meta-signal (`meta-train --meta-signal NAME`: what each client's meta-gradient says to the federation, e.g.
  relative to its own loss): `registry.add_meta_signal(entry)`, a `MetaSignal`;
- an aggregator (`meta-train --aggregate NAME`: how the server combines a round's replies before its step):
  `registry.add_aggregator(entry)`, an `Aggregator`.

The helpers below are what those pieces need (rounds, seeding, state dicts, weights files). Importing this module
does not import torch; the torch-side names load on first use.
"""

from __future__ import annotations

from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

from . import imports
from .algorithms.systems.base import PFLSystem
from .catalog import API_VERSION, ModelSpec, Plugin, PluginError, UnknownName
from .data.sources import Source
from .errors import DataError, FedL2PError
from .methods.context import Client, ClientContext, Row, Setup, Trial
from .methods.registry import POOLS, HandMade, Learned, Method, System, Tuned
from .plugins import Registry
from .protocols import (
    Aggregator,
    BatchesClients,
    Dataset,
    DatasetLoader,
    LrGradient,
    MetaGradient,
    MetaHead,
    MetaInputs,
    MetaSignal,
    ModelFactory,
    Outcome,
    PretrainClient,
    PretrainClients,
    ServerStep,
    TakesLrGrad,
)
from .runtime import Executor, Job, Pool

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from .algorithms.local import sgd_client, sgd_clients
    from .algorithms.meta_grads import Fomaml, Ift
    from .algorithms.systems.base import Trained as TrainedSystem
    from .artifacts import Artifact, Draft
    from .catalog import Catalog
    from .configs import PartitionConfig, PFLConfig
    from .core.aggregate import weighted_average
    from .core.client import ClientData, LocalConfig, Timer
    from .core.finetune import FinetuneResult
    from .core.functional import epochs_of_batches, evaluate, get_state, mean_loss, random_batch, set_state
    from .core.hypergrad import MetaGrad
    from .core.metanets import Lambda
    from .data.datasets import channel_stats
    from .device import to_host
    from .engine.loop import Checkpoint, LoopState, generator, group_of, nest, sample_clients
    from .engine.placement import OnDevice
    from .engine.progress import Progress
    from .engine.rounds import Failed, RoundObserver, RoundStrategy, Task, in_process, run_rounds
    from .io.partition_h5 import Partition
    from .runtime import Runtime

T = TypeVar("T")

# the torch-side names, imported when first asked for (module, name there)
_LAZY = {
    "LocalConfig": ("core.client", "LocalConfig"), "sgd_client": ("algorithms.local", "sgd_client"),
    "sgd_clients": ("algorithms.local", "sgd_clients"),
    "Artifact": ("artifacts", "Artifact"), "Draft": ("artifacts", "Draft"),
    "PartitionConfig": ("configs", "PartitionConfig"), "PFLConfig": ("configs", "PFLConfig"),
    "weighted_average": ("core.aggregate", "weighted_average"),
    "ClientData": ("core.client", "ClientData"), "Timer": ("core.client", "Timer"),
    "epochs_of_batches": ("core.functional", "epochs_of_batches"), "evaluate": ("core.functional", "evaluate"),
    "get_state": ("core.functional", "get_state"), "mean_loss": ("core.functional", "mean_loss"),
    "set_state": ("core.functional", "set_state"),
    "channel_stats": ("data.datasets", "channel_stats"),
    "to_host": ("device", "to_host"),
    "Checkpoint": ("engine.loop", "Checkpoint"), "LoopState": ("engine.loop", "LoopState"),
    "generator": ("engine.loop", "generator"), "group_of": ("engine.loop", "group_of"), "nest": ("engine.loop", "nest"),
    "sample_clients": ("engine.loop", "sample_clients"), "OnDevice": ("engine.placement", "OnDevice"),
    "Failed": ("engine.rounds", "Failed"), "RoundStrategy": ("engine.rounds", "RoundStrategy"),
    "RoundObserver": ("engine.rounds", "RoundObserver"),
    "Task": ("engine.rounds", "Task"), "in_process": ("engine.rounds", "in_process"),
    "run_rounds": ("engine.rounds", "run_rounds"),
    "Partition": ("io.partition_h5", "Partition"), "Runtime": ("runtime", "Runtime"),
    "Progress": ("engine.progress", "Progress"), "TrainedSystem": ("algorithms.systems.base", "Trained"),
    "MetaGrad": ("core.hypergrad", "MetaGrad"), "FinetuneResult": ("core.finetune", "FinetuneResult"),
    "Lambda": ("core.metanets", "Lambda"),
    "Fomaml": ("algorithms.meta_grads", "Fomaml"), "Ift": ("algorithms.meta_grads", "Ift"),
    "random_batch": ("core.functional", "random_batch"),
}


def __getattr__(name: str) -> object:  # a type checker reads the names' types from the TYPE_CHECKING imports
    if name not in _LAZY:
        raise AttributeError(f"module 'fedl2p_cli.api' has no attribute '{name}'")
    module, attr = _LAZY[name]
    value = imports.load(f"{__package__}.{module}:{attr}", imports.Why.OWN)
    globals()[name] = value  # asked once
    return value


class SystemTrainer(Protocol):
    """API 1's first protocol for a pFL system, kept for plugins written against it: the module a
    `System(trainer="module")` names. It runs its own rounds in this process (no `--workers`, no Flower); loading it
    notes once how to make it a `PFLSystem` class, which does.

    - `SETTINGS`: {algo name: (PFLConfig field, ...)}, the options its artifact id includes besides the shared ones
      (algo, model, rounds, fraction, batch_size, lr, eval_every, seed);
    - `train`: runs its rounds (a `RoundStrategy` through `run_rounds`: checkpoints, resume, failure handling),
      computing on `runtime.torch_device`; writes its weights into `draft` (`draft.path(FILE)`); returns
      (history rows, metrics);
    - `load`: its trained state from its artifact (`art.file(FILE)`);
    - `accuracy`: client `client`'s test accuracy (NaN where it has no model for it); a system that adapts to a client
      draws its batches from `batch_stream(seed, client)`, the stream every method shares."""
    SETTINGS: dict[str, tuple[str, ...]]

    def train(self, cfg: PFLConfig, part: Partition, ckpt: Checkpoint, progress: Progress, draft: Draft,
              runtime: Runtime) -> tuple[list[dict], dict]: ...

    def load(self, art: Artifact, cfg: PFLConfig, model: nn.Module) -> object: ...

    def accuracy(self, trained: TrainedSystem, client: int, data: ClientData, seed: int, steps: int) -> float: ...


def batch_stream(seed: int, client: int) -> torch.Generator:
    """The batch order of every personalisation of `client` with personalisation seed `seed` (a fresh generator each
    call): every method, system and analysis of a client and seed draws from it, so their accuracies are paired."""
    from .engine.loop import batch_stream as stream
    return stream(seed, client)


def build_model(name: str, in_channels: int, num_classes: int, seed: int = 0, catalog: Catalog | None = None) -> nn.Module:
    """The model `name` (registered, or `package.module:factory`), initialised from `seed`, its BN layers mixing BN:
    the model every stage builds for that name. `catalog`: where it is looked up, a system's `self.catalog`; None:
    the running stage's (`plugins.current()`, for plugin code written before systems were handed one)."""
    from . import plugins
    from .models.registry import build
    return build(name, in_channels, num_classes, seed, catalog=plugins.current() if catalog is None else catalog)


def head_prefix(model: nn.Module) -> str:
    """The parameter-name prefix of a built model's classifier (e.g. "fc."): the head its registration declared
    (`add_model(..., head=)`), else its last nn.Linear. FedBABU freezes it and `--reset-head` replaces it; a system
    that keeps the head on the client (FedPer) should split the model here too."""
    from .models.registry import head_prefix as prefix
    return prefix(model)


def to_device(obj: T, device: torch.device | str) -> T:
    """Tensors in `obj` (a tensor, or dicts, lists, tuples and dataclasses of them) on `device`."""
    from .device import move
    return cast(T, move(obj, device))  # the same structure, its tensors moved


def is_batchnorm(module: nn.Module) -> bool:
    """Whether `module` is a BatchNorm layer: fedl2p's mixing BN (what a built model holds) or torch's own."""
    from torch.nn.modules.batchnorm import _BatchNorm

    from .core.bn import MixBN
    return isinstance(module, (MixBN, _BatchNorm))


def save_weights(path: str | PathLike[str], tensors: dict[str, Tensor], meta: dict | None = None) -> None:
    """Tensors (and a JSON-able `meta`) to a safetensors file, atomically; no pickle."""
    from .io import weights
    weights.save(Path(path), tensors, meta)


def load_weights(path: str | PathLike[str]) -> tuple[dict[str, Tensor], dict]:
    """A safetensors file `save_weights` wrote: its tensors and its meta."""
    from .io import weights
    return weights.load_with_meta(Path(path))


__all__ = [
    "API_VERSION", "Registry", "Plugin", "PluginError", "UnknownName", "FedL2PError", "DataError",
    # what a user brings
    "ModelFactory", "ModelSpec", "Source", "DatasetLoader", "Dataset", "channel_stats",
    "Method", "HandMade", "Tuned", "Learned", "System", "PFLSystem", "Outcome", "POOLS", "PretrainClient", "PretrainClients",
    "SystemTrainer", "Executor", "Job", "Pool", "MetaGradient", "MetaHead", "ServerStep", "LrGradient", "TakesLrGrad", "BatchesClients",
    "MetaInputs", "MetaSignal", "Aggregator",
    # what a meta-gradient is handed and returns (Lambda: the meta-nets' tensors by name, in a server step's and a
    # meta-gradient's signatures), and the built-ins to build on
    "FinetuneResult", "MetaGrad", "Lambda", "Fomaml", "Ift", "random_batch",
    # what a method is handed in `personalize`
    "Setup", "Row", "ClientContext", "Client", "Trial",
    # what a pFL system or a pretraining algorithm is handed and uses
    "PFLConfig", "PartitionConfig", "Partition", "ClientData", "Runtime", "Progress", "Checkpoint", "Draft", "Artifact",
    "TrainedSystem", "RoundStrategy", "Task", "Failed", "LoopState", "Timer", "RoundObserver", "run_rounds", "in_process",
    "OnDevice",
    "sample_clients", "generator", "batch_stream", "nest", "group_of",
    "build_model", "head_prefix", "is_batchnorm", "get_state", "set_state", "evaluate", "epochs_of_batches", "mean_loss",
    "weighted_average", "LocalConfig", "sgd_client", "sgd_clients", "to_device", "to_host", "save_weights", "load_weights",
]
