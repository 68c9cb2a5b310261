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
DESTDIR ?=

SAN ?= 0
ifeq ($(SAN),1)
BUILD ?= build-san
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
else
BUILD ?= build
SANFLAGS :=
endif

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
PKGS := libibverbs librdmacm libuv libprotobuf-c libsystemd check inih libsodium
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS))
CUDA_INC := $(firstword $(wildcard /usr/local/cuda/include))
CUDA_CFLAGS := $(if $(CUDA_INC),-I$(CUDA_INC) -DRDMAX_HAVE_CUDA_H=1,)

CFLAGS ?= -O2 -g
WARN := -Wall -Wextra -Werror -Wno-unused-parameter -Wshadow -Wformat=2 -Wmissing-prototypes
CPPFLAGS_ALL := -D_GNU_SOURCE -I$(BUILD)/gen -Iclient-lib/include -Idaemon $(PKG_CFLAGS)
ALL_CFLAGS := -std=gnu11 $(WARN) $(CFLAGS) $(SANFLAGS) -fPIC $(CPPFLAGS_ALL)
LDFLAGS_ALL := $(SANFLAGS) $(LDFLAGS)

LIBS_DAEMON := $(shell pkg-config --libs libibverbs librdmacm libuv libprotobuf-c libsystemd inih libsodium) -ldl -lm
LIBS_CLIENT := $(shell pkg-config --libs libprotobuf-c) -ldl
LIBS_CHECK := $(shell pkg-config --libs check)

LIB_SONAME := librdmax.so.1
LIB_VERSION := 1.0.0

PROTO_SRC := proto/rdmax.proto
GEN_C := $(BUILD)/gen/rdmax.pb-c.c
GEN_H := $(BUILD)/gen/rdmax.pb-c.h

DAEMON_SRCS := $(wildcard daemon/*.c)
DAEMON_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(DAEMON_SRCS)) $(BUILD)/gen/rdmax.pb-c.o \
	$(BUILD)/client-lib/strerror.o
DAEMON_LIB_OBJS := $(filter-out $(BUILD)/daemon/main.o,$(DAEMON_OBJS))

CLIENT_SRCS := $(wildcard client-lib/*.c)
CLIENT_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(CLIENT_SRCS)) $(BUILD)/gen/rdmax.pb-c.o

TOOLS := $(patsubst tools/%.c,$(BUILD)/%,$(wildcard tools/*.c))
UNIT_SRCS := $(wildcard tests/unit/*.c)
ITEST_SRCS := $(wildcard tests/integration/*.c)

all: $(BUILD)/rdmaxd $(BUILD)/$(LIB_SONAME) $(BUILD)/librdmax.a $(BUILD)/librdmax.pc $(TOOLS) \
	$(BUILD)/tests/unit-tests $(BUILD)/tests/itest

$(GEN_C) $(GEN_H): $(PROTO_SRC)
	@mkdir -p $(BUILD)/gen
	$(Q)protoc-c --c_out=$(BUILD)/gen -Iproto $(PROTO_SRC)

$(BUILD)/gen/rdmax.pb-c.o: $(GEN_C)
	$(QUIET_CC)$(CC) $(ALL_CFLAGS) -fvisibility=hidden -Wno-missing-prototypes -c -o $@ $<

$(BUILD)/%.o: %.c $(GEN_H)
	@mkdir -p $(dir $@)
	$(QUIET_CC)$(CC) $(ALL_CFLAGS) $(CUDA_CFLAGS) -fvisibility=hidden -MMD -MP -c -o $@ $<

$(BUILD)/rdmaxd: $(DAEMON_OBJS)
	$(QUIET_LD)$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIBS_DAEMON)

$(BUILD)/$(LIB_SONAME): $(CLIENT_OBJS) client-lib/librdmax.map
	$(QUIET_LD)$(CC) $(LDFLAGS_ALL) -shared -Wl,-soname,$(LIB_SONAME) \
		-Wl,--version-script=client-lib/librdmax.map -o $@ $(CLIENT_OBJS) $(LIBS_CLIENT)
	ln -sf $(LIB_SONAME) $(BUILD)/librdmax.so

$(BUILD)/librdmax.a: $(CLIENT_OBJS)
	rm -f $@
	ar rcs $@ $^

$(BUILD)/librdmax.pc: client-lib/librdmax.pc.in
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' \
		-e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' -e 's|@VERSION@|$(LIB_VERSION)|g' $< > $@

# Programs over the public library only.
$(BUILD)/%: tools/%.c $(BUILD)/$(LIB_SONAME)
	$(QUIET_LD)$(CC) $(ALL_CFLAGS) -MMD -MP -o $@ $< -L$(BUILD) -lrdmax -Wl,-rpath,'$$ORIGIN' $(LDFLAGS_ALL) -lm

# Unit tests link the daemon's modules and the client library's objects.
$(BUILD)/tests/unit-tests: $(UNIT_SRCS) $(DAEMON_LIB_OBJS) $(CLIENT_OBJS)
	@mkdir -p $(dir $@)
	$(QUIET_LD)$(CC) $(ALL_CFLAGS) -o $@ $(UNIT_SRCS) $(DAEMON_LIB_OBJS) \
		$(filter-out $(BUILD)/gen/rdmax.pb-c.o $(BUILD)/client-lib/strerror.o,$(CLIENT_OBJS)) $(LDFLAGS_ALL) $(LIBS_DAEMON) $(LIBS_CHECK)

$(BUILD)/tests/itest: $(ITEST_SRCS) $(BUILD)/$(LIB_SONAME)
	@mkdir -p $(dir $@)
	$(QUIET_LD)$(CC) $(ALL_CFLAGS) -o $@ $(ITEST_SRCS) -L$(BUILD) -lrdmax -Wl,-rpath,'$$ORIGIN/..' \
		$(LDFLAGS_ALL) $(LIBS_CHECK) -lm

check: all
	@echo "== unit tests"
	$(BUILD)/tests/unit-tests
	@echo "== integration tests (TCP transport, host)"
	RDMAX_BUILD=$(BUILD) $(BUILD)/tests/itest
	@echo "== integration tests (verbs transport, Soft-RoCE guest)"
	RDMAX_BUILD=$(BUILD) tests/run-verbs-suite

check-unit: $(BUILD)/tests/unit-tests
	$(BUILD)/tests/unit-tests

check-tcp: all
	RDMAX_BUILD=$(BUILD) $(BUILD)/tests/itest

check-verbs: all
	RDMAX_BUILD=$(BUILD) RDMAX_VERBS_REQUIRED=$${RDMAX_VERBS_REQUIRED:-0} tests/run-verbs-suite

demo: all
	RDMAX_BUILD=$(BUILD) tools/demo.sh

format:
	clang-format -i daemon/*.[ch] client-lib/*.[ch] client-lib/include/*.h tools/*.c \
		tests/unit/*.[ch] tests/integration/*.[ch]

install: all
	install -d $(DESTDIR)$(SBINDIR) $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/pkgconfig \
		$(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(SYSCONFDIR)/rdmaxd $(DESTDIR)$(MANDIR)/man8
	install -m 0755 $(BUILD)/rdmaxd $(DESTDIR)$(SBINDIR)/rdmaxd
	install -m 0755 $(BUILD)/$(LIB_SONAME) $(DESTDIR)$(LIBDIR)/$(LIB_SONAME)
	ln -sf $(LIB_SONAME) $(DESTDIR)$(LIBDIR)/librdmax.so
	install -m 0644 $(BUILD)/librdmax.a $(DESTDIR)$(LIBDIR)/librdmax.a
	install -m 0644 $(BUILD)/librdmax.pc $(DESTDIR)$(LIBDIR)/pkgconfig/librdmax.pc
	install -m 0644 client-lib/include/rdmax.h $(DESTDIR)$(INCLUDEDIR)/rdmax.h
	test -e $(DESTDIR)$(SYSCONFDIR)/rdmaxd/rdmaxd.conf || \
		install -m 0644 config/rdmaxd.conf $(DESTDIR)$(SYSCONFDIR)/rdmaxd/rdmaxd.conf
	for m in docs/man/*.8; do [ -e "$$m" ] && install -m 0644 $$m $(DESTDIR)$(MANDIR)/man8/ || true; done

clean:
	rm -rf build build-san

.PHONY: all check check-unit check-tcp check-verbs demo format install clean

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
