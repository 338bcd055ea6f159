# In-network aggregation testbed. `make demo` installs and runs the demo; `make test` runs the tests.
# Everything runs from the virtual environment that `make install` creates in .venv/ (PYTHON= picks the
# interpreter that creates it). Root is needed for apt (install) and for namespaces (demo, integration tests):
# run as root, or `sudo make demo`: make calls .venv/bin/... by path, so sudo's PATH does not matter.
PYTHON   ?= python3
VENV     ?= .venv
BIN      := $(abspath $(VENV))/bin
PY       := $(BIN)/python
STAMP    := $(VENV)/.installed
P4C      ?= p4c-bm2-ss
P4SRC    := p4src/ina.p4
BUILD    := build
PYTEST   := $(PY) -m pytest

.DEFAULT_GOAL := help
.PHONY: help install demo demo-model run report test test-fast lint docs p4 proto bench bench-switch soak stop clean

help: ## this list
	@awk 'BEGIN {FS = ":.*## "} /^[a-z][a-z0-9-]*:.*## / {printf "  make %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

install: ## system packages (as root) and the Python environment in .venv/ (PyTorch CPU optional)
	PYTHON="$(PYTHON)" VENV="$(VENV)" ./scripts/install-deps.sh

$(STAMP): pyproject.toml scripts/install-deps.sh
	PYTHON="$(PYTHON)" VENV="$(VENV)" ./scripts/install-deps.sh

demo: install ## install, run experiment 1 (INA vs ring vs Rina, small) on the embedded switch (root), then its report
	$(BIN)/ina-exp run allreduce --small; status=$$?; $(BIN)/ina-exp report results/allreduce/latest && exit $$status

demo-model: $(STAMP) ## a scripted aggregation through the pipeline model, no root
	$(PY) -m softswitch.demo

EXP  ?= allreduce
ARGS ?= --small
run: $(STAMP) ## one experiment: make run EXP=allreduce|hetero|multijob|loss|rina|tree ARGS=--small
	$(BIN)/ina-exp run $(EXP) $(ARGS)

REPORT_ARGS ?=
report: $(STAMP) ## results/report.html: the newest run of each experiment beside the published figures, targets met or missed
	$(BIN)/ina-exp report $(REPORT_ARGS)

# The tiers without namespaces run on two pytest workers (pytest-xdist); integration and bmv2 run in one process,
# one test at a time: their network namespaces, veths and switch processes have fixed names.
FAST     := -m "(unit or local or packet) and not slow" -n 2 --dist worksteal

test: $(STAMP) ## every tier but slow (integration needs root; bmv2 runs where simple_switch_grpc and p4c are on PATH)
	$(PYTEST) tests -q $(FAST)
	$(PYTEST) tests -q -m "(integration or bmv2) and not slow"

test-fast: $(STAMP) ## the unit, local and packet tiers (no root)
	$(PYTEST) tests -q $(FAST)

test-slow: $(STAMP) ## the slow tests (over about 30 s each), every tier
	$(PYTEST) tests -q -m slow

lint: $(STAMP) ## ruff's default rules over the tree (configuration in pyproject.toml)
	$(BIN)/ruff check .

docs: $(STAMP) ## regenerate the settings tables in docs/ from the documented configuration dataclasses
	$(PY) scripts/settings_tables.py

p4: $(BUILD)/ina.json ## compile p4src/ with p4c into build/ and compare its P4Info with the committed one

$(BUILD)/ina.json: $(P4SRC) | $(STAMP)
	@command -v $(P4C) >/dev/null || { echo "make p4: $(P4C) is not on PATH; install p4c (see README, 'Using real BMv2 and p4c') to compile $(P4SRC)"; exit 1; }
	mkdir -p $(BUILD)
	$(P4C) --p4v 16 --p4runtime-files $(BUILD)/ina.p4info.txt -o $(BUILD)/ina.json $(P4SRC)
	@$(PY) -m p4src.p4source --compare $(BUILD)/ina.p4info.txt p4src/ina.p4info.txt \
		|| echo "note: review with: diff $(BUILD)/ina.p4info.txt p4src/ina.p4info.txt"

# The admission service's stubs, generated beside their .proto. Run from the repository root with `-I .`, so
# the grpc module imports `inaproto.admission_pb2` as generated. PROTO_OUT lets the stub test regenerate elsewhere.
PROTOC         ?= protoc
GRPC_PY_PLUGIN ?= grpc_python_plugin
PROTO_OUT      ?= .
proto: ## regenerate the admission service stubs in inaproto/ (protoc, grpc_python_plugin)
	$(PROTOC) -I . --python_out=$(PROTO_OUT) --grpc_out=$(PROTO_OUT) \
		--plugin=protoc-gen-grpc=$$(command -v $(GRPC_PY_PLUGIN)) inaproto/admission.proto

bench: $(STAMP) ## benchmarks that print ratios measured side by side (root)
	$(PY) bench/switch_bench.py
	$(PY) bench/agent_bench.py
	$(PY) bench/sim_bench.py
	$(PY) bench/torch_bench.py

bench-switch: $(STAMP) ## the switch benchmark alone
	$(PY) bench/switch_bench.py

SOAK_DURATION ?= 600
soak: $(STAMP) ## 8 jobs for SOAK_DURATION s (600) through the ina-switch process (namespaces: root, under the lock) with 1 % loss/dup/reorder, 2 controller kills, a policy change (not in CI)
	$(PY) bench/soak.py --duration $(SOAK_DURATION) $(SOAK_ARGS)

stop: $(STAMP) ## remove every namespace, interface and process a testbed run left behind
	$(PY) -m topologies.cleanup

clean: ## remove build products (keeps .venv; rm -rf .venv to reinstall from scratch)
	rm -rf $(BUILD) .pytest_cache
	find . -name __pycache__ -type d -prune -not -path './$(VENV)/*' -exec rm -rf {} +
