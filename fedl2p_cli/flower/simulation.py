"""The Flower engine: a round's client updates run as Flower ClientApps (Message API), in Flower's simulation.

Flower is an executor here, like `workers.ClientPool`: the one round loop (`engine.rounds.run_rounds`) stays in
this process and hands each round's tasks to `FlowerPool.map`. A ServerApp, running in Flower's simulation runtime
on a background thread, turns each task into a `train` Message (tensors in an ArrayRecord, the rest as a JSON
skeleton in a ConfigRecord; `flower.wire`, no pickle), sends them with `grid.send_and_receive`, and returns the
replies in task order. Each virtual SuperNode's ClientApp builds its read-only context once (the same builder as a
worker process), runs the stage's own client update with its own generator (seed, round, client), and replies
with the packed result. So the artifact has the same id as the in-process engine's for the same seed and the same
tensors up to float32 rounding (byte-identical on the quickstart data; ~1 ulp apart with IFT on the tests' tiny
store, cause not found). Flower is an optional extra: `pip install 'fedl2p[flower]'`.
"""

from __future__ import annotations

import contextvars
import importlib.util
import logging
import queue
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

from ..engine.rounds import Failed
from ..errors import FedL2PError
from . import wire

_CONTEXTS: dict[tuple, Any] = {}  # per ClientApp process: the built context, keyed by its builder's arguments


def require_flower() -> None:
    if any(importlib.util.find_spec(m) is None for m in ("flwr", "ray")):
        raise FedL2PError("--engine flower needs Flower's simulation extra: pip install 'fedl2p[flower]'")


def records(obj: Any):
    from flwr.app import ArrayRecord, ConfigRecord, RecordDict
    tensors, skeleton = wire.pack(obj)
    return RecordDict({"tensors": ArrayRecord(torch_state_dict=tensors) if tensors else ArrayRecord(),
                       "wire": ConfigRecord({"skeleton": skeleton})})


def unrecord(content, roots: Collection[str]) -> Any:
    """A message's nest, rebuilt (`wire.unpack`: dataclasses of fedl2p or of the plugin packages `roots`)."""
    # fresh torch allocations, as weights.load_with_meta makes: the received buffers are numpy's, from np.load
    tensors = {k: v.clone() for k, v in content.array_records["tensors"].to_torch_state_dict().items()}
    return wire.unpack(tensors, str(content.config_records["wire"]["skeleton"]), roots)


def client_app(build: Callable[..., Any], args: tuple, update: Callable, roots: Collection[str]):
    """A ClientApp that runs `update(context, task)` on its device; `build(*args)` (`workers.on_runtime`: the context
    placed on the runtime's device) once per process. `roots`: the run's plugin packages (`wire.plugin_roots`)."""
    from flwr.app import Message
    from flwr.clientapp import ClientApp
    app = ClientApp()

    @app.train()
    def train(msg, context):
        import torch
        torch.set_num_threads(1)
        key = (build.__module__, build.__qualname__, repr(args))
        if key not in _CONTEXTS:
            _CONTEXTS[key] = build(*args)
        return Message(records(_CONTEXTS[key](update, unrecord(msg.content, roots))), reply_to=msg)

    return app


def wait_nodes(grid, expected: int, timeout: float = 120.0) -> list[int]:
    """The SuperNodes' ids, once all `expected` have registered (the runtime starts them beside the ServerApp)."""
    end = time.monotonic() + timeout
    while len(ids := sorted(grid.get_node_ids())) < expected:
        if time.monotonic() > end:
            raise FedL2PError(f"only {len(ids)} of {expected} Flower SuperNodes registered within {timeout:.0f} s")
        time.sleep(0.1)
    return ids


def exchange(grid, payloads: list, nodes: list[int], roots: Collection[str], timeout: float | None = None) -> list[Any]:
    """Send payload i as a `train` Message to nodes[i]; the unpacked replies in payload order (`roots`: the plugin
    packages whose dataclasses a reply may hold). A node that sends an error, or no reply within `timeout` seconds,
    gives `rounds.Failed` in its place (the round's policy decides)."""
    from flwr.app import Message
    msgs = [Message(records(p), dst_node_id=n, message_type="train", group_id=str(i))
            for i, (p, n) in enumerate(zip(payloads, nodes))]
    return collect(grid.send_and_receive(msgs, timeout=timeout), len(payloads), roots, timeout)


def collect(replies, n: int, roots: Collection[str], timeout: float | None = None) -> list[Any]:
    """The unpacked contents of replies to messages 0..n-1 (by group id), `rounds.Failed` for an error or none."""
    by_id = {int(r.metadata.group_id): r for r in replies}
    out: list[Any] = []
    for i in range(n):
        r = by_id.get(i)
        if r is None:
            out.append(Failed("no reply" + (f" within {timeout:g} s" if timeout else "")))
        elif r.has_error():
            out.append(Failed(f"the site reported an error: {r.error.reason}"))
        else:
            out.append(unrecord(r.content, roots))
    return out


class FlowerPool:
    """`map(tasks)` -> results in task order, computed by ClientApps in Flower's simulation runtime (Ray backend,
    `workers` ClientApps at a time, one CPU and one torch thread each)."""

    def __init__(self, workers: int, build: Callable[..., Any], args: tuple, update: Callable, nodes: int,
                 roots: Collection[str], gpus_per_client: float = 0.0, timeout: float | None = None):
        self.timeout, self.roots = timeout, roots
        require_flower()
        from flwr.serverapp import ServerApp
        from flwr.simulation import run_simulation
        logging.getLogger("flwr").setLevel(logging.WARNING)
        self._tasks: queue.Queue = queue.Queue()
        self._results: queue.Queue = queue.Queue()
        server = ServerApp()

        @server.main()
        def main(grid, context):
            while (tasks := self._tasks.get()) is not None:
                try:
                    self._results.put(self._round(grid, tasks, nodes))
                except FedL2PError as e:  # handed to the caller of map()
                    self._results.put(e)
                except Exception as e:  # noqa: BLE001
                    self._results.put(FedL2PError(f"Flower round failed: {type(e).__name__}: {e}"))

        # Ray schedules ClientApps by these resources: 0.25 GPU per client runs four at a time on each GPU
        init = {"num_cpus": workers, "logging_level": "ERROR", "log_to_driver": False, "include_dashboard": False}
        if gpus_per_client > 0:
            import torch
            init["num_gpus"] = torch.cuda.device_count()
        backend = {"client_resources": {"num_cpus": 1, "num_gpus": float(gpus_per_client)}, "init_args": init}
        # in this context's copy: the simulation's in-process apps look pieces up in the run's catalog
        self._thread = threading.Thread(target=contextvars.copy_context().run, daemon=True,
                                        args=(self._simulate, run_simulation, server,
                                              client_app(build, args, update, roots),
                                              nodes, backend))
        self._thread.start()

    def _simulate(self, run_simulation, server, client, nodes: int, backend: dict) -> None:
        try:
            run_simulation(server_app=server, client_app=client, num_supernodes=nodes, backend_config=backend)
        except BaseException as e:  # noqa: BLE001
            self._results.put(FedL2PError(f"Flower simulation failed: {e}"))

    def _round(self, grid, tasks: list[Any], expected: int) -> list[Any]:
        nodes = wait_nodes(grid, expected)
        return exchange(grid, tasks, [nodes[i % len(nodes)] for i in range(len(tasks))], self.roots,  # typed tasks
                        self.timeout)

    def map(self, tasks: list[Any]) -> list[Any]:
        self._tasks.put(tasks)
        while True:
            try:
                r = self._results.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive():
                    raise FedL2PError("Flower simulation ended before the round's results came back") from None
        if isinstance(r, BaseException):
            raise r
        return r

    def close(self) -> None:
        if self._thread.is_alive():
            self._tasks.put(None)
            self._thread.join(timeout=60)

    def __enter__(self) -> FlowerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
