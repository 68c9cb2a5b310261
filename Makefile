# SPDX-License-Identifier: MIT
# rdmaxd build. `make`, `make check`, `make install`, `make SAN=1 check`, `make demo`.

PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
SBINDIR ?= $(PREFIX)/sbin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
MANDIR ?= $(PREFIX)/share/man
SYSCONFDIR ?= /etc
UNITDIR ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
TMPFILESDIR ?= $(PREFIX)/lib/tmpfiles.d
DESTDIR ?=

SAN ?= 0
FUZZ ?= 0
ifeq ($(FUZZ),1)
# libFuzzer targets (tests/fuzz): every object built by clang with coverage, ASan and UBSan.
BUILD ?= build-fuzz
CC := clang
SANFLAGS := -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer \
	-fno-sanitize-recover=undefined
# clang also checks the format of vprintf-style pass-throughs that gcc leaves alone.
WARN_EXTRA := -Wno-format-nonliteral
else ifeq ($(SAN),1)
BUILD ?= build-san
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
else
BUILD ?= build
SANFLAGS :=
# Link-time optimisation of rdmaxd and librdmax: a job's path crosses a dozen files, and
# inlined across them it makes about a third fewer calls. Fat objects: the unit tests link
# the same objects without it, so their --wrap of system calls still applies.
LTO ?= -flto=auto -ffat-lto-objects
endif
LTO ?=

CC ?= cc
V ?= 0
ifeq ($(V),0)
Q := @
QUIET_CC = @echo "  CC      $<";
QUIET_LD = @echo "  LD      $@";
else
Q :=
QUIET_CC =
QUIET_LD =
endif
PKGS := libibverbs librdmacm libuv libprotobuf-c libsystemd check inih libsodium libssl libcrypto jansson libcurl
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS))
CUDA_INC := $(firstword $(wildcard /usr/local/cuda/include))
CUDA_CFLAGS := $(if $(CUDA_INC),-I$(CUDA_INC) -DRDMAX_HAVE_CUDA_H=1,)

CFLAGS ?= -O2 -g
WARN := -Wall -Wextra -Werror -Wno-unused-parameter -Wshadow -Wformat=2 -Wmissing-prototypes $(WARN_EXTRA)
# Every daemon folder is on the include path: a header is named by its file name alone, and
# tests/check-layout keeps includes pointing down the layers of docs/architecture.md.
DAEMON_DIRS := $(sort $(dir $(shell find daemon -name '*.[ch]')))
CPPFLAGS_ALL := -D_GNU_SOURCE -I$(BUILD)/gen -Iclient-lib/include $(addprefix -I,$(DAEMON_DIRS)) \
	-Iproto -Iproto/common $(PKG_CFLAGS)
ALL_CFLAGS := -std=gnu11 $(WARN) $(CFLAGS) $(SANFLAGS) -fPIC $(CPPFLAGS_ALL)
# Every other program links the objects' plain code (-fno-lto anywhere on a line wins).
LDFLAGS_ALL := $(SANFLAGS) $(LDFLAGS) $(if $(LTO),-fno-lto,)

LIBS_DAEMON := $(shell pkg-config --libs libibverbs librdmacm libuv libprotobuf-c libsystemd inih libsodium libssl libcrypto jansson libcurl) -ldl -lm
LIBS_CLIENT := $(shell pkg-config --libs libprotobuf-c) -ldl
LIBS_CHECK := $(shell pkg-config --libs check)
LIBS_JSON := $(shell pkg-config --libs jansson)

LIB_SONAME := librdmax.so.2
LIB_VERSION := 2.1.0

PROTO_SRC := proto/rdmax.proto
GEN_C := $(BUILD)/gen/rdmax.pb-c.c
GEN_H := $(BUILD)/gen/rdmax.pb-c.h

# Code both the daemon and the library build from (error names, the CUDA driver table).
COMMON_SRCS := $(wildcard proto/common/*.c)
COMMON_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(COMMON_SRCS))

DAEMON_SRCS := $(shell find daemon -name '*.c' | sort)
DAEMON_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(DAEMON_SRCS)) $(BUILD)/gen/rdmax.pb-c.o $(COMMON_OBJS)
DAEMON_LIB_OBJS := $(filter-out $(BUILD)/daemon/main.o,$(DAEMON_OBJS))

CLIENT_SRCS := $(wildcard client-lib/*.c)
CLIENT_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(CLIENT_SRCS)) $(BUILD)/gen/rdmax.pb-c.o $(COMMON_OBJS)

# One-file programs are tools/NAME.c; a program of several files is the folder tools/NAME/.
BENCH_SRCS := $(wildcard tools/rdmax-bench/*.c)
TOOLS := $(patsubst tools/%.c,$(BUILD)/%,$(wildcard tools/*.c)) $(BUILD)/rdmax-bench
BENCH_TOOLS := $(BUILD)/tests/bench/tcp-stream $(BUILD)/tests/bench/kv-batch \
	$(BUILD)/tests/bench/shm-pingpong
GPU_CHECK := $(BUILD)/tests/gpu/check-gpu
DEVICE_CHECK := $(BUILD)/tests/gpu/device-check-helper
# The raw verbs reference of a write posted on another process's behalf (tests/bench/guest-hop.sh).
BENCH_TOOLS += $(BUILD)/tests/bench/verbs-hop
# The Python tests' GPU path without a GPU: the fake driver as libcuda.so.1, and a daemon
# stand-in running the daemon's GPU module over it.
FAKE_LIBCUDA := $(BUILD)/tests/fakecuda/libcuda.so.1
FAKE_GPU_DAEMON := $(BUILD)/tests/gpu/fake-gpu-daemon
UNIT_SRCS := $(wildcard tests/unit/*.c)
EXAMPLES := $(patsubst docs/examples/%.c,$(BUILD)/examples/%,$(wildcard docs/examples/*.c))
ITEST_SRCS := $(wildcard tests/integration/*.c)

# The `rdmax` Python package (client-lib/python): the C extension over librdmax, built for
# Debian's /usr/bin/python3 when its headers (python3-dev) are there.
PYTHON ?= /usr/bin/python3
PY_INC := $(shell $(PYTHON) -c "import sysconfig; print(sysconfig.get_paths()['include'])" 2>/dev/null)
PY_EXT := $(shell $(PYTHON) -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))" 2>/dev/null)
PY_HAVE := $(if $(and $(PY_EXT),$(wildcard $(PY_INC)/Python.h)),1,)
PY_SRCS := $(wildcard client-lib/python/rdmax/*.py client-lib/python/rdmax/*.pyi client-lib/python/rdmax/py.typed)
PY_OUT := $(patsubst client-lib/python/rdmax/%,$(BUILD)/python/rdmax/%,$(PY_SRCS))
PY_MOD := $(BUILD)/python/rdmax/_rdmax$(PY_EXT)
PYTHON_PKG := $(if $(PY_HAVE),$(PY_MOD) $(PY_OUT),)
# Where `make install` puts the package so that Debian's python3 finds it.
PYTHONDIR ?= $(if $(filter /usr,$(PREFIX)),/usr/lib/python3/dist-packages,$(PREFIX)/lib/python3/dist-packages)

all: $(BUILD)/rdmaxd $(BUILD)/$(LIB_SONAME) $(BUILD)/librdmax.a $(BUILD)/librdmax.pc $(TOOLS) \
	$(BUILD)/tests/unit-tests $(BUILD)/tests/itest $(BENCH_TOOLS) $(GPU_CHECK) $(DEVICE_CHECK) \
	$(FAKE_LIBCUDA) $(FAKE_GPU_DAEMON) $(EXAMPLES) $(PYTHON_PKG)

$(GEN_C) $(GEN_H): $(PROTO_SRC)
	@mkdir -p $(BUILD)/gen
	$(Q)protoc-c --c_out=$(BUILD)/gen -Iproto $(PROTO_SRC)

$(BUILD)/gen/rdmax.pb-c.o: $(GEN_C)
	$(QUIET_CC)$(CC) $(ALL_CFLAGS) $(LTO) -fvisibility=hidden -Wno-missing-prototypes -c -o $@ $<

$(BUILD)/%.o: %.c $(GEN_H)
	@mkdir -p $(dir $@)
	$(QUIET_CC)$(CC) $(ALL_CFLAGS) $(LTO) $(CUDA_CFLAGS) -fvisibility=hidden -MMD -MP -c -o $@ $<

$(BUILD)/rdmaxd: $(DAEMON_OBJS)
	$(QUIET_LD)$(CC) $(CFLAGS) $(SANFLAGS) $(LDFLAGS) $(LTO) -o $@ $^ $(LIBS_DAEMON)

$(BUILD)/$(LIB_SONAME): $(CLIENT_OBJS) client-lib/librdmax.map
	$(QUIET_LD)$(CC) $(CFLAGS) $(SANFLAGS) $(LDFLAGS) $(LTO) -shared -Wl,-soname,$(LIB_SONAME) \
		-Wl,--version-script=client-lib/librdmax.map -o $@ $(CLIENT_OBJS) $(LIBS_CLIENT)
	ln -sf $(LIB_SONAME) $(BUILD)/librdmax.so

# The static library holds plain code only: this compiler's LTO bytecode in it would make a
# program's link run LTO (GCC's linker plugin does whenever it finds bytecode) or fail under
# another GCC.
$(BUILD)/librdmax.a: $(CLIENT_OBJS)
	rm -rf $@ $(BUILD)/static
	@mkdir -p $(BUILD)/static
	$(Q)for o in $^; do objcopy --remove-section='.gnu.lto_*' \
		--remove-section='.gnu.debuglto_*' $$o $(BUILD)/static/$$(echo $$o | tr / _); done
	ar rcs $@ $(BUILD)/static/*.o

# The paths in the .pc file follow PREFIX/LIBDIR/INCLUDEDIR: rebuild it whenever they change.
PC_VARS := $(PREFIX)|$(LIBDIR)|$(INCLUDEDIR)|$(LIB_VERSION)
PC_STAMP := $(BUILD)/.pc-vars-$(shell printf '%s' '$(PC_VARS)' | md5sum | cut -c1-12)
$(PC_STAMP):
	@mkdir -p $(BUILD)
	@rm -f $(BUILD)/.pc-vars-*
	@touch $@

$(BUILD)/librdmax.pc: client-lib/librdmax.pc.in $(PC_STAMP)
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' \
		-e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' -e 's|@VERSION@|$(LIB_VERSION)|g' $< > $@

# Programs over the public library only.
$(BUILD)/%: tools/%.c $(BUILD)/$(LIB_SONAME)
	$(QUIET_LD)$(CC) $(ALL_CFLAGS) -MMD -MP -o $@ $< -L$(BUILD) -lrdmax -Wl,-rpath,'$$ORIGIN' $(LDFLAGS_ALL) -lm $(TOOL_LIBS)

# rdmax-bench is several files, over the public library only like the one-file tools.
$(BUILD)/rdmax-bench: $(BENCH_SRCS) $(wildcard tools/rdmax-bench/*.h) client-lib/include/rdmax.h $(BUILD)/$(LIB_SONAME)
	$(QUIET_LD)$(CC) $(ALL_CFLAGS) -o $@ $(BENCH_SRCS) -L$(BUILD) -lrdmax -Wl,-rpath,'$$ORIGIN' $(LDFLAGS_ALL) -lm

# rdmaxctl reads the admin socket's JSON replies with libjansson.
$(BUILD)/rdmaxctl: TOOL_LIBS = $(LIBS_JSON)

# The extension finds librdmax next to it in the build tree ($ORIGIN/../..), and in LIBDIR once
# installed (relinked by `make install`).
PY_SRCS := client-lib/python/_rdmax.c client-lib/python/jobs.c client-lib/python/regions.c
$(PY_MOD): $(PY_SRCS) client-lib/python/rdmax_py.h client-lib/include/rdmax.h $(BUILD)/$(LIB_SONAME)
	@mkdir -p $(dir $@)
	$(QUIET_CC)$(CC) -std=gnu11 $(WARN) -Wno-missing-field-initializers $(CFLAGS) $(SANFLAGS) -fPIC -shared \
		-I$(PY_INC) -Iclient-lib/include -o $@ $(PY_SRCS) -L$(BUILD) -l:$(LIB_SONAME) \
		-Wl,-rpath,'$$ORIGIN/../..' $(LDFLAGS_ALL) -lpthread

$(BUILD)/python/rdmax/%: client-lib/python/rdmax/%
	@mkdir -p $(dir $@)
	cp $< $@

# Unit tests link the daemon's modules and the client library's objects; sendmsg(),
# recvmsg() and send() go through counting wrappers (test_transport_tcp.c), sched_yield()
# through one (test_client.c).
$(BUILD)/tests/unit-tests: $(UNIT_SRCS) $(DAEMON_LIB_OBJS) $(CLIENT_OBJS)
	@mkdir -p $(dir $@)
	$(QUIET_LD)$(CC) $(ALL_CFLAGS) $(CUDA_CFLAGS) -Wl,--wrap=sendmsg,--wrap=recvmsg,--wrap=send,--wrap=sched_yield -o $@ $(UNIT_SRCS) $(DAEMON_LIB_OBJS) \
		$(filter-out $(BUILD)/gen/rdmax.pb-c.o $(COMMON_OBJS),$(CLIENT_OBJS)) $(LDFLAGS_ALL) $(LIBS_DAEMON) $(LIBS_CHECK)

# The raw-protocol abuse cases speak protobuf directly: link the generated code.
$(BUILD)/tests/itest: $(ITEST_SRCS) $(wildcard tests/integration/*.h) $(BUILD)/$(LIB_SONAME) $(BUILD)/gen/rdmax.pb-c.o
	@mkdir -p $(dir $@)
	$(QUIET_LD)$(CC) $(ALL_CFLAGS) -o $@ $(ITEST_SRCS) $(BUILD)/gen/rdmax.pb-c.o -L$(BUILD) -lrdmax -Wl,-rpath,'$$ORIGIN/..' \
		$(LDFLAGS_ALL) $(LIBS_CHECK) $(LIBS_CLIENT) -lm

# The GPU node check's helper: libcuda through dlopen, so it builds without a GPU or CUDA.
$(GPU_CHECK): tests/gpu/check-gpu.c proto/common/cuda_table.c proto/common/cuda_table.h \
		tests/unit/pass_fds.h
	@mkdir -p $(dir $@)
	$(QUIET_LD)$(CC) $(ALL_CFLAGS) $(CUDA_CFLAGS) -o $@ tests/gpu/check-gpu.c proto/common/cuda_table.c \
		$(LDFLAGS_ALL) $(shell pkg-config --libs libibverbs) -ldl

# The device check's helper: the client library and the daemon's GPU module in one program.
$(DEVICE_CHECK): tests/gpu/device-check.c tests/gpu/gpu_server.c tests/gpu/gpu_server.h \
		tests/unit/pass_fds.h $(DAEMON_LIB_OBJS) $(CLIENT_OBJS)
	@mkdir -p $(dir $@)
	$(QUIET_LD)$(CC) $(ALL_CFLAGS) $(CUDA_CFLAGS) -o $@ tests/gpu/device-check.c tests/gpu/gpu_server.c \
		$(DAEMON_LIB_OBJS) $(filter-out $(BUILD)/gen/rdmax.pb-c.o $(COMMON_OBJS),$(CLIENT_OBJS)) \
		$(LDFLAGS_ALL) $(LIBS_DAEMON) -ldl -lpthread

$(FAKE_GPU_DAEMON): tests/gpu/fake-gpu-daemon.c tests/gpu/gpu_server.c tests/gpu/gpu_server.h \
		tests/unit/pass_fds.h $(DAEMON_LIB_OBJS) $(CLIENT_OBJS)
	@mkdir -p $(dir $@)
	$(QUIET_LD)$(CC) $(ALL_CFLAGS) -o $@ tests/gpu/fake-gpu-daemon.c tests/gpu/gpu_server.c \
		$(DAEMON_LIB_OBJS) $(filter-out $(BUILD)/gen/rdmax.pb-c.o $(COMMON_OBJS),$(CLIENT_OBJS)) \
		$(LDFLAGS_ALL) $(LIBS_DAEMON) -ldl -lpthread

# Named libcuda.so.1 so that dlopen finds it first under LD_LIBRARY_PATH; only tests set that.
$(FAKE_LIBCUDA): tests/gpu/fake-libcuda.c tests/unit/fake_cuda.c tests/unit/fake_cuda.h \
		proto/common/cuda_table.h
	@mkdir -p $(dir $@)
	$(QUIET_LD)$(CC) $(ALL_CFLAGS) -fvisibility=hidden -shared -Wl,-soname,libcuda.so.1 -o $@ \
		tests/gpu/fake-libcuda.c tests/unit/fake_cuda.c $(LDFLAGS_ALL)

# Every library the helper needs, the C library and its loader included (libcuda
# is the GPU machine's own), so that the build folder starts on a bare GPU
# machine whatever its distribution (docs/gpu.md).
device-check-bundle: $(DEVICE_CHECK)
	@mkdir -p $(BUILD)/tests/gpu/lib
	ldd $(DEVICE_CHECK) | awk '$$3 ~ /^\// {print $$3} $$1 ~ /^\/.*ld-linux/ {print $$1}' \
		| xargs -r cp -L -t $(BUILD)/tests/gpu/lib
	for l in libdl.so.2 libpthread.so.0 librt.so.1 libm.so.6; do \
		p=$$(ldconfig -p | awk -v l=$$l '$$1 == l && /x86-64|AArch64/ {print $$NF; exit}'); \
		[ -z "$$p" ] || cp -L $$p $(BUILD)/tests/gpu/lib/; \
	done

# The C side of tests/bench/python_vs_c.py: the public header and library only.
# The floor under the ring hop: two processes bouncing cache lines, nothing else.
$(BUILD)/tests/bench/shm-pingpong: tests/bench/shm-pingpong.c
	@mkdir -p $(dir $@)
	$(QUIET_LD)$(CC) -std=gnu11 $(WARN) $(CFLAGS) $(SANFLAGS) -o $@ $< $(LDFLAGS_ALL)

$(BUILD)/tests/bench/kv-batch: tests/bench/kv-batch.c client-lib/include/rdmax.h $(BUILD)/$(LIB_SONAME)
	@mkdir -p $(dir $@)
	$(QUIET_LD)$(CC) -std=gnu11 $(WARN) $(CFLAGS) $(SANFLAGS) -Iclient-lib/include -o $@ $< \
		-L$(BUILD) -lrdmax -Wl,-rpath,'$$ORIGIN/../..' $(LDFLAGS_ALL)

# The raw verbs reference of a write posted on another process's behalf.
$(BUILD)/tests/bench/verbs-hop: tests/bench/verbs-hop.c
	@mkdir -p $(dir $@)
	$(QUIET_LD)$(CC) $(ALL_CFLAGS) -MMD -MP -o $@ $< $(LDFLAGS_ALL) \
		$(shell pkg-config --libs libibverbs librdmacm)

# Raw reference programs for `make bench`: plain C, no project code.
$(BUILD)/tests/bench/%: tests/bench/%.c
	@mkdir -p $(dir $@)
	$(QUIET_LD)$(CC) $(ALL_CFLAGS) -MMD -MP -o $@ $< $(LDFLAGS_ALL) -lm

check: all
	@echo "== layout (include direction, cycles, verbs wall) and man pages"
	tests/check-layout
	tests/check-man
	@echo "== unit tests"
	$(BUILD)/tests/unit-tests
	@echo "== public ABI (exports, header, struct growth)"
	RDMAX_BUILD=$(BUILD) tests/abi/run
	@echo "== benchmark tools' own arithmetic (per-end and per-process CPU, report.py's lines)"
	RDMAX_BUILD=$(BUILD) PYTHON=$(PYTHON) tests/bench/selftest.sh
	@echo "== integration tests (TCP transport, host)"
	RDMAX_BUILD=$(BUILD) $(BUILD)/tests/itest
	@echo "== integration tests again, every TCP bulk copy on the I/O threads"
	RDMAX_BUILD=$(BUILD) RDMAXD_TEST_TCP_OFFLOAD=1 $(BUILD)/tests/itest
	@echo "== Python package (pytest against daemons on this machine)"
	RDMAX_BUILD=$(BUILD) RDMAX_SAN=$(SAN) PYTHON=$(PYTHON) client-lib/python/run-tests
	@echo "== discovery tests (a real etcd on loopback)"
	RDMAX_BUILD=$(BUILD) RDMAX_TEST_ETCD=$(ETCD) CK_RUN_CASE=discovery $(BUILD)/tests/itest
	@echo "== operations tests (systemd units, socket activation, rdmaxctl, metrics)"
	RDMAX_BUILD=$(BUILD) tests/ops/run
	@echo "== examples (docs/examples against three daemons)"
	RDMAX_BUILD=$(BUILD) docs/examples/run.sh
	@echo "== GPU device check (skips each step with its reason without a GPU)"
	RDMAX_BUILD=$(BUILD) tests/gpu/device-check
	@echo "== integration tests (verbs transport, Soft-RoCE guest)"
	RDMAX_BUILD=$(BUILD) tests/run-verbs-suite

check-layout:
	tests/check-layout
	tests/check-man

check-unit: $(BUILD)/tests/unit-tests
	$(BUILD)/tests/unit-tests

# The rdmax Python package's tests (pytest, /usr/bin/python3, real daemons).
check-python: $(BUILD)/rdmaxd $(PYTHON_PKG) $(FAKE_LIBCUDA) $(FAKE_GPU_DAEMON)
	RDMAX_BUILD=$(BUILD) RDMAX_SAN=$(SAN) PYTHON=$(PYTHON) client-lib/python/run-tests

# The public ABI: exports against the version script, the header as C99/C++, struct growth.
check-abi: $(BUILD)/rdmaxd $(BUILD)/$(LIB_SONAME) $(BUILD)/librdmax.a $(GEN_C)
	RDMAX_BUILD=$(BUILD) tests/abi/run

check-tcp: all
	RDMAX_BUILD=$(BUILD) $(BUILD)/tests/itest
	@echo "itest: again, with every TCP bulk copy on the I/O threads (RDMAXD_TEST_TCP_OFFLOAD=1)"
	RDMAX_BUILD=$(BUILD) RDMAXD_TEST_TCP_OFFLOAD=1 $(BUILD)/tests/itest

# Discovery: named regions and node membership against a real etcd started on loopback.
ETCD ?= $(shell command -v etcd || echo /usr/bin/etcd)
check-discovery: all
	RDMAX_BUILD=$(BUILD) RDMAX_TEST_ETCD=$(ETCD) CK_RUN_CASE=discovery $(BUILD)/tests/itest

# Operations: units, socket activation + notify/watchdog, rdmaxctl, metrics, reload, doctor.
check-ops: $(BUILD)/rdmaxd $(BUILD)/rdmaxctl $(BUILD)/rdmax-demo
	RDMAX_BUILD=$(BUILD) tests/ops/run

# On a node with an NVIDIA GPU (not part of `make check`; skips cleanly without one).
check-gpu: $(GPU_CHECK)
	RDMAX_BUILD=$(BUILD) tests/gpu/check-gpu.sh

# The same check alone (docs/gpu.md: how to run it on a GPU machine).
device-check: $(DEVICE_CHECK)
	RDMAX_BUILD=$(BUILD) tests/gpu/device-check

check-verbs: all
	RDMAX_BUILD=$(BUILD) RDMAX_VERBS_REQUIRED=$${RDMAX_VERBS_REQUIRED:-0} tests/run-verbs-suite

demo: all
	RDMAX_BUILD=$(BUILD) tools/demo.sh

# The examples see the public header only, as an application would.
$(BUILD)/examples/%: docs/examples/%.c client-lib/include/rdmax.h $(BUILD)/$(LIB_SONAME)
	@mkdir -p $(dir $@)
	$(QUIET_LD)$(CC) -std=gnu11 $(WARN) $(CFLAGS) $(SANFLAGS) -Iclient-lib/include -o $@ $< \
		-L$(BUILD) -lrdmax -Wl,-rpath,'$$ORIGIN/..' $(LDFLAGS_ALL)

examples: $(EXAMPLES)

# Every example against daemons on this machine, the way tools/demo.sh starts them.
run-examples: examples $(BUILD)/rdmaxd
	RDMAX_BUILD=$(BUILD) docs/examples/run.sh

# The same demo over the verbs transport between the two Soft-RoCE devices of the
# test guest, then ib_write_bw between the same devices for comparison.
demo-verbs: all
	tests/vm/run-in-guest --two-nodes -e RDMAX_BUILD=$(BUILD) -e RDMAX_DEMO_TRANSPORT=verbs \
		-e RDMAX_DEMO_ADDR_A=192.0.2.1 -e RDMAX_DEMO_ADDR_B=192.0.2.2 -- \
		bash -c 'tools/demo.sh && echo "== for comparison, perftest between the same devices" && \
			tests/run-verbs-suite --write-bw 65536 && \
			RDMAX_BW_PORT=18517 tests/run-verbs-suite --write-bw 4194304'

# Benchmarks, not tests: rdmax against perftest (Soft-RoCE guest) and raw TCP.
bench: $(BUILD)/rdmaxd $(BUILD)/rdmax-bench $(BENCH_TOOLS)
	RDMAX_BUILD=$(BUILD) tests/bench/run.sh

# libFuzzer targets (tests/fuzz/README.md), built by clang into build-fuzz/ with ASan and UBSan.
FUZZ_SECONDS ?= 20
FUZZ_TARGETS := $(patsubst tests/fuzz/fuzz_%.c,%,$(filter-out tests/fuzz/fuzz_daemon.c,$(wildcard tests/fuzz/fuzz_*.c)))
FUZZ_BINS := $(patsubst %,$(BUILD)/fuzz/fuzz_%,$(FUZZ_TARGETS))

$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_daemon.c tests/fuzz/fuzz.h tests/unit/pass_fds.h \
		$(DAEMON_LIB_OBJS)
	@mkdir -p $(dir $@)
	$(QUIET_LD)$(CC) $(ALL_CFLAGS) -fsanitize=fuzzer -o $@ $< tests/fuzz/fuzz_daemon.c \
		$(DAEMON_LIB_OBJS) $(LDFLAGS_ALL) $(LIBS_DAEMON)

fuzz-build:
	$(MAKE) FUZZ=1 $(patsubst %,build-fuzz/fuzz/fuzz_%,$(FUZZ_TARGETS))

# Run every target for FUZZ_SECONDS from its committed corpus; any report fails.
fuzz: fuzz-build
	FUZZ_SECONDS=$(FUZZ_SECONDS) tests/fuzz/run build-fuzz $(FUZZ_TARGETS)

# The seed corpora under tests/fuzz/corpus/, written again from tests/fuzz/seeds.c.
fuzz-seeds: $(BUILD)/fuzz/seeds
	$(BUILD)/fuzz/seeds tests/fuzz/corpus

$(BUILD)/fuzz/seeds: tests/fuzz/seeds.c $(DAEMON_LIB_OBJS)
	@mkdir -p $(dir $@)
	$(QUIET_LD)$(CC) $(ALL_CFLAGS) -o $@ $< $(DAEMON_LIB_OBJS) $(LDFLAGS_ALL) $(LIBS_DAEMON)

# Soak (tests/soak/README.md): three daemons, many clients, c restarted; DURATION seconds.
DURATION ?= 60
$(BUILD)/tests/soak: tests/soak/soak.c $(BUILD)/$(LIB_SONAME)
	@mkdir -p $(dir $@)
	$(QUIET_LD)$(CC) $(ALL_CFLAGS) -o $@ $< -L$(BUILD) -lrdmax -Wl,-rpath,'$$ORIGIN/..' $(LDFLAGS_ALL)

soak: $(BUILD)/rdmaxd $(BUILD)/tests/soak
	RDMAX_BUILD=$(BUILD) tests/soak/run $(DURATION)

# The same over verbs, in the Soft-RoCE guest: a on the first device, b on the second, c on the first.
soak-verbs: $(BUILD)/rdmaxd $(BUILD)/tests/soak
	tests/vm/run-in-guest --two-nodes --timeout $$(( $(DURATION) + 300 )) -e RDMAX_BUILD=$(BUILD) \
		-e SOAK_CLIENTS -e SOAK_RESTART_S -e SOAK_RSS_SLACK_KB -e SOAK_SEED -e SOAK_SILENT_JOBS -- \
		bash -c 'SOAK_TRANSPORT=verbs SOAK_ADDRS=$$RDMAX_GUEST_IP0,$$RDMAX_GUEST_IP1,$$RDMAX_GUEST_IP0 \
			tests/soak/run $(DURATION)'

format:
	clang-format -i $$(find daemon proto/common -name '*.[ch]') client-lib/*.[ch] client-lib/include/*.h tools/*.c tools/*/*.[ch] \
		tests/unit/*.[ch] tests/integration/*.[ch] tests/fuzz/*.[ch] tests/soak/*.c tests/bench/*.c tests/abi/*.c \
		docs/examples/*.c

install: all $(BUILD)/librdmax.pc
	install -d $(DESTDIR)$(SBINDIR) $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/pkgconfig \
		$(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(SYSCONFDIR)/rdmaxd $(DESTDIR)$(MANDIR)/man8
	install -m 0755 $(BUILD)/rdmaxd $(DESTDIR)$(SBINDIR)/rdmaxd
	install -m 0755 $(BUILD)/rdmaxctl $(DESTDIR)$(BINDIR)/rdmaxctl
	install -m 0755 $(BUILD)/$(LIB_SONAME) $(DESTDIR)$(LIBDIR)/$(LIB_SONAME)
	ln -sf $(LIB_SONAME) $(DESTDIR)$(LIBDIR)/librdmax.so
	install -m 0644 $(BUILD)/librdmax.a $(DESTDIR)$(LIBDIR)/librdmax.a
	install -m 0644 $(BUILD)/librdmax.pc $(DESTDIR)$(LIBDIR)/pkgconfig/librdmax.pc
	install -m 0644 client-lib/include/rdmax.h $(DESTDIR)$(INCLUDEDIR)/rdmax.h
	test -e $(DESTDIR)$(SYSCONFDIR)/rdmaxd/rdmaxd.conf || \
		install -m 0644 config/rdmaxd.conf $(DESTDIR)$(SYSCONFDIR)/rdmaxd/rdmaxd.conf
	for s in 3 5 8; do for m in docs/man/*.$$s; do [ -e "$$m" ] || continue; \
		install -d $(DESTDIR)$(MANDIR)/man$$s && install -m 0644 $$m $(DESTDIR)$(MANDIR)/man$$s/; done; done
	if [ -n "$(PY_HAVE)" ]; then \
		install -d $(DESTDIR)$(PYTHONDIR)/rdmax && \
		install -m 0644 $(PY_OUT) $(DESTDIR)$(PYTHONDIR)/rdmax/ && \
		$(CC) -std=gnu11 $(CFLAGS) -fPIC -shared -I$(PY_INC) -Iclient-lib/include \
			-o $(DESTDIR)$(PYTHONDIR)/rdmax/_rdmax$(PY_EXT) $(PY_SRCS) \
			-L$(BUILD) -l:$(LIB_SONAME) -Wl,-rpath,$(LIBDIR) -lpthread; \
	else echo "install: no Python headers ($(PYTHON), python3-dev): rdmax package not installed"; fi
	install -d $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(TMPFILESDIR)
	sed 's|^ExecStart=/usr/sbin/rdmaxd|ExecStart=$(SBINDIR)/rdmaxd|' systemd/rdmaxd.service \
		> $(DESTDIR)$(UNITDIR)/rdmaxd.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/rdmaxd.service
	install -m 0644 systemd/rdmaxd.socket systemd/rdmaxd-admin.socket $(DESTDIR)$(UNITDIR)/
	install -m 0644 systemd/rdmaxd.sysusers $(DESTDIR)$(SYSUSERSDIR)/rdmaxd.conf
	install -m 0644 systemd/rdmaxd.tmpfiles $(DESTDIR)$(TMPFILESDIR)/rdmaxd.conf

clean:
	rm -rf build build-san build-fuzz

.PHONY: all check check-layout check-unit check-abi check-python check-tcp check-discovery check-ops \
	check-verbs check-gpu device-check device-check-bundle demo demo-verbs examples run-examples \
	bench format install clean fuzz fuzz-build fuzz-seeds soak soak-verbs

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
