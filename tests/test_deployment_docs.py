"""docs/deployment.md's instructions as an operator follows them: its site-file example writes a file the site's
ClientApp accepts."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from fedl2p_cli.flower import app as flower_app

DOC = Path(__file__).resolve().parents[1] / "docs" / "deployment.md"


def test_the_site_file_example_writes_what_a_site_loads(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    code = next(b for b in blocks if "def write_site" in b)
    env: dict = {}
    exec(compile(code, str(DOC), "exec"), env)  # the page's code, as written
    images = torch.randint(0, 256, (10, 1, 8, 8), dtype=torch.uint8)
    labels = [i % 3 for i in range(10)]
    site_input = {"shape": [1, 8, 8], "mean": [0.5], "std": [0.25], "classes": 3}
    env["write_site"](images, labels, site_input, 7, 42, path=str(tmp_path / flower_app.SITE_FILE))
    client, data = flower_app.load_site(str(tmp_path))
    assert client == 42 and data.train[0].shape == (7, 1, 8, 8) and data.val[1].tolist() == [1, 2, 0]
    torch.testing.assert_close(data.train[0][0], (images[0].float() / 255 - 0.5) / 0.25)


def test_the_steps_create_the_state_folder_and_name_the_sites():
    text = DOC.read_text()
    assert "mkdir -p -m 700 ~/fedl2p-state" in text.split("flower-superlink --ssl-ca-certfile")[0]
    assert "--site-names" in text and "fedl2p flower app flower_app" not in text


def test_a_site_imports_only_the_modules_it_allows(monkeypatch):
    """The server's run config names the model and plugins; a site imports none of them unless it allows it."""
    import pytest

    from fedl2p_cli import plugins
    from fedl2p_cli.errors import FedL2PError
    monkeypatch.delenv("FEDL2P_ALLOW_IMPORT", raising=False)
    builtin = {"model": "cnn", "plugins": []}
    foreign = {"model": "evil.payload:build", "plugins": ["evil_plugin"]}
    site = plugins.build()  # a site process, started without an allow list
    assert flower_app.site_code(builtin, {}, site) == []
    with pytest.raises(FedL2PError, match="import evil_plugin, evil.payload: if the site trusts it"):
        flower_app.site_code(foreign, {}, site)
    assert flower_app.site_code(foreign, {"allow-import": "evil_plugin,evil"}, site) == ["evil_plugin"]
    monkeypatch.setenv("FEDL2P_ALLOW_IMPORT", "evil_plugin,evil.payload")
    site = plugins.build()  # a site process started with FEDL2P_ALLOW_IMPORT
    assert flower_app.site_code(foreign, {}, site) == ["evil_plugin"]
    # the server's run config carries its own allow list in its runtime: a site does not take it
    sent = flower_app.Runtime(allow_import=("evil",)).to_dict()
    assert flower_app.site_runtime(sent, {"device": "cpu"}).allow_import == ()
