# hcoll: plain Makefile. `make` builds lib/ and bin/; `make test` runs the
# suite; `make demo` shows the library at work. V=1 prints full commands.

PREFIX     ?= /usr/local
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
BINDIR     ?= $(PREFIX)/bin
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
DESTDIR    ?=

CC        ?= cc
CFLAGS    ?= -O2 -g
HCOLL_CUDA ?= auto
CUDA_HOME ?= /usr/local/cuda

V ?= 0
ifeq ($(V),1)
Q :=
else
Q := @
endif

VERSION := $(shell sed -n 's/^\#define HCOLL_VERSION_STRING "\(.*\)"/\1/p' include/hcoll.h)
SOMAJOR := 0
SONAME  := libhcoll.so.$(SOMAJOR)

BUILD ?= build
GEN   := $(BUILD)/gen
# Where libraries and programs land; the ASan build keeps its own.
LIBOUT ?= lib
BINOUT ?= bin

# ---------------------------------------------------------------------------
# Optional parts: detected, never assumed. Results land in $(GEN)/hc_build.h;
# only the backend files that need a dependency look at them.
# ---------------------------------------------------------------------------
have_file = $(if $(wildcard $(1)),1,0)

ifeq ($(HCOLL_CUDA),0)
  HAVE_CUDA := 0
else
  HAVE_CUDA := $(call have_file,$(CUDA_HOME)/include/cuda_runtime.h)
  ifeq ($(HCOLL_CUDA),1)
    ifeq ($(HAVE_CUDA),0)
      $(error HCOLL_CUDA=1 but no CUDA toolkit at CUDA_HOME=$(CUDA_HOME) (no include/cuda_runtime.h); set CUDA_HOME or use HCOLL_CUDA=auto)
    endif
  else ifneq ($(HCOLL_CUDA),auto)
    $(error HCOLL_CUDA must be auto, 0 or 1 (got '$(HCOLL_CUDA)'))
  endif
endif
HAVE_NCCL   := $(if $(filter 1,$(HAVE_CUDA)),$(call have_file,$(CUDA_HOME)/include/nccl.h /usr/include/nccl.h),0)
# The GPU reduction kernels need nvcc; without it the library simply lacks
# them (and says so at run time). Nothing ever links against CUDA.
NVCC        ?= $(CUDA_HOME)/bin/nvcc
HAVE_NVCC   := $(if $(filter 1,$(HAVE_CUDA)),$(if $(wildcard $(NVCC)),1,0),0)
NVCC_GENCODE ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90]
HAVE_VERBS  := $(call have_file,/usr/include/infiniband/verbs.h)
HAVE_RDMACM := $(call have_file,/usr/include/rdma/rdma_cma.h)
HAVE_MPI    := $(if $(shell command -v mpicc 2>/dev/null),1,0)

BASE_CFLAGS := -std=gnu11 -fPIC -fvisibility=hidden -pthread -D_GNU_SOURCE \
               -Wall -Wextra -Iinclude -Isrc -I$(GEN) -MMD -MP
ALL_CFLAGS  := $(BASE_CFLAGS) $(CFLAGS)
LIB_LDLIBS  := -pthread -ldl -lrt -lm

# ---------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------
LIB_SRCS   := $(sort $(shell find src -name '*.c'))
LIB_OBJS   := $(LIB_SRCS:%.c=$(BUILD)/%.o)
CU_SRCS    := $(sort $(shell find src -name '*.cu'))
ifeq ($(HAVE_NVCC),1)
LIB_OBJS   += $(GEN)/hc_kernels_fatbin.o
endif
TOOL_SRCS  := $(sort $(wildcard tools/*.c bench/*.c))
TOOLS      := $(patsubst %.c,$(BINOUT)/%,$(notdir $(TOOL_SRCS)))
# Peer programs built with mpicc, only where Open MPI is installed.
MPI_SRCS   := $(if $(filter 1,$(HAVE_MPI)),$(sort $(wildcard bench/mpi/*.c)))
TOOLS      += $(patsubst %.c,$(BINOUT)/%,$(notdir $(MPI_SRCS)))
# What `make install` puts in BINDIR: the user tools. Micro-benchmarks
# (bench/) stay in the build tree.
USER_TOOLS := $(BINOUT)/hcoll_perf $(BINOUT)/hcoll_plan $(BINOUT)/hcoll_info
# Code shared by tools, benchmarks and tests (argument parsing, bandwidth
# arithmetic...): a static library of its own, never part of libhcoll.
TOOLLIB_SRCS := $(sort $(wildcard tools/lib/*.c))
TOOLLIB_OBJS := $(TOOLLIB_SRCS:%.c=$(BUILD)/%.o)
TOOLLIB      := $(BUILD)/libhctools.a
TEST_SRCS  := $(sort $(wildcard tests/test_*.c))
TESTS      := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)
# Driver emulations for the GPU tests (rules below).
MOCK_DIR   := $(BUILD)/mock
MOCKS      := $(MOCK_DIR)/libcuda.so.1 $(MOCK_DIR)/libnccl.so.2
ifeq ($(HAVE_VERBS),1)
MOCKS      += $(MOCK_DIR)/libibverbs.so.1
endif
TESTLIB_SRCS := $(sort $(wildcard tests/common/*.c))
TESTLIB_OBJS := $(TESTLIB_SRCS:%.c=$(BUILD)/%.o)
# Kept: as intermediate files make deleted them after each build, so the
# next make (make soak after make test, in CI) rebuilt them and relinked
# every test binary.
.SECONDARY: $(TESTLIB_OBJS)
EXAMPLE_SRCS := $(sort $(wildcard examples/*.c))
EXAMPLES   := $(EXAMPLE_SRCS:examples/%.c=$(BUILD)/examples/%)
# allreduce_mpi needs mpicc; device_side_stream the CUDA headers (it opens
# the driver at run time, so it links nothing of CUDA). Each is left out
# where its dependency is missing, and its test says so.
EXAMPLE_MPI  := $(BUILD)/examples/allreduce_mpi
EXAMPLE_CUDA := $(BUILD)/examples/device_side_stream
EXAMPLES   := $(filter-out $(if $(filter 1,$(HAVE_MPI)),,$(EXAMPLE_MPI)) \
                $(if $(filter 1,$(HAVE_CUDA)),,$(EXAMPLE_CUDA)),$(EXAMPLES))

STATIC_LIB := $(LIBOUT)/libhcoll.a
SHARED_REAL := $(LIBOUT)/libhcoll.so.$(VERSION)
SHARED_LIB := $(LIBOUT)/libhcoll.so

.PHONY: all lib tools tests examples test test-asan demo deps install uninstall clean
.DEFAULT_GOAL := all

all: lib tools examples

lib: $(STATIC_LIB) $(SHARED_LIB)
tools: $(TOOLS)
tests: $(TESTS) $(MOCKS)
examples: $(EXAMPLES)

# Regenerated every run, rewritten only when a detection result changed so
# that nothing rebuilds needlessly.
$(GEN)/hc_build.h: FORCE
	@mkdir -p $(GEN)
	@printf '%s\n' '/* Generated by the Makefile: what this build found. */' \
	  '#define HCOLL_BUILD_CUDA $(HAVE_CUDA)' \
	  '#define HCOLL_BUILD_NCCL $(HAVE_NCCL)' \
	  '#define HCOLL_BUILD_KERNELS $(HAVE_NVCC)' \
	  '#define HCOLL_BUILD_VERBS $(HAVE_VERBS)' \
	  '#define HCOLL_BUILD_RDMACM $(HAVE_RDMACM)' \
	  '#define HCOLL_BUILD_CUDA_HOME "$(CUDA_HOME)"' > $@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi
.PHONY: FORCE
FORCE:

$(BUILD)/%.o: %.c | $(GEN)/hc_build.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(ALL_CFLAGS) -c $< -o $@

# GPU kernels: every .cu into one fatbin (SASS for sm_80 and sm_90, PTX for
# newer GPUs), embedded with .incbin as the hidden symbol hc_kernels_fatbin.
$(GEN)/hc_kernels.fatbin: $(CU_SRCS)
	@mkdir -p $(GEN)
	@$(if $(Q),echo "  NVCC    $@")
	$(Q)$(NVCC) -fatbin -O3 $(NVCC_GENCODE) -o $@ $(CU_SRCS)
$(GEN)/hc_kernels_fatbin.o: $(GEN)/hc_kernels.fatbin
	@$(if $(Q),echo "  EMBED   $@")
	$(Q)printf '%s\n' '.section .rodata' '.balign 64' '.globl hc_kernels_fatbin' \
	  '.hidden hc_kernels_fatbin' '.type hc_kernels_fatbin, @object' 'hc_kernels_fatbin:' \
	  '.incbin "$<"' '.byte 0' '.size hc_kernels_fatbin, .-hc_kernels_fatbin' \
	  '.section .note.GNU-stack,"",@progbits' > $(GEN)/hc_kernels_fatbin.S
	$(Q)$(CC) -c $(GEN)/hc_kernels_fatbin.S -o $@

$(STATIC_LIB): $(LIB_OBJS)
	@mkdir -p $(LIBOUT)
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ && ar rcs $@ $^

$(SHARED_REAL): $(LIB_OBJS) src/hcoll.map
	@mkdir -p $(LIBOUT)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) -shared $(CFLAGS) -Wl,-soname,$(SONAME) -Wl,--version-script=src/hcoll.map \
	    -Wl,--no-undefined -o $@ $(LIB_OBJS) $(LIB_LDLIBS)

$(SHARED_LIB): $(SHARED_REAL)
	$(Q)ln -sf libhcoll.so.$(VERSION) $(LIBOUT)/$(SONAME)
	$(Q)ln -sf $(SONAME) $@

$(TOOLLIB): $(TOOLLIB_OBJS)
	@mkdir -p $(dir $@)
	$(Q)rm -f $@ && ar rcs $@ $^

# Tools and benchmarks see internal headers, so they link the static library.
# hcoll_perf is built with mpicc where Open MPI is installed, for --peer mpi.
PERF_CC := $(if $(filter 1,$(HAVE_MPI)),mpicc,$(CC))
$(BINOUT)/hcoll_perf: private CC := $(PERF_CC)
$(BINOUT)/hcoll_perf: private ALL_CFLAGS += -DHCOLL_PERF_MPI=$(HAVE_MPI)
$(BINOUT)/%: tools/%.c $(STATIC_LIB) $(TOOLLIB) | $(GEN)/hc_build.h
	@mkdir -p $(BINOUT) $(BUILD)/bin
	@$(if $(Q),echo "  CCLD    $@")
	$(Q)$(CC) $(ALL_CFLAGS) -Itools -MF $(BUILD)/bin/$*.d -o $@ $< $(TOOLLIB) $(STATIC_LIB) $(LIB_LDLIBS)
$(BINOUT)/%: bench/%.c $(STATIC_LIB) $(TOOLLIB) | $(GEN)/hc_build.h
	@mkdir -p $(BINOUT) $(BUILD)/bin
	@$(if $(Q),echo "  CCLD    $@")
	$(Q)$(CC) $(ALL_CFLAGS) -Itools -MF $(BUILD)/bin/$*.d -o $@ $< $(TOOLLIB) $(STATIC_LIB) $(LIB_LDLIBS)

$(BINOUT)/%: bench/mpi/%.c $(STATIC_LIB) | $(GEN)/hc_build.h
	@mkdir -p $(BINOUT) $(BUILD)/bin
	@$(if $(Q),echo "  MPICC   $@")
	$(Q)mpicc $(ALL_CFLAGS) -MF $(BUILD)/bin/$*.d -o $@ $< $(STATIC_LIB) $(LIB_LDLIBS)

# Examples are what users copy: public header and shared library only.
$(BUILD)/examples/%: examples/%.c $(SHARED_LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CCLD    $@")
	$(Q)$(CC) -std=gnu11 -Wall -Wextra $(CFLAGS) -Iinclude -o $@ $< -L$(LIBOUT) -lhcoll \
	    $(LIB_LDLIBS) -Wl,-rpath,'$(abspath $(LIBOUT))'
$(EXAMPLE_MPI): private CC := mpicc
# Its own rule: CFLAGS given on the command line (test-asan) would drop a
# target-specific -I.
$(EXAMPLE_CUDA): examples/device_side_stream.c $(SHARED_LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CCLD    $@")
	$(Q)$(CC) -std=gnu11 -Wall -Wextra $(CFLAGS) -Iinclude -I$(CUDA_HOME)/include -o $@ $< \
	    -L$(LIBOUT) -lhcoll $(LIB_LDLIBS) -Wl,-rpath,'$(abspath $(LIBOUT))'

CHECK_CFLAGS = $(shell pkg-config --cflags check 2>/dev/null)
CHECK_LIBS   = $(shell pkg-config --libs check 2>/dev/null)

$(BUILD)/tests/%: tests/%.c $(TESTLIB_OBJS) $(STATIC_LIB) $(TOOLLIB) | $(GEN)/hc_build.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CCLD    $@")
	$(Q)$(CC) $(ALL_CFLAGS) $(CHECK_CFLAGS) -Itests -Itools -MF $@.d -o $@ $< $(TESTLIB_OBJS) \
	    $(TOOLLIB) $(STATIC_LIB) $(CHECK_LIBS) $(LIB_LDLIBS)

# The ranks' side of the emulated cluster's split case (tests/cluster/):
# public API only, run by cluster-test.sh.
tests: $(BUILD)/tests/split_ranks
$(BUILD)/tests/split_ranks: tests/cluster/split_ranks.c $(STATIC_LIB) | $(GEN)/hc_build.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CCLD    $@")
	$(Q)$(CC) $(ALL_CFLAGS) -MF $@.d -o $@ $< $(STATIC_LIB) $(LIB_LDLIBS)

# scripts/gpu-check.sh's probes of what a real GPU does (tests/gpu_probe.c;
# its second half, the collective probes, in gpu_probe_coll.c). Not a test
# binary (no test_ prefix): tests/gpu-probe.test.sh runs it on the mock.
tests: $(BUILD)/tests/gpu_probe
$(BUILD)/tests/gpu_probe: tests/gpu_probe.c tests/gpu_probe_coll.c $(BUILD)/tests/common/ranks.o \
    $(STATIC_LIB) | $(GEN)/hc_build.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CCLD    $@")
	$(Q)$(CC) $(ALL_CFLAGS) -Itests -MF $@.d -o $@ tests/gpu_probe.c tests/gpu_probe_coll.c \
	    $(BUILD)/tests/common/ranks.o $(STATIC_LIB) $(LIB_LDLIBS)

# Driver emulations for the GPU tests on hosts without a GPU
# (tests/mock/hcmock.h): a libcuda.so.1 and a libnccl.so.2 that tests load
# through LD_LIBRARY_PATH=$(BUILD)/mock. Never installed, never in libhcoll.
MOCK_CFLAGS := -std=gnu11 -O2 -g -fPIC -fvisibility=hidden -pthread -D_GNU_SOURCE -Wall -Wextra \
               -Iinclude -Isrc -Itests/mock $(filter -fsanitize=%,$(CFLAGS))
# The host kernels read HCOLL_CPU_KERNELS through the knob table.
MOCK_REDUCE := src/base/reduce.c src/base/config.c src/sys/envlist.c
$(MOCK_DIR)/libcuda.so.1: tests/mock/cuda.c tests/mock/hcmock.h $(MOCK_REDUCE) src/base/reduce.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  MOCK    $@")
	$(Q)$(CC) $(MOCK_CFLAGS) -shared -Wl,-soname,libcuda.so.1 -o $@ tests/mock/cuda.c \
	    $(MOCK_REDUCE) -pthread -lrt -lm
$(MOCK_DIR)/libnccl.so.2: tests/mock/nccl.c tests/mock/hcmock.h $(MOCK_REDUCE) $(MOCK_DIR)/libcuda.so.1
	@$(if $(Q),echo "  MOCK    $@")
	$(Q)$(CC) $(MOCK_CFLAGS) -shared -Wl,-soname,libnccl.so.2 -o $@ tests/mock/nccl.c \
	    $(MOCK_REDUCE) $(MOCK_DIR)/libcuda.so.1 -Wl,-rpath,'$$ORIGIN' -pthread -lrt -lm
# Needs rdma-core's headers (the provider ABI of struct ibv_context).
$(MOCK_DIR)/libibverbs.so.1: tests/mock/verbs.c tests/mock/hcmock.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  MOCK    $@")
	$(Q)$(CC) $(MOCK_CFLAGS) -shared -Wl,-soname,libibverbs.so.1 -o $@ tests/mock/verbs.c \
	    -pthread -ldl -lrt
# LD_PRELOAD'ed with HCMOCK_PAGE_SIZE: a host whose pages are that big.
tests: $(MOCK_DIR)/libhcmock_page.so
$(MOCK_DIR)/libhcmock_page.so: tests/mock/pagesize.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  MOCK    $@")
	$(Q)$(CC) $(MOCK_CFLAGS) -shared -o $@ $<

$(BUILD)/tests/common/%.o: tests/common/%.c | $(GEN)/hc_build.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(ALL_CFLAGS) $(CHECK_CFLAGS) -Itests -c $< -o $@

# ---------------------------------------------------------------------------
# The two commands of the README
# ---------------------------------------------------------------------------
deps:
	$(Q)scripts/install-deps.sh

test: deps
	$(Q)$(MAKE) --no-print-directory all tests
	$(Q)tests/run.sh

# The whole suite (tests/run.sh, as make test) on a build with ASan and
# UBSan, in its own build tree build-asan/. UBSan's reports halt the
# program (it would carry on, and the test pass); under ASan's slowdown
# each test gets 20 minutes, and each Check case 4 times its timeout.
test-asan: deps
	$(Q)$(MAKE) --no-print-directory BUILD=build-asan LIBOUT=build-asan/lib BINOUT=build-asan/bin \
	    CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer" \
	    LIB_LDLIBS="-fsanitize=address,undefined -pthread -ldl -lrt -lm" all tests
	$(Q)UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1 $$UBSAN_OPTIONS" \
	    HCOLL_TEST_TIMEOUT=$${HCOLL_TEST_TIMEOUT:-1200} CK_TIMEOUT_MULTIPLIER=$${CK_TIMEOUT_MULTIPLIER:-4} \
	    HCOLL_TEST_BUILD=build-asan tests/run.sh

# libFuzzer targets (tests/fuzz/fuzz_*.c), one per parser of bytes from the
# network or another process. `make fuzz` builds the library with clang
# under ASan+UBSan in build-fuzz/ and runs each target FUZZ_SECONDS on the
# seeds of tests/fuzz/corpus/<target>/, FUZZ_JOBS at a time. make test
# replays every seed and every crash kept in tests/fuzz/regress/<target>/
# through the same targets built with $(CC) (build/fuzz/replay_*).
FUZZ_SECONDS ?= 20
FUZZ_JOBS    ?= 2
FUZZ_CC      ?= clang
FUZZ_SRCS    := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_NAMES   := $(FUZZ_SRCS:tests/fuzz/fuzz_%.c=%)
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
.PHONY: fuzz fuzz-build
fuzz: fuzz-build
	$(Q)FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_JOBS=$(FUZZ_JOBS) tests/fuzz/run.sh $(FUZZ_NAMES)
fuzz-build:
	$(Q)command -v $(FUZZ_CC) >/dev/null || { echo "make fuzz needs $(FUZZ_CC) (scripts/install-deps.sh installs clang)"; exit 1; }
	$(Q)$(MAKE) --no-print-directory BUILD=build-fuzz LIBOUT=build-fuzz/lib BINOUT=build-fuzz/bin \
	    CC=$(FUZZ_CC) HAVE_NVCC=0 CFLAGS="-O1 -g -fsanitize=fuzzer-no-link $(FUZZ_SAN)" \
	    build-fuzz/lib/libhcoll.a
	$(Q)mkdir -p build-fuzz/fuzz
	$(Q)for t in $(FUZZ_NAMES); do \
	  [ build-fuzz/fuzz/fuzz_$$t -nt tests/fuzz/fuzz_$$t.c ] && [ build-fuzz/fuzz/fuzz_$$t -nt build-fuzz/lib/libhcoll.a ] \
	    && [ build-fuzz/fuzz/fuzz_$$t -nt tests/fuzz/fuzz.h ] && continue; \
	  $(if $(Q),echo "  FUZZ    build-fuzz/fuzz/fuzz_$$t";) \
	  $(FUZZ_CC) -Ibuild-fuzz/gen $(BASE_CFLAGS) -O1 -g -fsanitize=fuzzer $(FUZZ_SAN) -Itests/fuzz -MF /dev/null \
	    -o build-fuzz/fuzz/fuzz_$$t tests/fuzz/fuzz_$$t.c build-fuzz/lib/libhcoll.a $(LIB_LDLIBS) || exit 1; \
	done
tests: $(FUZZ_NAMES:%=$(BUILD)/fuzz/replay_%)
$(BUILD)/fuzz/replay_%: tests/fuzz/fuzz_%.c tests/fuzz/replay.c tests/fuzz/fuzz.h $(STATIC_LIB) | $(GEN)/hc_build.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CCLD    $@")
	$(Q)$(CC) $(ALL_CFLAGS) -Itests/fuzz -MF $@.d -o $@ $< tests/fuzz/replay.c $(STATIC_LIB) $(LIB_LDLIBS)

# The threaded tests (progress engine, abort from another thread,
# callbacks, liveness, split) under ThreadSanitizer, in their own build tree,
# alongside test-asan. tests/tsan.supp lists the suppressions, each with
# why it is benign; a report fails the test (halt_on_error).
# NAME:CASE runs one Check case (test_allreduce's shapes take over 15
# minutes under TSan; its requests case is the threaded one).
TSAN_TESTS ?= test_callback test_comm test_allreduce:requests test_allreduce:failures \
              test_live test_split test_boot
.PHONY: test-tsan
test-tsan: deps
	$(Q)$(MAKE) --no-print-directory BUILD=build-tsan LIBOUT=build-tsan/lib BINOUT=build-tsan/bin \
	    HAVE_NVCC=0 CFLAGS="-O1 -g -fsanitize=thread -fno-omit-frame-pointer" \
	    LIB_LDLIBS="-fsanitize=thread -pthread -ldl -lrt -lm" lib \
	    $(sort $(foreach t,$(TSAN_TESTS),build-tsan/tests/$(firstword $(subst :, ,$(t)))))
	$(Q)fail=0; for t in $(TSAN_TESTS); do c=$${t#*:}; [ "$$c" = "$$t" ] && c=; \
	  TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1 suppressions=$(abspath tests/tsan.supp) $$TSAN_OPTIONS" \
	    env $${c:+CK_RUN_CASE=$$c} HCOLL_TEST_BUILD=build-tsan tests/run.sh $${t%%:*} || fail=1; done; exit $$fail

demo: deps
	$(Q)$(MAKE) --no-print-directory all
	$(Q)scripts/demo.sh

# The emulated rail-optimized cluster (root): namespaces, veth, tc; ~3 min.
.PHONY: test-cluster
test-cluster: deps
	$(Q)$(MAKE) --no-print-directory all
	$(Q)tests/cluster/cluster-test.sh

# The soak (tests/soak.c): a 2 x 2 job of random, verified collectives for
# SOAK_MINUTES, failing on a wrong element, an error, or growing RSS, fds or
# threads. Not part of `make test`. SOAK_SEED repeats a run. Then the
# lifecycle test at LIFECYCLE_CYCLES (make test runs it at 100; 0: not run).
SOAK_MINUTES ?= 2
LIFECYCLE_CYCLES ?= 1000
.PHONY: soak
tests: $(BUILD)/tests/soak
$(BUILD)/tests/soak: tests/soak.c tests/soak_proc.h $(BUILD)/tests/common/ranks.o $(STATIC_LIB) | $(GEN)/hc_build.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CCLD    $@")
	$(Q)$(CC) $(ALL_CFLAGS) -Itests -MF $@.d -o $@ $< $(BUILD)/tests/common/ranks.o $(STATIC_LIB) $(LIB_LDLIBS) -lm
soak: deps
	$(Q)$(MAKE) --no-print-directory all tests
	$(Q)$(BUILD)/tests/soak -m $(SOAK_MINUTES) $(if $(SOAK_SEED),-s $(SOAK_SEED))
	$(Q)[ "$(LIFECYCLE_CYCLES)" = 0 ] || \
	  HCOLL_LIFECYCLE_CYCLES=$(LIFECYCLE_CYCLES) $(BUILD)/tests/test_lifecycle

# The torch.distributed backend "hcoll" (python/hcoll/csrc, a C++ extension
# against the system's torch): built ahead of its first use, cached in
# build/torch_ext. Skipped, with a note, where torch or its headers are absent.
TORCH_PY ?= /usr/bin/python3
.PHONY: python
python: lib
	$(Q)if $(TORCH_PY) -c 'import torch' 2>/dev/null; then \
	  PYTHONPATH=$(abspath python) $(TORCH_PY) -c 'import hcoll._c10d as c; c.load(verbose=$(if $(Q),False,True)); print("  TORCHEXT build/torch_ext/_hcoll_c10d.so")'; \
	else echo "python: $(TORCH_PY) has no torch; the c10d extension is not built"; fi

# ---------------------------------------------------------------------------
install: lib $(USER_TOOLS)
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(PKGCONFIGDIR) $(DESTDIR)$(BINDIR)
	install -m 644 include/hcoll.h $(DESTDIR)$(INCLUDEDIR)/hcoll.h
	install -m 755 $(SHARED_REAL) $(DESTDIR)$(LIBDIR)/
	ln -sf libhcoll.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libhcoll.so
	install -m 644 $(STATIC_LIB) $(DESTDIR)$(LIBDIR)/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' \
	    -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' -e 's|@VERSION@|$(VERSION)|' \
	    hcoll.pc.in > $(DESTDIR)$(PKGCONFIGDIR)/hcoll.pc
	install -m 755 $(USER_TOOLS) $(DESTDIR)$(BINDIR)/

# The Python package (python/hcoll, pure Python): under PYTHONDIR, with the
# final LIBDIR recorded in hcoll/_prefix.py so that it loads this install's
# libhcoll.so.0. The default is Debian's layout; a PREFIX other than /usr
# needs PYTHONPATH=$(PYTHONDIR). (pip: see python/pyproject.toml.)
PYTHONDIR ?= $(LIBDIR)/python3/dist-packages
.PHONY: install-python uninstall-python
install: install-python
install-python:
	install -d $(DESTDIR)$(PYTHONDIR)/hcoll
	$(Q)cd python && find hcoll -name __pycache__ -prune -o -type f \( -name '*.py' -o \
	    -path 'hcoll/csrc/*' \) -print | while read -r f; do \
	    install -D -m 644 "$$f" "$(DESTDIR)$(PYTHONDIR)/$$f" || exit 1; done
	$(Q)printf '%s\n' '"""Written by make install: where this copy loads libhcoll from."""' \
	    'LIBDIR = "$(LIBDIR)"' > $(DESTDIR)$(PYTHONDIR)/hcoll/_prefix.py
uninstall: uninstall-python
uninstall-python:
	rm -rf $(DESTDIR)$(PYTHONDIR)/hcoll

uninstall:
	rm -f $(DESTDIR)$(INCLUDEDIR)/hcoll.h $(DESTDIR)$(LIBDIR)/libhcoll.so* \
	      $(DESTDIR)$(LIBDIR)/libhcoll.a $(DESTDIR)$(PKGCONFIGDIR)/hcoll.pc \
	      $(addprefix $(DESTDIR)$(BINDIR)/,$(notdir $(USER_TOOLS)))

# Gloo's all-reduce against hcoll (and MPI_Allreduce, built with mpicxx
# where Open MPI is installed): bench/gloo_bench.cc against Debian's
# libgloo-dev. Part of `make all` where libgloo-dev is installed; skipped,
# with a message, where it is not. `make plot` redraws bench/sweep-2x2-lo.png
# from the JSON of bench/gloo_sweep.sh (bench/plot_sweep.py, python3-matplotlib).
HAVE_GLOO  := $(if $(wildcard /usr/include/gloo/allreduce.h),$(if $(wildcard /usr/lib/libgloo.so /usr/lib/*/libgloo.so),1,0),0)
GLOO_CXX   := $(if $(filter 1,$(HAVE_MPI)),mpicxx,$(CXX))
GLOO_SAN   := $(filter -fsanitize=% -fno-omit-frame-pointer,$(CFLAGS))
.PHONY: gloo plot
all: gloo
ifeq ($(HAVE_GLOO),1)
gloo: $(BINOUT)/gloo_bench
else
gloo:
	@echo "  SKIP    $(BINOUT)/gloo_bench: libgloo-dev is not installed (apt-get install libgloo-dev)"
endif
$(BINOUT)/gloo_bench: bench/gloo_bench.cc $(STATIC_LIB) | $(GEN)/hc_build.h
	@mkdir -p $(BINOUT) $(BUILD)/bin
	@$(if $(Q),echo "  CXXLD   $@")
	$(Q)$(GLOO_CXX) -std=c++17 -O2 -g -Wall -Wextra -pthread -Iinclude $(GLOO_SAN) \
	    -DGLOO_BENCH_MPI=$(HAVE_MPI) -DOMPI_SKIP_MPICXX=1 -MMD -MP -MF $(BUILD)/bin/gloo_bench.d -o $@ $< \
	    $(STATIC_LIB) -lgloo $(LIB_LDLIBS) $(GLOO_SAN)
PLOT_PY    ?= $(if $(wildcard /usr/bin/python3),/usr/bin/python3,python3)
plot:
	$(Q)$(PLOT_PY) bench/plot_sweep.py -o bench/sweep-2x2-lo.png bench/sweep-2x2-lo-rep*.json

clean:
	rm -rf build build-asan build-tsan build-fuzz lib bin

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
