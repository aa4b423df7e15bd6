"""`fedl2p report`: the page is an artifact (id from its inputs), holds every table and plot of its lineage, opens in
a browser with every image decoded; a pipeline not yet run is one line; tables survive a pipe."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from fedl2p_cli.cli.main import run_cli
from fedl2p_cli.stages import report

from .conftest import TINY_PARTITION
from .helpers import execute, handed

PIPELINE = """
name = "tiny-meta"
[partition]
{partition}
[pretrain]
rounds = 3
fraction = 0.5
batch_size = 16
eval_every = 1
seed = 0
[stats]
[[meta-train]]
preset = "paper"
rounds = 2
fraction = 0.5
epochs = 1
batch_size = 16
base_lr = 0.01
meta_grad = "ift"
beta_init = 0.5
"""


def pipeline_file(tmp_path):
    """A pipeline whose artifacts are the tiny store's (the same configs): partition, pretrain, stats, meta-train."""
    lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in TINY_PARTITION.items())
    f = tmp_path / "tiny-meta.toml"
    f.write_text(PIPELINE.format(partition=lines))
    return f


def lineage_pngs(store, art) -> int:
    return sum(f.endswith(".png") for a in report.lineage(store, art) for f in a.manifest["files"])


def test_report_is_an_artifact_with_every_table_and_plot(tiny_store, tmp_path):
    store, pers = tiny_store["store"], tiny_store["personalize"]
    f = pipeline_file(tmp_path)
    assert run_cli(["report", str(f), pers.id[:8], "--store", str(store.root), "-o", str(tmp_path / "r.html")]) == 0
    sections = [report.from_pipeline(f, store.root, handed())[0], report.from_artifact(store, pers.id)]
    assert [a.id for _, a in sections[0].arts] == [tiny_store[k].id for k in ("partition", "pretrain", "stats", "meta")]
    art, reused = execute(report, sections, store)
    assert reused and art.stage == "report"  # the CLI built it; the same inputs name the same artifact
    page = art.file("report.html").read_text()
    assert (tmp_path / "r.html").read_text() == page
    assert page.count("<svg") == 2 and all(f'href="#art-{i}"' in page for i in art.parents.values())
    for caption in ("Personalised test accuracy (%), mean ± SD over seeds [0]", "Accuracy (%) per domain, seen clients",
                    "β per domain and BN layer, ", "η per tensor and domain, ", "Config (what differs from the defaults)"):
        assert caption in page, caption
    assert "<td>dataset</td><td>digits-c</td><td>fmnist-c</td>" in page  # a setting, its value, its default
    assert page.count('src="data:image/png;base64,') == lineage_pngs(store, pers) > 0  # every plot, once each
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in page  # offline
    # another set of inputs is another report
    assert execute(report, [sections[1]], store)[0].id != art.id


def test_pipeline_not_run_yet_is_one_line(tmp_path, capsys):
    f = pipeline_file(tmp_path)
    store = tmp_path / "empty"
    assert run_cli(["report", str(f), "--store", str(store)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no partition artifact" in err[0] and f"fedl2p run {f}" in err[0]
    assert not store.exists()  # nothing written


def test_unknown_id_is_one_line(tiny_store, capsys):
    assert run_cli(["report", "ffffffffff", "--store", str(tiny_store["store"].root)]) == 2
    assert "no artifact with id 'ffffffffff'" in capsys.readouterr().err


def chromium() -> str | None:
    return next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


CHECK = """<script>addEventListener('load', () => {
  const imgs = [...document.images];
  const out = document.createElement('pre'); out.id = 'browser-check';
  out.textContent = JSON.stringify({images: imgs.length, decoded: imgs.filter(i => i.complete && i.naturalWidth > 0).length,
    tables: [...document.querySelectorAll('.tbl')].map(t => t.querySelector('.cap')?.textContent || ''),
    rows: [...document.querySelectorAll('table')].map(t => t.rows.length), svg: document.querySelectorAll('svg rect').length,
    width: document.documentElement.scrollWidth});
  document.body.appendChild(out);
});</script></body>"""


def test_report_renders_in_headless_chromium(tiny_store, tmp_path):
    browser = chromium()
    if browser is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    store, pers = tiny_store["store"], tiny_store["personalize"]
    art, _ = execute(report, [report.from_artifact(store, pers.id)], store)
    page = tmp_path / "page.html"  # the report with a probe appended (the artifact itself stays as it is)
    page.write_text(art.file("report.html").read_text().replace("</body>", CHECK))
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,900",
                          "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'<pre id="browser-check">(.*?)</pre>', dom, re.S)
    assert found, "the page did not finish loading in chromium"
    got = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    want_images = lineage_pngs(store, pers)
    assert got["images"] == want_images and got["decoded"] == want_images  # every plot there and decodable
    caps = got["tables"]
    for title in ("Personalised test accuracy (%), seen clients", "Accuracy (%) per domain, seen clients",
                  "β per domain and BN layer", "η per tensor and domain", "Metrics", "Training"):
        assert any(c.startswith(title) for c in caps), title
    assert min(got["rows"]) >= 2 and got["svg"] == len(report.lineage(store, pers))  # no empty table; a box per artifact
    assert got["width"] <= 1280  # nothing forces a horizontal scroll at 1280 px


def test_tables_are_markdown_through_a_pipe(tiny_store, capsys):
    assert run_cli(["artifacts", "list", "--store", str(tiny_store["store"].root)]) == 0
    out = capsys.readouterr().out
    assert not set("┃│━─┏") & set(out)  # no rich box
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| stage | id | created |")
    stats_row = next(r for r in rows if r.startswith("| stats | "))
    assert tiny_store["stats"].id in stats_row and len(stats_row) > 80  # one line, whatever its width
