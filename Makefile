# haarvest — every target bootstraps its own virtual environment on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= dev,eval,flower-sim
STAMP := $(VENV)/.installed-$(shell (cat pyproject.toml; echo "$(EXTRAS)") | cksum | cut -d" " -f1)

.PHONY: demo test audit bench eval venv clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	rm -f $(VENV)/.installed-* && touch $@

venv: $(STAMP)

# The demo uses Debian's mosquitto when installed, else the embedded amqtt broker (the `broker` extra, installed on
# demand: amqtt pins a typer release that Flower's CLI cannot use, so it is kept out of the default environment).
demo: $(STAMP)
	command -v mosquitto >/dev/null || test -x /usr/sbin/mosquitto || $(BIN)/python -m pip install -q -e ".[broker]"
	$(BIN)/haarvest demo $(DEMO_ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

audit: $(STAMP)
	HAARVEST_AUDIT_TRIALS=1000000 $(BIN)/python -m pytest -q tests/audit -m "slow or not slow"

bench:
	$(MAKE) EXTRAS=dev,eval,bench,flower-sim venv
	$(BIN)/python -m simulations.bench $(BENCH_ARGS)

eval:
	$(MAKE) EXTRAS=dev,eval,bench,flower-sim venv
	$(BIN)/haarvest simulate eval $(EVAL_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
