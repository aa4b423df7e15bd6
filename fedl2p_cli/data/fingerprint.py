"""The data a partition read, as one content hash (its "fingerprint"): part of the partition's id, so changed data is
a new id and the same data at another path the same one.

The hash covers what the source returned (images, labels, domains, groups, their names, the normalisation constants),
not the files it came from: gzip or not, another folder, the same arrays give the same fingerprint. Computing it
means loading the data, so it is cached in the store (`.fingerprints.json`) under the source, the partition's options
and the path, size and mtime of every file the source reads; a re-run that finds its key only stats those files."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ..artifacts import StoreIndex

if TYPE_CHECKING:
    from .datasets import Dataset

CACHE = ".fingerprints.json"

# the built-in data whose partitions were made before the fingerprint existed: their ids leave it out (they keep the
# ids they had), and only this exact content does (tests/test_fingerprint.py loads each and checks the constant)
KNOWN = {
    "sha256:589e1ee77b9014bf70aa2b3c4609e3d1956c21dd6e2ca54b57d2f78c6a86de49": "Debian's dataset-fashion-mnist",
    "sha256:1e5dd70d9eec6d614153395ad87a843d74c2f8e8744523e1f7d1fea44d70fb6a": "scikit-learn's bundled digits",
}


def of(ds: Dataset) -> str:
    """The content hash of a dataset: every array's dtype, shape and bytes, its names, and its normalisation constants
    to 6 significant digits (a constant computed from the images may differ in its last bit on another CPU)."""
    h = hashlib.sha256()
    for name in ("images", "labels", "domains", "groups"):
        t = getattr(ds, name)
        if t is None:
            h.update(f"{name}:none;".encode())
            continue
        a = t.detach().cpu().contiguous().numpy()
        h.update(f"{name}:{a.dtype.str}:{a.shape};".encode())
        h.update(memoryview(a).cast("B"))
    meta = {"classes": list(ds.classes), "domain_names": ds.domain_names, "group_names": ds.group_names,
            "mean": [f"{float(v):.6g}" for v in ds.mean], "std": [f"{float(v):.6g}" for v in ds.std]}
    h.update(json.dumps(meta, sort_keys=True).encode())
    return "sha256:" + h.hexdigest()


def stamps(paths: Iterable[Path]) -> list[list]:
    """[path, size, mtime_ns] of every file of `paths` (a folder: every file below it, in order); a folder's files
    by their path under it (one scandir and one stat each: a DomainNet-sized folder is hundreds of thousands)."""
    out: list[list] = []
    for p in paths:
        root = Path(p).resolve()
        if root.is_dir():
            out += [[f"{root}/{rel}", size, mtime] for rel, size, mtime in _walk(str(root), "")]
        elif root.exists():
            st = root.stat()
            out.append([str(root), st.st_size, st.st_mtime_ns])
    return out


def _walk(folder: str, prefix: str) -> Iterator[tuple[str, int, int]]:
    with os.scandir(folder) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        if e.is_dir():
            yield from _walk(e.path, f"{prefix}{e.name}/")
        elif e.is_file():
            st = e.stat()
            yield f"{prefix}{e.name}", st.st_size, st.st_mtime_ns


def cache_key(source: str, config: dict, reads: list[Path] | None) -> str | None:
    """The cache key of a partition's data: its source, options and the (path, size, mtime) of each file the source
    reads. None where the source reads no file it can name (nothing is cached: the data is loaded to hash it)."""
    files = stamps(reads or [])
    if not files:
        return None
    key = json.dumps({"source": source, "config": config, "files": files}, sort_keys=True, default=str)
    return hashlib.sha256(key.encode()).hexdigest()


class Cache(StoreIndex):
    """The fingerprints a store has computed, by cache key."""

    def __init__(self, root: Path):
        super().__init__(root, CACHE)

    def get(self, key: str | None) -> str | None:
        v = super().get(key)
        return v if isinstance(v, str) and v.startswith("sha256:") else None


def options(cfg: object) -> dict:
    """The partition's options as the cache key sees them (a loader receives them all)."""
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}  # type: ignore[arg-type]


def known(fingerprint: str) -> str | None:
    """What a built-in fingerprint is (None: not one of them)."""
    return KNOWN.get(fingerprint)

