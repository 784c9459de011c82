# make demo: install, build, run the demo.  make test: install, build, lint, type-check, test.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.nlproxy-installed
SRC    := $(shell find nlproxy native -name '*.py' -o -name '*.c' -o -name '*.h' -o -name '*.cdef') pyproject.toml setup.py

.PHONY: all deps demo test lint typecheck unit bench vm-test clean wheel deb image lock arm64 tag

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

# Packages, into $(DIST): built from this checkout with the Python packages of the lock files only
# (packaging/*.lock, hashes checked), reproducibly (docs/packaging.md). ARCH (amd64 or arm64,
# default the machine's) is the wheel's, the .deb's and the image's architecture (the wheel holds
# the compiled shim): `make wheel deb image ARCH=arm64` (or `make arm64`) cross-builds them on an
# amd64 machine, installing what that takes with apt-get.
DIST       ?= build/dist
VERSION    := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml)
ARCH       := $(shell dpkg --print-architecture 2>/dev/null || echo amd64)
DEB        := $(DIST)/nlproxy_$(VERSION)-1_$(ARCH).deb
DEB_INPUTS := $(SRC) $(shell find packaging deploy/systemd deploy/sysctl docs examples -type f \
                -not -name '*.pyc') README.md LICENSE CHANGELOG.md

# The wheel (the shim compiled for ARCH, and the demo manifests), built by a venv of the build
# lock: nlproxy-VERSION-cp311-cp311-linux_x86_64.whl, or linux_aarch64 for ARCH=arm64.
wheel:
	bash packaging/need-debs.sh python3-dev gcc pkg-config libnftnl-dev libmnl-dev git
	NLPROXY_ARCH=$(ARCH) bash packaging/build-wheel.sh "$$(bash packaging/build-env.sh)" $(DIST)

# The Debian package (nlproxy in /opt/nlproxy, the systemd unit, ...); rebuilt only when one of
# its inputs is newer.
deb: $(DEB)

$(DEB): $(DEB_INPUTS)
	NLPROXY_ARCH=$(ARCH) bash packaging/build-deb.sh $(DIST)

# The OCI image archive (podman load / ctr images import), the DaemonSet's tag, and its SBOM,
# from the .deb above (built first only when it is not up to date).
image: $(DEB)
	NLPROXY_ARCH=$(ARCH) bash packaging/build-image.sh $(DIST) $(DEB)

# The arm64 wheel, .deb and image, whatever the machine (docs/packaging.md, "arm64").
arm64:
	$(MAKE) wheel deb image ARCH=arm64

# Refresh packaging/requirements.lock and packaging/build-requirements.lock to the newest releases
# pyproject.toml allows (docs/packaging.md: how to review the change).
lock:
	bash packaging/lock.sh

# Tag the checked-out commit as release v$(VERSION), after checking the CHANGELOG and the
# DaemonSet's image name that version (docs/packaging.md, "Versions and releases").
tag:
	bash packaging/tag.sh

vm-test: deps
	$(MAKE) -C vm-tests all

clean:
	rm -rf $(VENV) build *.egg-info nlproxy/_nftshim*.so
