"""The artifact store: content-addressed ids, manifests, atomic publish, hash verification.

An artifact is `<root>/<stage>/<id>/` with `manifest.json` and the stage's files. Stages write into a
temporary sibling folder and publish it with one `os.replace`, so a crash never leaves a half artifact
under a real id. Long stages keep resumable checkpoints in `<root>/<stage>/.work-<id>/`.

While an artifact is being built its builder holds an exclusive lock (`.lock-<id>`, flock): a second process
asking for the same artifact is refused instead of writing into the same checkpoints, and temporary folders
whose builder is gone (killed) are recognised by their free lock and removed by the next build in that stage.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__, stage_table  # stage_table: the store's folders (its names), in pipeline order
from .errors import ArtifactError
from .runtime import Runtime

if TYPE_CHECKING:
    from .catalog import Catalog

SCHEMA_VERSION = 1


def _stderr(message: str) -> None:
    import sys
    print(message, file=sys.stderr, flush=True)


ENV_STORE = "FEDL2P_STORE"


def default_root() -> Path:
    return Path(os.environ.get(ENV_STORE, "artifacts"))


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def artifact_id(stage: str, config: dict, parents: dict[str, str]) -> str:
    """Short hash of (stage, schema, config, parents): same inputs, same id."""
    key = canonical_json({"stage": stage, "schema": SCHEMA_VERSION, "config": config, "parents": parents})
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class Artifact:
    """A published, verified artifact."""

    path: Path
    manifest: dict

    @property
    def id(self) -> str:
        return self.manifest["id"]

    @property
    def stage(self) -> str:
        return self.manifest["stage"]

    @property
    def config(self) -> dict:
        return self.manifest["config"]

    @property
    def parents(self) -> dict[str, str]:
        return self.manifest["parents"]

    @property
    def age(self) -> tuple:
        """Sort key of "the newest": creation time in ns (artifacts written before it existed: 0, then their
        one-second `created`), then the id, so equal times still give one answer."""
        return self.manifest.get("created_ns", 0), self.manifest.get("created", ""), self.id

    @property
    def metrics(self) -> dict:
        return self.manifest.get("metrics", {})

    def file(self, name: str) -> Path:
        p = self.path / name
        if name not in self.manifest["files"]:
            raise ArtifactError(f"artifact {self.stage}/{self.id} has no file '{name}'")
        return p


@dataclass
class Draft:
    """An artifact being written: files go into `tmp`, `publish` moves it into place atomically."""

    store: Store
    stage: str
    id: str
    config: dict
    parents: dict[str, str]
    tmp: Path
    metrics: dict = field(default_factory=dict)
    plugins: list[dict] = field(default_factory=list)  # the plugins whose pieces made it (not part of the id)
    build_s: float | None = None  # how long the build took (not part of the id; resumed builds: the last part only)
    tracking: dict | None = None  # the experiment-tracker run that logged the build (--track; not part of the id)
    computed_on: dict | None = None  # where the work ran (Runtime.describe); None: this process's CPU
    data: dict | None = None  # a partition's data: its fingerprint (data/fingerprint.py; in the id through the config)
    observers: tuple = ()  # what watches the build's rounds besides its progress bar (--track's logger; not written)

    def path(self, name: str) -> Path:
        return self.tmp / name

    def publish(self) -> Artifact:
        files = {p.name: sha256_file(p) for p in sorted(self.tmp.iterdir()) if p.is_file()}
        manifest = {
            "id": self.id,
            "stage": self.stage,
            "schema": SCHEMA_VERSION,
            "package_version": __version__,
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "created_ns": time.time_ns(),  # orders "the newest": two artifacts made in the same second do not tie
            "config": self.config,
            "parents": self.parents,
            "files": files,
            "metrics": self.metrics,
            "computed_on": self.computed_on or Runtime().describe(),  # where the work ran; not part of the id
        }
        if self.data is not None:
            manifest["data"] = self.data
        if self.plugins:  # what must be installed to load it
            manifest["plugins"] = self.plugins
        if self.build_s is not None:
            manifest["build_s"] = round(self.build_s, 3)
        if self.tracking is not None:
            manifest["tracking"] = self.tracking
        (self.tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str))
        final = self.store.root / self.stage / self.id
        if final.exists():  # a concurrent or forced run: replace the old one as a whole
            shutil.rmtree(final)
        os.replace(self.tmp, final)
        shutil.rmtree(self.store.workdir(self.stage, self.id), ignore_errors=True)
        return Artifact(final, manifest)

    def discard(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


class StoreIndex:
    """A JSON table in a store's root (key -> value) that the store keeps beside its artifacts: what it has computed
    once (data fingerprints, a pipeline's ids). A store that cannot be written to only reads; a lost update (two
    processes at once) only costs a recomputation."""

    def __init__(self, root: Path, name: str):
        self.path = Path(root) / name

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def get(self, key: str | None) -> Any:
        return None if key is None else self._read().get(key)

    def put(self, key: str | None, value: Any) -> None:
        if key is None or not self.path.parent.is_dir():
            return  # no store folder yet: a refused build must not create one
        data = self._read() | {key: value}
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.stem.lstrip('.')}-", dir=self.path.parent)
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
            os.replace(tmp, self.path)
        except OSError:
            pass


class Store:
    """A folder of artifacts."""

    def __init__(self, root: Path | str | None = None):
        self.root = Path(root) if root is not None else default_root()

    # -- writing -------------------------------------------------------------------------------
    @contextmanager
    def building(self, stage: str, aid: str, lock_timeout: float | None = None) -> Iterator[None]:
        """Hold the artifact's build lock; clean temporary folders left by dead builders; on the way out remove
        the folders this build created if they stayed empty (a refused build leaves the store as it was). Another
        process building the same artifact is waited for `lock_timeout` seconds (None: as long as it takes; 0: not)."""
        made = [p for p in (self.root, self.root / stage) if not p.exists()]
        (self.root / stage).mkdir(parents=True, exist_ok=True)
        lock = self.root / stage / f".lock-{aid}"
        fd = None
        try:
            fd = self._acquire(lock, f"{stage}/{aid}", lock_timeout)
            self._clean_stale(stage, aid)
            yield
        finally:
            if fd is not None:
                lock.unlink(missing_ok=True)
                os.close(fd)
            for p in reversed(made):
                with suppress(OSError):
                    p.rmdir()  # only if empty

    def _acquire(self, lock: Path, what: str, timeout: float | None) -> int:
        """The build lock's descriptor, once no other process holds it (as huggingface_hub's cache lock: waiting up to
        `timeout` seconds, saying once on stderr what it waits for). A holder removes the lock file on its way out, so
        a lock taken on a file no longer at `lock` is dropped and taken again."""
        deadline = None if timeout is None else time.monotonic() + timeout
        told = False
        while True:
            fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                if deadline is not None and time.monotonic() >= deadline:
                    raise ArtifactError(f"another fedl2p process is building {what} in {self.root}; gave up waiting after "
                                        f"{timeout:g} s (--lock-timeout)") from None
                if not told:
                    limit = "" if timeout is None else f" (at most {timeout:g} s, --lock-timeout)"
                    _stderr(f"waiting for another fedl2p process building {what} in {self.root}{limit}")
                    told = True
                time.sleep(0.2)
                continue
            try:
                if os.fstat(fd).st_ino == os.stat(lock).st_ino:
                    return fd
            except FileNotFoundError:
                pass
            os.close(fd)  # the previous holder unlinked it: lock the file that is there now

    def _clean_stale(self, stage: str, own: str) -> None:
        """Remove `.tmp-<id>-*` folders whose builder is dead: ours (we hold the lock), and any other id whose lock
        file exists and nobody holds. A live builder holds its lock, so its folder is never touched; a folder with no
        lock file at all is left too (seen: an older fedl2p without locks, still writing, lost its folder)."""
        for tmp in (self.root / stage).glob(".tmp-*"):
            aid = tmp.name.split("-")[1]
            if aid == own:
                shutil.rmtree(tmp, ignore_errors=True)
                continue
            other = self.root / stage / f".lock-{aid}"
            try:  # a builder holds its lock file while it lives and a kill leaves the file behind, unlocked
                fd = os.open(other, os.O_RDWR)
            except FileNotFoundError:
                continue  # no lock file: a builder that takes none (an older fedl2p) may still be writing; leave it
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # alive
            finally:
                os.close(fd)  # releases the lock if we took it
            shutil.rmtree(tmp, ignore_errors=True)
            other.unlink(missing_ok=True)

    def draft(self, stage: str, config: dict, parents: dict[str, str]) -> Draft:
        aid = artifact_id(stage, config, parents)
        (self.root / stage).mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{aid}-", dir=self.root / stage))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; a published artifact is an ordinary folder
        return Draft(self, stage, aid, config, parents, tmp)

    def workdir(self, stage: str, aid: str) -> Path:
        """Persistent folder for round checkpoints of a long stage (removed on publish)."""
        return self.root / stage / f".work-{aid}"

    # -- reading -------------------------------------------------------------------------------
    def exists(self, stage: str, aid: str) -> bool:
        return (self.root / stage / aid / "manifest.json").is_file()

    def ids(self, stage: str) -> list[str]:
        d = self.root / stage
        if not d.is_dir():
            return []
        return sorted(p.name for p in d.iterdir() if not p.name.startswith(".") and (p / "manifest.json").is_file())

    def newest(self, stage: str, where: Callable[[Artifact], bool]) -> Artifact | None:
        """The newest artifact of `stage` that satisfies `where` (None if none does)."""
        hits = [a for a in self.iter(stage) if where(a)]
        return max(hits, key=lambda a: a.age) if hits else None

    def iter(self, stage: str | None = None) -> Iterator[Artifact]:
        for s in [stage] if stage else stage_table.TABLE.names:
            for aid in self.ids(s):
                yield self.load(s, aid, verify=False)

    def resolve(self, stage: str, ref: str | None) -> str:
        """An id from a prefix, or the newest artifact of the stage when `ref` is None."""
        ids = self.ids(stage)
        if ref is None:
            if not ids:
                raise ArtifactError(f"no {stage} artifact in {self.root}; run `fedl2p {stage}` first")
            return max((Artifact(self.root / stage / i, self._manifest(stage, i)) for i in ids), key=lambda a: a.age).id
        hits = [i for i in ids if i.startswith(ref)]
        if not hits:
            raise ArtifactError(f"no {stage} artifact with id '{ref}' in {self.root} (see `fedl2p artifacts list`)")
        if len(hits) > 1:
            raise ArtifactError(f"id prefix '{ref}' is ambiguous among {stage} artifacts: {', '.join(hits)}")
        return hits[0]

    def _manifest(self, stage: str, aid: str) -> dict:
        path = self.root / stage / aid / "manifest.json"
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ArtifactError(f"artifact {stage}/{aid}: unreadable manifest ({e.__class__.__name__}); delete it and "
                                f"re-run `fedl2p {stage}`") from None

    def load(self, stage: str, ref: str | None = None, verify: bool = True, catalog: Catalog | None = None) -> Artifact:
        """The artifact, its files verified (`verify`) and, given the reader's `catalog`, the plugins it was made with
        loaded there (what reads only its files, such as a report, hands none)."""
        aid = self.resolve(stage, ref)
        manifest = self._manifest(stage, aid)
        art = Artifact(self.root / stage / aid, manifest)
        if manifest.get("schema") != SCHEMA_VERSION:
            raise ArtifactError(f"artifact {stage}/{aid} has schema {manifest.get('schema')}, this fedl2p reads "
                                f"{SCHEMA_VERSION}; re-run `fedl2p {stage}`")
        if verify:
            self.verify(art)
            if catalog is not None and manifest.get("plugins"):
                from .plugins import check_available
                check_available(manifest["plugins"], f"artifact {stage}/{aid}", catalog)
        return art

    @staticmethod
    def verify(art: Artifact) -> None:
        """Every file's sha256, and the manifest itself: its id must be recomputable from its stage, config and
        parents (an edited config or parent list, or a renamed folder, fails)."""
        m = art.manifest
        if artifact_id(m.get("stage", ""), m.get("config", {}), m.get("parents", {})) != art.id or art.path.name != art.id:
            raise ArtifactError(f"artifact {art.path.parent.name}/{art.path.name}: its manifest does not match its id (config "
                                f"or parents edited?); delete it and re-run `fedl2p {art.path.parent.name}`")
        for name, digest in art.manifest["files"].items():
            p = art.path / name
            if not p.is_file():
                raise ArtifactError(f"artifact {art.stage}/{art.id} is missing '{name}'; delete it and re-run `fedl2p {art.stage}`")
            if sha256_file(p) != digest:
                raise ArtifactError(f"artifact {art.stage}/{art.id}: '{name}' fails its sha256 check (corrupted); delete it "
                                    f"and re-run `fedl2p {art.stage}`")
