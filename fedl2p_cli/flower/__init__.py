"""Everything Flower, in one package (an optional extra: pip install 'fedl2p[flower]'):
- `executor` and `simulation`: `--engine flower`, a round's clients as ClientApps in Flower's simulation runtime;
- `wire`: tensors and dataclasses as Flower records, both ways, checked where they enter;
- `app`: the deployable ServerApp and ClientApp (`flwr run`), which read the store and a site's own data, and
  `project/pyproject.toml`, the app project `fedl2p flower app` writes;
- `certs`: the TLS certificates and SuperNode keys of a deployment;
- `gateway` and `fleet_routes`: the Fleet gateway in front of a SuperLink (what faces the network);
- `config`: the options of the `fedl2p flower` commands (cli/flower.py), declared once.
Nothing outside this package imports it but builtin.py (the executor's registration) and the CLI."""
