# In-network aggregation testbed. `make demo` installs and runs the demo; `make test` runs the tests.
PYTHON   ?= python3
P4C      ?= p4c-bm2-ss
P4SRC    := p4src/ina.p4
BUILD    := build
PYTEST   := $(PYTHON) -m pytest

.PHONY: install demo demo-model run test test-fast p4 proto bench bench-switch stop clean help

help:
	@echo "make install   system and Python dependencies (Debian 12, as root for the system part)"
	@echo "make demo      install, then run experiment 1 (INA vs ring vs Rina, small) on the embedded switch (root)"
	@echo "make demo-model a scripted aggregation through the pipeline model, no root"
	@echo "make run EXP=allreduce|hetero|multijob|loss ARGS=--small   one experiment (ina-exp)"
	@echo "make test      every test tier (integration tiers need root; bmv2 runs where simple_switch_grpc is)"
	@echo "make test-fast unit and packet tiers only"
	@echo "make p4        compile p4src/ with p4c into $(BUILD)/ (needs p4c on PATH)"
	@echo "make proto     regenerate the admission service stubs (protoc, grpc_python_plugin)"
	@echo "make bench     benchmarks that print ratios measured side by side"
	@echo "make stop      remove every namespace, interface and process a testbed run left behind"
	@echo "make clean     remove build products"

install:
	./scripts/install-deps.sh

demo: install
	ina-exp run allreduce --small

demo-model:
	$(PYTHON) -m softswitch.demo

EXP  ?= allreduce
ARGS ?= --small
run:
	ina-exp run $(EXP) $(ARGS)

test:
	$(PYTEST) tests -q

test-fast:
	$(PYTEST) tests -q -m "unit or packet"

p4: $(BUILD)/ina.json

$(BUILD)/ina.json: $(P4SRC)
	@command -v $(P4C) >/dev/null || { echo "make p4: $(P4C) is not on PATH; install p4c (p4lang) to compile $(P4SRC). The committed p4src/ina.p4info.txt is kept by hand until then."; exit 1; }
	mkdir -p $(BUILD)
	$(P4C) --p4v 16 --p4runtime-files $(BUILD)/ina.p4info.txt -o $(BUILD)/ina.json $(P4SRC)
	@$(PYTHON) -m tests.p4source --compare $(BUILD)/ina.p4info.txt p4src/ina.p4info.txt \
		|| echo "note: review with: diff $(BUILD)/ina.p4info.txt p4src/ina.p4info.txt"

# The admission service's stubs, generated beside their .proto. Run from the repository root with `-I .`, so
# the grpc module imports `inaproto.admission_pb2` as generated. PROTO_OUT lets the stub test regenerate elsewhere.
PROTOC         ?= protoc
GRPC_PY_PLUGIN ?= grpc_python_plugin
PROTO_OUT      ?= .
proto:
	$(PROTOC) -I . --python_out=$(PROTO_OUT) --grpc_out=$(PROTO_OUT) \
		--plugin=protoc-gen-grpc=$$(command -v $(GRPC_PY_PLUGIN)) inaproto/admission.proto

bench:
	$(PYTHON) bench/switch_bench.py
	$(PYTHON) bench/agent_bench.py
	$(PYTHON) bench/sim_bench.py

bench-switch:
	$(PYTHON) bench/switch_bench.py

stop:
	$(PYTHON) -m topologies.cleanup

clean:
	rm -rf $(BUILD) .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
