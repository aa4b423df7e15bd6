"""`fedl2p partition`: dataset -> partition.h5 (clients, splits, domains, pools, pixels)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from ..artifacts import Artifact, Draft, Store, artifact_id
from ..catalog import Catalog
from ..configs import PartitionConfig
from ..core.config import validate
from ..data import corruptions as corr
from ..data import datasets, fingerprint, sources, speech
from ..data.partition import ClientSplit, choose_unseen, dirichlet_partition, label_entropy, shards_partition, split_client
from ..errors import DataError, FedL2PError
from ..io import partition_h5
from .common import build_or_reuse, config_dict
from .interface import Inputs, Planned, SectionFile, StageContext
from .rows import PARTITION


def default_domains(dataset: str, catalog: Catalog) -> list[str]:
    return list(sources.get(dataset, catalog).domains or corr.DEFAULT_DOMAINS)


def generates(cfg: PartitionConfig, catalog: Catalog) -> bool:
    """Whether this partition's domains are corruptions generated here (their pixels made at partition time)."""
    return sources.get(cfg.dataset, catalog).generates(cfg.corruptions)


def _domains(cfg: PartitionConfig, ds: datasets.Dataset, excluded: np.ndarray | None, catalog: Catalog
             ) -> tuple[list[str], list[np.ndarray], bool]:
    """Domain names, each domain's pool of source indices (without `excluded`), and whether corruptions are
    generated here."""
    generated = generates(cfg, catalog)
    if generated:
        names = cfg.corruptions or default_domains(cfg.dataset, catalog)
        corr.check(names, cfg.severity)
        perm = np.random.default_rng(cfg.seed).permutation(len(ds))
        if excluded is not None:  # before the split, so every domain keeps an equal share
            perm = perm[~np.isin(perm, excluded)]
        return list(names), np.array_split(perm, len(names)), True
    if ds.domains is not None:
        dom = ds.domains.numpy()
        return list(ds.domain_names or []), [np.nonzero(dom == d)[0] for d in range(len(ds.domain_names or []))], False
    return ["all"], [np.arange(len(ds))], False


def speaker_splits(cfg: PartitionConfig, ds: datasets.Dataset) -> list[ClientSplit]:
    """One client per speaker (`ds.groups`), its clips split test / validation / train as for every client."""
    rng = np.random.default_rng(cfg.seed)
    groups, pools = ds.groups.numpy(), ds.domains.numpy()  # type: ignore[union-attr]  # a speakers source sets groups
    out = []
    for g, name in enumerate(ds.group_names or []):
        idx = np.nonzero(groups == g)[0]
        if len(idx) < 3:
            raise FedL2PError(f"speaker {name} has {len(idx)} clips; a client needs at least 3 (train, val, test)")
        out.append(split_client(rng, idx, cfg.val_fraction, cfg.test_fraction, int(pools[idx[0]])))
    return out


def build_partition(cfg: PartitionConfig, ds: datasets.Dataset, excluded: np.ndarray | None = None, *,
                    catalog: Catalog) -> partition_h5.Partition:
    """The clients of `ds` as `cfg` draws them; `catalog` holds its source (what domains it has or generates)."""
    if cfg.clients <= 0:
        raise FedL2PError(f"--clients must be positive, got {cfg.clients}")
    if ds.groups is not None:
        return _assemble(cfg, ds, list(ds.domain_names or []), speaker_splits(cfg, ds), False)
    names, pools, generated = _domains(cfg, ds, excluded, catalog)
    if excluded is not None and not generated:  # e.g. the images a model was pretrained on
        pools = [p[~np.isin(p, excluded)] for p in pools]
    if cfg.clients < len(names):
        raise FedL2PError(f"{len(names)} domains need at least as many clients, got --clients {cfg.clients}")
    unknown = [d for d in cfg.unseen_domains if d not in names]
    if unknown:
        raise FedL2PError(f"unknown --unseen-domains '{unknown[0]}'; domains are: {', '.join(names)}")
    check_domains(cfg, names, generated)
    per_pool = [len(a) for a in np.array_split(np.arange(cfg.clients), len(names))]
    labels = ds.labels.numpy()
    samples = [cfg.domain_samples.get(n, cfg.samples_per_client) for n in names]
    if cfg.scheme == "shards":
        splits = shards_partition(labels, pools, per_pool, samples, cfg.shard_classes,
                                  cfg.val_fraction, cfg.test_fraction, cfg.seed)
    else:
        splits = dirichlet_partition(labels, pools, per_pool, samples, [cfg.domain_alpha.get(n, cfg.alpha) for n in names],
                                     cfg.val_fraction, cfg.test_fraction, cfg.seed)
    return _assemble(cfg, ds, names, splits, generated)


def _assemble(cfg: PartitionConfig, ds: datasets.Dataset, names: list[str], splits: list[ClientSplit],
              generated: bool) -> partition_h5.Partition:
    """Gather the clients' samples (corrupting generated domains once) into a partition."""
    labels = ds.labels.numpy()
    idx = np.concatenate([s.indices() for s in splits])
    images = ds.images[torch.from_numpy(idx)]
    domain = np.array([s.domain for s in splits], dtype=np.int64)
    if generated:  # corrupt each domain's samples once; later stages read the pixels
        starts = np.cumsum([0] + [len(s.indices()) for s in splits])
        for d, name in enumerate(names):
            rows = np.concatenate([np.arange(starts[c], starts[c + 1]) for c in np.nonzero(domain == d)[0]])
            images[rows] = corr.apply(name, images[rows], cfg.domain_severity.get(name, cfg.severity), cfg.seed * 1000 + d)
    offsets = np.cumsum([[0, len(s.train), len(s.val), len(s.test)] for s in splits], axis=1)
    offsets += np.concatenate([[0], np.cumsum([len(s.indices()) for s in splits])[:-1]])[:, None]
    hist = np.stack([np.bincount(labels[s.indices()], minlength=len(ds.classes)) for s in splits])
    if ds.groups is not None:  # the held-out speakers are the unseen pool
        unseen = domain == names.index(speech.POOLS[1])
        attrs = {"seed": cfg.seed, "scheme": "speakers", "speakers": json.dumps(ds.group_names)}
    else:
        unseen = choose_unseen(domain, cfg.unseen_fraction, [names.index(d) for d in cfg.unseen_domains], cfg.seed)
        attrs = {"seed": cfg.seed, "alpha": cfg.alpha, "severity": cfg.severity, "scheme": cfg.scheme}
    own = generated and cfg.normalize == "partition"  # the older behaviour: constants of the corrupted images
    mean, std = datasets.channel_stats(images) if own else (ds.mean, ds.std)
    return partition_h5.Partition(
        dataset=cfg.dataset, images=images, labels=torch.from_numpy(labels[idx]), source_index=torch.from_numpy(idx),
        offsets=offsets.astype(np.int64), domain=domain, unseen=unseen, label_hist=hist, classes=ds.classes,
        domain_names=names, mean=mean, std=std, attrs=attrs)


def check_domains(cfg: PartitionConfig, names: list[str], generated: bool) -> None:
    """The per-domain options name this partition's domains, and each applies where it means something."""
    for opt, values in (("--domain-alpha", cfg.domain_alpha), ("--domain-samples", cfg.domain_samples),
                        ("--domain-severity", cfg.domain_severity)):
        bad = [d for d in values if d not in names]
        if bad:
            raise FedL2PError(f"{opt} names '{bad[0]}', not a domain of this partition ({', '.join(names)})")
    if cfg.domain_alpha and cfg.scheme == "shards":
        raise FedL2PError("--domain-alpha sets Dirichlet concentrations; --scheme shards has none")
    if cfg.domain_severity and not generated:
        raise FedL2PError("--domain-severity applies to generated corruption domains (fmnist-c, digits-c, --corruptions)")


def summary(p: partition_h5.Partition) -> dict:
    ent = label_entropy(p.label_hist)
    rows = []
    for d, name in enumerate(p.domain_names):
        m = p.domain == d
        rows.append({"domain": name, "seen": int((m & ~p.unseen).sum()), "unseen": int((m & p.unseen).sum()),
                     "label_entropy": float(ent[m].mean())})
    return {"clients": p.num_clients, "samples": int(p.labels.numel()), "mean_label_entropy": float(ent.mean()),
            "max_label_entropy": float(np.log(p.num_classes)), "domains": rows}


def check(cfg: PartitionConfig, catalog: Catalog) -> None:
    """Reject bad input before anything is read or written."""
    validate(cfg)
    src = sources.get(cfg.dataset, catalog)
    for opt in sources.OPTIONS:
        if getattr(cfg, opt) is not None and opt not in src.options:
            raise FedL2PError(f"--{opt.replace('_', '-')} does not apply to --dataset {cfg.dataset}")
    if src.speakers:
        check_speech(cfg)
        return
    if src.domains is not None or (cfg.corruptions and not src.corruption_files):
        corr.check(cfg.corruptions or default_domains(cfg.dataset, catalog), cfg.severity)
    elif src.corruption_files:
        bad = [c for c in cfg.corruptions or [] if c not in src.corruption_files]
        if bad:
            raise FedL2PError(f"unknown {cfg.dataset} corruption '{bad[0]}' (--corruptions); choose from: "
                              f"{', '.join(src.corruption_files)}")


def check_speech(cfg: PartitionConfig) -> None:
    """Speech partitions are natural (a client per speaker): the options that shape other partitions are refused."""
    inapplicable = [("--scheme", cfg.scheme != "dirichlet"), ("--corruptions", cfg.corruptions is not None),
                    ("--unseen-domains", bool(cfg.unseen_domains)), ("--exclude", cfg.exclude is not None),
                    ("--domain-alpha", bool(cfg.domain_alpha)), ("--domain-samples", bool(cfg.domain_samples)),
                    ("--domain-severity", bool(cfg.domain_severity))]
    for opt, given in inapplicable:
        if given:
            raise FedL2PError(f"{opt} does not apply to {cfg.dataset}: its clients are its speakers, one each")
    seen, _ = cfg.speakers()
    if seen < 1:
        raise FedL2PError(f"--clients {cfg.clients} with --unseen-fraction {cfg.unseen_fraction} leaves no seen speakers")


def data_dir(cfg: PartitionConfig) -> Path | None:
    """Where the source reads its files: --data-dir, else FEDL2P_DATA (None if neither)."""
    return Path(cfg.data_dir) if cfg.data_dir else datasets.env_data_dir()


def load_source(cfg: PartitionConfig, catalog: Catalog) -> datasets.Dataset:
    """The dataset a partition is drawn from, as its registered source loads it, validated (data/validate.py)."""
    return sources.load(cfg, data_dir(cfg), catalog)


def with_data(config: dict, fp: str) -> dict:
    """A partition's identity: its options and the fingerprint of its data, left out for the built-in data whose
    partitions existed before it (their ids stay what they were: data/fingerprint.py KNOWN)."""
    return config if fingerprint.known(fp) else config | {"data": fp}


def identify(cfg: PartitionConfig, store: Store, config: dict, force: bool, catalog: Catalog
             ) -> tuple[datasets.Dataset | None, str, Callable[[], None]]:
    """The dataset (None when the store's fingerprint cache answered for an artifact that exists), its fingerprint,
    and what records it in the cache once the store exists."""
    src = sources.get(cfg.dataset, catalog)
    key = fingerprint.cache_key(cfg.dataset, fingerprint.options(cfg), src.read_paths(cfg, data_dir(cfg)))
    cache = fingerprint.Cache(store.root)
    fp = cache.get(key)
    if fp is not None and not force and store.exists("partition", artifact_id("partition", with_data(config, fp), {})):
        return None, fp, lambda: None
    ds = load_source(cfg, catalog)
    fp = fingerprint.of(ds)
    return ds, fp, lambda: cache.put(key, fp)


def execute(cfg: PartitionConfig, inputs: Inputs, ctx: StageContext) -> tuple[Artifact, bool]:
    """Clients of a dataset -> partition.h5. `exclude` among the inputs (or the config's) is the partition whose images
    these clients must not get."""
    store, catalog = ctx.store, ctx.catalog
    check(cfg, catalog)
    excluded = None
    if inputs.one("exclude") is not None or cfg.exclude:
        ex = inputs.get("exclude", cfg.exclude, stage=PARTITION)
        if _base(ex.value.dataset, catalog) != _base(cfg.dataset, catalog):
            raise FedL2PError(f"--exclude {ex.artifact.id} partitions '{ex.value.dataset}', not the same source images as "
                              f"'{cfg.dataset}'")
        cfg.exclude, excluded = ex.artifact.id, ex.value.source_index.numpy()
    # normalize is part of the id only where it changes the pixels and is not the older behaviour (older artifacts,
    # built before the option existed, keep their ids with --normalize partition)
    quiet: tuple[str, ...] = ("normalize",) if not generates(cfg, catalog) or cfg.normalize == "partition" else ()
    # --image-size came later: the size a source resized to before it (image-folder: 64) keeps those artifacts' ids,
    # and any other choice (keeping the images' size included) is a new one
    if cfg.image_size == sources.get(cfg.dataset, catalog).resized_before:
        quiet += ("image_size",)
    config = config_dict(cfg, exclude=("data_dir", "download", *quiet))
    loaded, fp, remember = identify(cfg, store, config, ctx.force, catalog)

    def build(draft: Draft) -> None:
        ds = loaded if loaded is not None else load_source(cfg, catalog)
        if loaded is None and fingerprint.of(ds) != fp:  # changed under an unchanged size and mtime
            raise DataError(f"the data of --dataset {cfg.dataset} changed while its files kept their size and time; run "
                            "the command again")
        part = build_partition(cfg, ds, excluded, catalog=catalog)
        partition_h5.write(draft.path("partition.h5"), part)
        draft.metrics = summary(part) | ({"source": ds.note} if ds.note else {})
        draft.data = {"fingerprint": fp} | ({"known": fingerprint.known(fp)} if fingerprint.known(fp) else {})
        if ctx.plot:
            from ..analysis.plots import label_mix_heatmap
            label_mix_heatmap(part.label_hist, part.domain, part.domain_names, part.classes, draft.path("label_mix.png"))

    out = build_or_reuse(store, "partition", with_data(config, fp), {}, build, ctx.force, ctx.runtime)
    remember()  # after the build: a refused one leaves no store folder behind
    return out


def plan(file: SectionFile) -> list[Planned]:
    """[partition], and first [pretrain.partition] where the model is pretrained on other clients; `exclude =
    "pretrain"` gives the clients no image of those."""
    own = file.table("pretrain").get("partition")
    part = file.table("partition")
    exclude = part.get("exclude") == "pretrain"
    if exclude and own is None:
        raise FedL2PError(f"pipeline {file.name}: exclude = \"pretrain\" needs a [pretrain.partition] section")
    steps = []
    if own is not None:
        cfg = file.config(PartitionConfig, "pretrain.partition", file.table("pretrain.partition", own))
        steps.append(Planned("pretrain.partition", "partition (pretraining clients)", "pretrain.partition", cfg, {}))
    parents: dict[str, tuple[str, ...]] = {"exclude": ("pretrain.partition",)} if exclude else {}
    steps.append(Planned("partition", "partition", "partition", file.config(PartitionConfig, "partition", part), parents))
    return steps


def _base(dataset: str, catalog: Catalog) -> str:
    """The source whose images a dataset holds (fmnist-c: fmnist); an unregistered one is its own."""
    return sources.get(dataset, catalog).base() if dataset in sources.names(catalog) else dataset


def read(art: Artifact, catalog: Catalog | None = None) -> partition_h5.Partition:
    """The stage's reader (its row's `reader`): the clients a partition artifact holds (a file: no catalog needed)."""
    return partition_h5.read(art.file("partition.h5"))


def load(store: Store, ref: str | None) -> tuple[Artifact, partition_h5.Partition]:
    """A partition artifact (its newest for None) and its clients: for code outside the stages (the Flower sites)."""
    art = store.load("partition", ref)
    return art, read(art)
