"""tests/toy_system.py's FedAvg written against API 1's module protocol (SETTINGS, train, load, accuracy functions;
`System(..., trainer="tests.toy_system_v1")`), as plugins written before `PFLSystem` are: it must still train, in
this process, and its loading must note how to move it to a class."""

from __future__ import annotations

from dataclasses import dataclass

from fedl2p_cli.algorithms.local import LocalConfig, sgd_client
from fedl2p_cli.api import build_model
from fedl2p_cli.core.aggregate import weighted_average
from fedl2p_cli.core.functional import get_state
from fedl2p_cli.engine.loop import LoopState, generator, sample_clients
from fedl2p_cli.engine.rounds import in_process, run_rounds
from fedl2p_cli.io import weights
from fedl2p_cli.stages.pretrain import global_accuracy

SETTINGS = {"toy-fedavg-v1": ("local_epochs",)}


@dataclass
class Ask:
    client: int
    state: dict
    round: int


class Strategy:
    label = "toy fedavg"

    def __init__(self, cfg, part):
        self.cfg, self.part = cfg, part
        self.model = build_model(cfg.model, part.in_channels, part.num_classes, cfg.seed)  # API 1: no catalog handed
        self.local = LocalConfig(epochs=cfg.local_epochs, batch_size=cfg.batch_size)

    def initial_state(self):
        return LoopState(0, get_state(self.model))

    def stop(self, st):
        return False

    def configure(self, st, rnd, attempt=0):
        return [Ask(c, st.tensors, rnd) for c in sample_clients(self.part.pool(False), self.cfg.fraction, self.cfg.seed, rnd)]

    def client(self, t: Ask):
        x, y = self.part.client(t.client).train
        new, loss = sgd_client(self.model, t.state, x, y, self.cfg.lr, self.local, generator(self.cfg.seed, t.round, t.client))
        return new, len(y), loss

    def aggregate(self, st, rnd, tasks, results, timer):
        st.tensors = weighted_average([r[0] for r in results], [r[1] for r in results])
        return {"round": rnd + 1, "train_loss": sum(r[2] for r in results) / len(results)}

    def progress_info(self, rec, st):
        return {}


def train(cfg, part, ckpt, progress, draft, runtime):
    strategy = Strategy(cfg, part)
    st = run_rounds(strategy, cfg.rounds, ckpt, progress, in_process(strategy.client))
    weights.save(draft.path("model.safetensors"), st.tensors, {"algo": cfg.algo})
    return st.history, {"algo": cfg.algo}


def load(art, cfg, model):
    return weights.load(art.file("model.safetensors"))


def accuracy(t, c, data, seed, steps):
    return global_accuracy(t.model, t.state, *data.test)
