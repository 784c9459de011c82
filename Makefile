# make demo: install, build, run the demo.  make test: install, build, lint, type-check, test.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.nlproxy-installed
SRC    := $(shell find nlproxy native -name '*.py' -o -name '*.c' -o -name '*.h' -o -name '*.cdef') pyproject.toml setup.py

.PHONY: all deps demo test lint typecheck unit bench vm-test clean wheel deb image

all: deps

$(VENV)/.debs: scripts/install-debs.sh packaging/need-debs.sh
	bash scripts/install-debs.sh
	@mkdir -p $(VENV) && touch $@

$(STAMP): $(VENV)/.debs $(SRC)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel cffi
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

deps: $(STAMP)

demo: deps
	$(VENV)/bin/nlproxy demo

lint: deps
	$(VENV)/bin/ruff check nlproxy tests bench native packaging
	$(VENV)/bin/ruff format --check nlproxy tests bench native packaging

typecheck: deps
	$(VENV)/bin/mypy

# Unit tests run as an unprivileged user without the kernel tools (scripts/unit-as-user.sh);
# the rest (kernel, kube source, packaging) as root.
test: lint typecheck unit
	$(PY) -m pytest -q bench/checks
	$(PY) -m pytest -q --ignore=tests/unit

unit: deps
	bash scripts/unit-as-user.sh

bench: deps
	$(PY) bench/run.py

# The wheel (compiled shim and demo manifests included) into build/dist/.
wheel: deps
	bash packaging/build-wheel.sh $(PY) build/dist

# The Debian package (nlproxy in /opt/nlproxy, the systemd unit, ...) into build/dist/.
deb:
	bash packaging/build-deb.sh build/dist

# The OCI image archive (podman load / ctr images import), the DaemonSet's tag, into build/dist/.
image:
	bash packaging/build-image.sh build/dist

vm-test: deps
	$(MAKE) -C vm-tests all

clean:
	rm -rf $(VENV) build *.egg-info nlproxy/_nftshim*.so
