"""The documentation as a user meets it: pages speak of the current code (no work log outside the changelog), and the
built site renders in a real browser: no table left as literal `|` text, no image that does not load, no formula
that KaTeX did not typeset."""

from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHANGELOG = {ROOT / "CHANGELOG.md", ROOT / "docs" / "changelog.md"}
PAGES = [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))] if p not in CHANGELOG]

# Words and patterns of a work log: history belongs in CHANGELOG.md, not in a page that says what the code does.
WORK_LOG = [
    r"must[- ]shows?",
    r"\bsessions?\b",
    r"\bwork[- ]?logs?\b",
    r"\bthis (?:shared |development |idle )?(?:\d-core )?machine\b",
    r"\b\d-core (?:cpu )?machine\b",
    r"\b20\d\d-[01]\d-[0-3]\d\b",                           # a date of work
    r"\bcommit [0-9a-f]{7,40}\b",
    r"(?<![\w./-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w/-])",  # a hash in prose (code spans are exempt)
]
WORK_LOG_RE = re.compile("|".join(WORK_LOG), re.IGNORECASE)


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, text) of a Markdown file without fenced code blocks and inline code spans: an artifact id in a
    command is an example, a hash in a sentence is a log."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, re.sub(r"`[^`]*`", "", line)))
    return out


def work_log_hits(text: str) -> list[str]:
    return [f"{n}: {m.group(0)!r}" for n, line in prose(text) for m in WORK_LOG_RE.finditer(line)]


def test_the_work_log_check_catches_what_it_should():
    assert work_log_hits("measured in the fourth session")
    assert work_log_hits("two unmet must-shows")
    assert work_log_hits("on this shared 2-core machine")
    assert work_log_hits("Before 2026-11-24 a partition")
    assert work_log_hits("artifacts built by commit 0d3e52d")
    assert work_log_hits("(sha256 d6538a55…)")
    assert not work_log_hits("wrote stats artifact `0ac1117eb52b`")
    assert not work_log_hits("```\nfedl2p report 3f2a9c1e\n```")
    assert not work_log_hits("torch 2.14.1 on 2 CPU cores, e = 5, 1e-3, ResNet-18")


def test_no_page_outside_the_changelog_reads_as_a_work_log():
    assert len(PAGES) > 30
    bad = [f"{p.relative_to(ROOT)}:{hit}" for p in PAGES for hit in work_log_hits(p.read_text())]
    assert not bad, "history belongs in CHANGELOG.md:\n" + "\n".join(bad)


# --- the built site in headless Chromium ---

CHROMIUM = next((c for c in ("chromium", "chromium-browser", "google-chrome") if shutil.which(c)), None)

# Every page in its own frame: the check page's load event waits for all of them (their images and scripts
# included), and its handler records what each page shows before Chromium dumps the DOM.
CHECK_PAGE = """<!doctype html><meta charset="utf-8"><pre id="result">pending</pre>
%s
<script>
function check(f) {
  const d = f.contentDocument, problems = [];
  for (const i of d.querySelectorAll("article img"))
    if (!i.complete || !i.naturalWidth) problems.push("image does not load: " + i.getAttribute("src"));
  for (const p of d.querySelectorAll("article p, article li"))
    for (const line of p.textContent.split("\\n"))
      if (/^\\s*\\|.*\\|\\s*$/.test(line)) problems.push("table row left as text: " + line.trim().slice(0, 100));
  for (const e of d.querySelectorAll(".arithmatex"))
    if (!e.querySelector(".katex") || e.querySelector(".katex-error"))
      problems.push("formula not typeset: " + e.textContent.trim().slice(0, 100));
  return [f.getAttribute("src"), d.querySelectorAll("article").length, problems];
}
window.addEventListener("load", () => {
  document.getElementById("result").textContent = JSON.stringify([...document.querySelectorAll("iframe")].map(check));
});
</script>"""
FRAME = '<iframe src="%s" style="width:1280px;height:2000px"></iframe>'



def build_site(out: Path) -> None:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def render_all(site: Path) -> list:
    """Every page of the site, loaded one after another by one headless Chromium from a local HTTP server."""
    folders = sorted(p.parent.relative_to(site).as_posix() for p in site.rglob("index.html"))
    pages = ["/" if f == "." else f"/{f}/" for f in folders if f != "search"]
    (site / "_check.html").write_text(CHECK_PAGE % "\n".join(FRAME % page for page in pages))
    handler = functools.partial(QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/_check.html"
        dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", url],
                             capture_output=True, text=True, timeout=180).stdout
    finally:
        server.shutdown()
    m = re.search(r'<pre id="result">(.*?)</pre>', dom, re.S)
    assert m and m.group(1) != "pending", "the check page did not finish: " + dom[-500:]
    return json.loads(m.group(1).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"'))


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium)")
@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="mkdocs is not installed: pip install -e '.[docs]'")
def test_every_page_renders_in_a_browser(tmp_path):
    site = tmp_path / "site"
    build_site(site)
    results = render_all(site)
    assert len(results) >= 30, results  # every page of the nav was visited
    assert all(articles for _, articles, _ in results), "a page rendered without its content"
    bad = [f"{url}: {problem}" for url, _, problems in results for problem in problems]
    assert not bad, "\n".join(bad)
