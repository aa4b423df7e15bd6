# fedl2p: `make quickstart` runs the embedded benchmark, `make test` the test suite; both set everything up.
PY     ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup data quickstart test lint test-flower docs docs-reference dist bench bench-gpu bench-gateway bench-accuracy bench-pfl bench-reference bench-reference-speed clean-artifacts

setup: $(STAMP)
	@$(BIN)/python -m fedl2p_cli.data.provision || echo "(continuing: the tests do not need Fashion-MNIST)"
	@bash scripts/get-espeak.sh || echo "(continuing: only --dataset speech-synth needs espeak-ng)"

$(STAMP): pyproject.toml setup.py
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install -q -e '.[test,tensorboard,mlflow,docs,dev]'  # trackers and docs: their tests skip without them; dev: make lint
	touch $(STAMP)

data: $(STAMP)  # Fashion-MNIST (Debian's dataset-fashion-mnist, as `fedl2p` itself installs it when missing) and espeak-ng
	@$(BIN)/python -m fedl2p_cli.data.provision
	@bash scripts/get-espeak.sh || echo "(continuing: only --dataset speech-synth needs espeak-ng)"

quickstart: $(STAMP) data  # feature shift over 7 domains, then the small planted-signal cell (the same pretrained model)
	$(BIN)/fedl2p run quickstart
	$(BIN)/fedl2p run quickstart-planted
	$(BIN)/fedl2p report quickstart quickstart-planted  # both parts on one HTML page

lint: $(STAMP)  # ruff over the repository, mypy over the package (pyproject.toml: [tool.ruff], [tool.mypy])
	$(BIN)/ruff check --quiet .
	$(BIN)/mypy

test: $(STAMP)
	@bash scripts/get-espeak.sh >/dev/null 2>&1 || echo "(espeak-ng missing: the synthetic-speech tests are skipped)"
	$(BIN)/python -m pytest -n 2  # two worker processes of one torch thread each (tests/conftest.py)

# The whole suite with the flower extra installed (its own venv: the extra pins typer<0.21, rich<15, click<8.3).
FLVENV ?= .venv-flower
$(FLVENV)/.installed: pyproject.toml setup.py
	$(PY) -m venv $(FLVENV)
	$(FLVENV)/bin/pip install -q --upgrade pip
	$(FLVENV)/bin/pip install -q torch==2.14.1 torchvision==0.29.1
	$(FLVENV)/bin/pip install -q -e '.[test,flower]'
	touch $(FLVENV)/.installed

test-flower: $(FLVENV)/.installed  # the whole suite under flwr's typer, rich and click pins, Flower's own tests included
	$(FLVENV)/bin/python -m pytest -n 2

# the documentation site (docs/, mkdocs.yml) into site/; --strict: a broken link or a missing page fails
docs: $(STAMP)
	$(BIN)/pip install -q -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-reference: $(STAMP)  # regenerate the CLI and plugin API references after a change (a test checks they are current)
	$(BIN)/python -m fedl2p_cli.cli.reference > docs/reference/cli.md
	$(BIN)/python -m fedl2p_cli.cli.api_reference > docs/reference/plugin-api.md

# an sdist and a wheel in dist/, checked by twine (what `pip install fedl2p` would get)
dist: $(STAMP)
	$(BIN)/pip install -q -e '.[release]'
	rm -rf dist && $(BIN)/python -m build --outdir dist . && $(BIN)/twine check --strict dist/*

bench: $(STAMP) data
	$(BIN)/python bench/bench.py

bench-gpu: $(STAMP)  # needs a CUDA GPU (prints a line and exits without one); writes bench/gpu.json
	$(BIN)/python bench/gpu.py

bench-gateway: $(FLVENV)/.installed  # the Fleet gateway: memory under a 256 MB body, requests/s vs the SuperLink; then
	$(FLVENV)/bin/python bench/gateway.py $(ARGS)
	$(FLVENV)/bin/python bench/edge_attacks.py  # the attack suite on both edges (gateway before/now, nginx), side by side
	$(FLVENV)/bin/python bench/edge_supernode.py  # a real SuperNode behind each edge under the attacks flwr's retries decide
	$(FLVENV)/bin/python bench/edge_memory.py  # each edge's memory per connection, under a ClientHello flood and after it

bench-accuracy: $(STAMP) data
	$(BIN)/python bench/accuracy.py

bench-pfl: $(STAMP) data
	$(BIN)/python bench/pfl_compare.py

# the authors' FedL2P client (a clone of royson/fedl2p: REF=path) beside `fedl2p meta-train` on the planted cell;
# its own venv (.venv-ref: learn2learn 0.1.7, flwr 0.17 and what else their code imports); writes bench/reference.md
bench-reference: data
	@[ -n "$(REF)" ] || { echo "bench-reference: give the authors' repository: make bench-reference REF=path/to/fedl2p-clone"; exit 2; }
	PY=$(PY) bash scripts/reference-venv.sh
	.venv-ref/bin/python bench/reference.py --ref "$(REF)" $(ARGS)

# speed beside the authors' client: one client round, its fine-tuning and meta-gradient, ours vs theirs, timed in
# turns at one thread, with counts of forwards, gradients and second-order products; writes bench/reference-speed.md
bench-reference-speed:
	@[ -n "$(REF)" ] || { echo "bench-reference-speed: give the authors' repository: make bench-reference-speed REF=path/to/fedl2p-clone"; exit 2; }
	PY=$(PY) bash scripts/reference-venv.sh
	.venv-ref/bin/python bench/reference_speed.py --ref "$(REF)" $(ARGS)

clean-artifacts:
	find artifacts -mindepth 1 -maxdepth 1 ! -name README.md -exec rm -rf {} +
