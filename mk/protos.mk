# Generated gRPC stubs: protos/<pkg>/v1/*.proto -> <pkg>/v1/*_pb2{.py,_grpc.py,.pyi}.
# Included by the Makefile. `make protos` re-runs the generator when any .proto (or the
# generator) is newer than any output; tools/gen_protos.py is the one implementation, also
# called by setup.py's build_py.

PY ?= .venv/bin/python
PROTO_SRCS := $(shell find protos -name '*.proto' 2>/dev/null)
PROTO_OUTS := $(foreach suffix,_pb2.py _pb2_grpc.py _pb2.pyi,\
	$(patsubst protos/%.proto,%$(suffix),$(PROTO_SRCS)))

.PHONY: protos
protos: $(PROTO_OUTS)

$(PROTO_OUTS) &: $(PROTO_SRCS) tools/gen_protos.py
	$(PY) tools/gen_protos.py --force
