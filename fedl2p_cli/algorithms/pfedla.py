"""pFedLA and HeurpFedLA (Ma et al., CVPR 2022, Alg. 1-2): one round's work for one client, server side included.

The maths (mix, hypernetwork step) is `core.layer_mix`; this module strings it into Alg. 1 lines 5-8: mix the
client's personalised model, train it locally (plain SGD, as FedAvg's client), update the hypernetwork with
the returned change and store the client's new model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..core import layer_mix as lm
from ..core.client import ClientData
from .local import LocalConfig, sgd_client, sgd_clients


@dataclass
class Server:
    """What the pFedLA server holds: every client's latest model (stacked, in `clients` order) and one
    hypernetwork per client. O(N * model + N * N * layers * hidden) memory: the method's known limit."""

    clients: list[int]
    stacked: lm.Stacked
    hypernets: list[lm.Hyper]
    param_names: list[str]
    layers: list[str]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.stacked.values()) + \
            sum(t.numel() * t.element_size() for hn in self.hypernets for t in hn.values())


def init_server(clients: list[int], state: dict[str, Tensor], param_names: list[str], embed_dim: int, hidden: int,
                gen: torch.Generator) -> Server:
    """Alg. 1 line 1: every client starts from the same model; hypernetworks drawn from `gen`."""
    layers = lm.layers_of(param_names)
    stacked = lm.stack([state] * len(clients))
    hns = [lm.init_hypernet(len(clients), layers, embed_dim, hidden, gen) for _ in clients]
    return Server(list(clients), stacked, hns, list(param_names), layers)


def personalized(server: Server, i: int, k: int) -> tuple[dict[str, Tensor], list[str]]:
    """Client slot i's model theta_bar_i (Eq. 6) and, for HeurpFedLA (k > 0), the layers it keeps local."""
    with torch.no_grad():
        alpha = lm.alphas(server.hypernets[i], server.layers)
    retained = lm.retained_layers(alpha, i, k)
    return lm.mix(server.stacked, alpha, i, server.param_names, retained), retained


def client_round(model: nn.Module, server: Server, i: int, data: ClientData, local: LocalConfig, lr: float,
                 hn_lr: float, k: int, gen: torch.Generator) -> tuple[lm.Hyper, dict[str, Tensor], float]:
    """Alg. 1 lines 5-8 (Alg. 2 with k > 0) for client slot i: its new hypernetwork, its new stored model and the
    mean local training loss. Pure: the server is read, not changed."""
    bar, retained = personalized(server, i, k)
    new, loss = sgd_client(model, bar, *data.train, lr, local, gen)
    return _hypernet_step(server, i, bar, retained, new, hn_lr), new, loss


def _hypernet_step(server: Server, i: int, bar: dict[str, Tensor], retained: list[str], new: dict[str, Tensor],
                   hn_lr: float) -> lm.Hyper:
    """Alg. 1 line 7: client slot i's hypernetwork moved by its local update new - bar."""
    delta = {n: new[n] - bar[n] for n in server.param_names}
    return lm.hypernet_step(server.hypernets[i], server.stacked, i, server.param_names, server.layers, delta, hn_lr,
                            retained)


def client_rounds(model: nn.Module, server: Server, slots: list[int], datas: list[ClientData], local: LocalConfig,
                  lr: float, hn_lr: float, k: int, gens: list[torch.Generator]
                  ) -> list[tuple[lm.Hyper, dict[str, Tensor], float]]:
    """`client_round` for several client slots: their local SGD as one vmapped computation (`sgd_clients`), then each
    one's hypernetwork step. Per client the same to float rounding."""
    bars = [personalized(server, i, k) for i in slots]
    news = sgd_clients(model, [bar for bar, _ in bars], [d.train[0] for d in datas], [d.train[1] for d in datas],
                       [lr] * len(slots), local, gens)
    return [(_hypernet_step(server, i, bar, retained, new, hn_lr), new, loss)
            for i, (bar, retained), (new, loss) in zip(slots, bars, news)]


def apply_round(server: Server, results: dict[int, tuple[lm.Hyper, dict[str, Tensor], float]]) -> None:
    """Alg. 1 lines 7-8 for every client of the round at once (the clients ran 'in parallel' on one server state)."""
    for i, (hn, new, _) in results.items():
        server.hypernets[i] = hn
        for name, t in new.items():
            server.stacked[name][i] = t
