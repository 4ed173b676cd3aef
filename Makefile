# haarvest — every target bootstraps its own virtual environment on a fresh machine, with only what it needs:
# `make demo` the core package (numpy, scipy, pydantic, cryptography, paho-mqtt, prometheus-client), `make test`
# the test extras too (pytest, Flower with Ray, matplotlib for the evaluation's plots, the PostgreSQL driver).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The embedded broker (amqtt, used only when mosquitto is not installed) lives in an environment of its own: its
# pins (typer ≥ 0.21) conflict with Flower's (typer < 0.21), so it never enters $(VENV).
BROKER_VENV ?= .venv-broker
TEST_EXTRAS ?= dev,eval,flower-sim
BENCH_EXTRAS ?= dev,eval,bench,flower-sim
# One stamp per (pyproject.toml, extras) pair: a target re-installs only when its own set changed.
stamp = $(VENV)/.installed-$(shell (cat pyproject.toml; echo "$(1)") | cksum | cut -d" " -f1)
define install
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".$(if $(1),[$(1)])"
	touch $@
endef
CORE := $(call stamp,)
TESTENV := $(call stamp,$(TEST_EXTRAS))
BENCHENV := $(call stamp,$(BENCH_EXTRAS))

.PHONY: demo test audit bench eval venv broker-venv pi-rehearsal clean

$(CORE): pyproject.toml
	$(call install,)
$(TESTENV): pyproject.toml
	$(call install,$(TEST_EXTRAS))
ifneq ($(BENCHENV),$(TESTENV))
$(BENCHENV): pyproject.toml
	$(call install,$(BENCH_EXTRAS))
endif

venv: $(TESTENV)

$(BROKER_VENV)/.installed:
	test -x $(BROKER_VENV)/bin/python || $(PY) -m venv $(BROKER_VENV)
	$(BROKER_VENV)/bin/python -m pip install -q "amqtt>=0.11"
	touch $@

broker-venv: $(BROKER_VENV)/.installed

# The demo uses Debian's mosquitto when installed, else the embedded amqtt broker from $(BROKER_VENV).
demo: $(CORE)
	command -v mosquitto >/dev/null || test -x /usr/sbin/mosquitto || $(MAKE) --no-print-directory broker-venv
	$(BIN)/haarvest demo $(DEMO_ARGS)

test: $(TESTENV)
	$(BIN)/python -m pytest -m "not slow"

audit: $(TESTENV)
	HAARVEST_AUDIT_TRIALS=1000000 $(BIN)/python -m pytest -q -m audit

bench: $(BENCHENV)
	$(BIN)/python -m simulations.bench $(BENCH_ARGS)

eval: $(BENCHENV)
	$(BIN)/haarvest simulate eval $(EVAL_ARGS)

# A Raspberry Pi rehearsal under qemu user-mode emulation (deploy/README.md; needs root, ≈ 7 min the first time).
pi-rehearsal: $(CORE)
	$(BIN)/python deploy/pi/rehearsal.py $(PI_ARGS)

clean:
	rm -rf $(VENV) $(BROKER_VENV) build *.egg-info .pytest_cache
