"""A personalised-FL system written only for tests/test_systems.py, as a plugin writes one (`api.PFLSystem`): FedAvg
of local SGD from the model's own init, evaluated as the global model on each client's test split. What a new system
needs: this class and a registration (`System(..., trainer="tests.toy_system:ToyFedAvg")`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from fedl2p_cli.api import (
    LocalConfig,
    LoopState,
    PFLSystem,
    build_model,
    evaluate,
    generator,
    get_state,
    load_weights,
    sample_clients,
    save_weights,
    sgd_client,
    weighted_average,
)


@dataclass
class Ask:
    client: int
    state: dict
    round: int


@dataclass
class ToyClient:
    model: object
    part: object
    local: LocalConfig
    lr: float
    seed: int


def local_update(ctx: ToyClient, t: Ask):
    x, y = ctx.part.client(t.client).train
    new, loss = sgd_client(ctx.model, t.state, x, y, ctx.lr, ctx.local, generator(ctx.seed, t.round, t.client))
    return new, len(y), loss


class Strategy:
    label = "toy fedavg"

    def __init__(self, cfg, part):
        self.cfg, self.part = cfg, part
        self.model = build_model(cfg.model, part.in_channels, part.num_classes, cfg.seed)

    def initial_state(self):
        return LoopState(0, get_state(self.model))

    def stop(self, st):
        return False

    def configure(self, st, rnd, attempt=0):
        return [Ask(c, st.tensors, rnd) for c in sample_clients(self.part.pool(False), self.cfg.fraction, self.cfg.seed,
                                                                rnd, attempt)]

    def aggregate(self, st, rnd, tasks, results, timer):
        st.tensors = weighted_average([r[0] for r in results], [r[1] for r in results])
        return {"round": rnd + 1, "train_loss": sum(r[2] for r in results) / len(results)}

    def progress_info(self, rec, st):
        return {}


class ToyFedAvg(PFLSystem):
    SETTINGS = {"toy-fedavg": ("local_epochs",)}

    def context(self, cfg, part):  # the catalog fedl2p handed it; its Strategy leaves build_model to find the stage's
        model = build_model(cfg.model, part.in_channels, part.num_classes, cfg.seed, catalog=self.catalog)
        return ToyClient(model, part, LocalConfig(epochs=cfg.local_epochs, batch_size=cfg.batch_size), cfg.lr, cfg.seed)

    def strategy(self, cfg, part, local):
        return Strategy(cfg, part)

    client = staticmethod(local_update)

    def save(self, strategy, state, draft):
        save_weights(draft.path("model.safetensors"), state.tensors, {"algo": strategy.cfg.algo})
        return {"algo": strategy.cfg.algo}

    def load(self, art, cfg, model):
        return load_weights(art.file("model.safetensors"))[0]

    def accuracy(self, t, c, data, seed, steps):
        t.model.eval()
        return evaluate(t.model, t.state, *data.test)[1]


@dataclass
class Scale:
    lr_scale: float = 1.0
    note: str = ""


class ToyFedAvgScaled(ToyFedAvg):
    """ToyFedAvg with an option of its own: its local learning rate is `--lr` times `lr_scale`."""
    SETTINGS = {"toy-scaled": ("local_epochs",)}
    Options = Scale

    def context(self, cfg, part):
        return replace(super().context(cfg, part), lr=cfg.lr * self.options(cfg).lr_scale)
