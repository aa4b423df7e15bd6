import pytest

from fedl2p_cli.artifacts import Store, artifact_id
from fedl2p_cli.errors import ArtifactError

from .helpers import handed


def make(store, config=None):
    d = store.draft("partition", config or {"a": 1}, {})
    d.path("data.bin").write_bytes(b"hello world" * 100)
    d.metrics = {"x": 1.0}
    return d.publish()


def test_same_inputs_same_id_and_verify(tmp_path):
    s = Store(tmp_path)
    a = make(s)
    assert a.id == artifact_id("partition", {"a": 1}, {})
    assert artifact_id("partition", {"a": 2}, {}) != a.id
    loaded = s.load("partition", a.id[:5])
    assert loaded.metrics == {"x": 1.0}


def test_one_corrupted_byte_fails_loading(tmp_path):
    s = Store(tmp_path)
    a = make(s)
    p = a.path / "data.bin"
    raw = bytearray(p.read_bytes())
    raw[10] ^= 1
    p.write_bytes(bytes(raw))
    with pytest.raises(ArtifactError, match="sha256"):
        s.load("partition", a.id)


def test_crash_mid_write_leaves_no_artifact(tmp_path):
    from fedl2p_cli.stages.common import build_or_reuse
    s = Store(tmp_path)

    def build(draft):
        draft.path("half.bin").write_bytes(b"x")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        build_or_reuse(s, "partition", {"b": 1}, {}, build, False, handed())
    assert s.ids("partition") == []
    assert list(tmp_path.iterdir()) == []  # no artifact, no temporary folder, no empty stage folder, no lock


def test_unknown_and_ambiguous_ids(tmp_path):
    s = Store(tmp_path)
    make(s)
    with pytest.raises(ArtifactError, match="no partition artifact with id"):
        s.resolve("partition", "zzzz")
    with pytest.raises(ArtifactError, match="no pretrain artifact"):
        s.resolve("pretrain", None)


@pytest.mark.parametrize("edit", ["config", "parents"])
def test_edited_manifest_fails_verification(tmp_path, edit):
    import json
    s = Store(tmp_path)
    a = make(s)
    s.load("partition", a.id)  # untouched: verifies
    mf = a.path / "manifest.json"
    m = json.loads(mf.read_text())
    if edit == "config":
        m["config"]["rounds"] = 500
    else:
        m["parents"]["pretrain"] = "0123456789ab"
    mf.write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="manifest does not match its id"):
        s.load("partition", a.id)


def test_layering_algorithms_import_only_core():
    """algorithms/ holds client updates over core/ alone (a sibling algorithm may reuse another's client update,
    e.g. pFedLA's local SGD is FedAvg's; a meta-gradient implements the floor's Protocol, protocols.py),
    algorithms/systems/ the pFL systems' round strategies; core/ imports nothing of the package outside core/ (read
    from the import statements themselves)."""
    import ast
    from pathlib import Path
    pkg = Path(__file__).resolve().parent.parent / "fedl2p_cli"
    # a round strategy (algorithms/systems/, and FedL2P's own loop, meta_loop.py, which the meta-train stage and the
    # Flower ServerApp both run) also speaks the engine's round vocabulary (LoopState, OnDevice), builds models and
    # writes their weights; never the stages, the CLI or the catalog's lookups
    rounds = {"core", "algorithms", "engine", "io", "models", "configs", "errors", "artifacts"}
    for layer, allowed in (("algorithms", {"core", "algorithms", "protocols"}), ("core", {"core"})):
        for f in (pkg / layer).glob("*.py"):
            ok = allowed | rounds | {"protocols"} if (layer, f.name) == ("algorithms", "meta_loop.py") else allowed
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level > 0:
                    target = (node.module or "").split(".")[0] if node.level == 2 else layer
                    assert target in ok, f"{layer}/{f.name} imports from {'.' * node.level}{node.module}"
    # algorithms/systems/: of the catalog only its type, the one fedl2p hands a system (`self.catalog`, its models'
    # pieces)
    for f in (pkg / "algorithms" / "systems").glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 3:
                target = (node.module or "").split(".")[0]
                handed = target == "catalog" and [a.name for a in node.names] == ["Catalog"]
                assert target in rounds or handed, f"algorithms/systems/{f.name} imports from ...{node.module}"


def test_the_newest_artifact_is_unambiguous_within_one_second(tmp_path):
    """Many artifacts published in the same second (a script's loop): "the newest" is the last one published, not
    an arbitrary one of those sharing the one-second `created` stamp."""
    store = Store(tmp_path)
    made = []
    for i in range(6):
        d = store.draft("stats", {"i": i}, {"pretrain": "p"})
        d.path("f.txt").write_text(str(i))
        made.append(d.publish())
    assert len({a.manifest["created"] for a in made}) < len(made)  # the old stamp ties (else the test proves nothing)
    assert store.load("stats").id == made[-1].id
    assert store.newest("stats", lambda a: a.config["i"] < 4).id == made[3].id
    assert store.newest("stats", lambda a: False) is None
