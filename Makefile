# dhsa build. `make` builds build/libdhsa.a, build/libdhsa.so and build/dhsa;
# `make test` builds and runs every tests/test_*.c and ends with
# "N passed, N failed"; `make asan` / `make ubsan` run the tests under
# sanitizers (in build-asan/ and build-ubsan/).
#
# Sources are found by wildcard: src/*/*.c. Files named *_avx512.c,
# *_vnni.c (AVX-512 and VNNI), *_avx512bf16.c (AVX-512 and AVX512-BF16),
# *_amx.c (those and the AMX tiles with BF16), *_amxi8.c (AVX512-VNNI and
# the AMX tiles with int8),
# *_avxvnni.c and *_avx2.c are per-ISA kernels compiled with their own flags (x86-64 only;
# on other machines they compile to nothing and the scalar path runs).
#
# -fvisibility=hidden: libdhsa.so exports only what include/dhsa.h declares
# with DHSA_API (tests/test_exports.c checks; docs/architecture.md).

CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
WERROR  ?= -Werror
CFLAGS_BASE = -std=c11 -g $(OPT) -fPIC -fvisibility=hidden -Wall -Wextra -Wpedantic -Wshadow $(WERROR) \
              -D_GNU_SOURCE -Iinclude -Isrc $(EXTRA_CFLAGS)
LDLIBS  = -lpthread -lm $(EXTRA_LDFLAGS)

ARCH := $(shell uname -m)
ifeq ($(ARCH),x86_64)
  AVX512_FLAGS = -mavx512f -mavx512bw -mavx512dq -mavx512vl -mfma -mf16c
  AVX2_FLAGS   = -mavx2 -mfma -mf16c
  VNNI_FLAGS   = $(AVX512_FLAGS) -mavx512vnni
  # AVX-VNNI (vpdpbusd on ymm): GCC >= 11, clang >= 12; without it
  # int8_avxvnni.c builds empty and the AVX2 kernels run instead.
  AVXVNNI_FLAGS := $(AVX2_FLAGS) $(shell echo | $(CC) -mavxvnni -E -x c - >/dev/null 2>&1 && echo -mavxvnni)
  # AVX512-BF16 (vdpbf16ps): GCC >= 10, clang >= 9; without it
  # bf16_avx512bf16.c builds empty and F16/BF16 weights take the exact route.
  BF16_FLAGS := $(AVX512_FLAGS) $(shell echo | $(CC) -mavx512bf16 -E -x c - >/dev/null 2>&1 && echo -mavx512bf16)
  # AMX tiles with BF16 (GCC >= 11, clang >= 12): the prefill route of
  # amx_amx.c; without them it builds empty and prefill stays on the
  # integer or exact route.
  AMX_FLAGS := $(BF16_FLAGS) $(shell echo | $(CC) -mamx-tile -mamx-bf16 -E -x c - >/dev/null 2>&1 && echo -mamx-tile -mamx-bf16)
  # AMX tiles with int8 products (GCC >= 11, clang >= 12): the K panel of
  # int8_amxi8.c; without them it builds empty and the VNNI kernels run.
  AMXI8_FLAGS := $(VNNI_FLAGS) $(shell echo | $(CC) -mamx-tile -mamx-int8 -E -x c - >/dev/null 2>&1 && echo -mamx-tile -mamx-int8)
else
  AMX_FLAGS    =
  AMXI8_FLAGS  =
  BF16_FLAGS   =
  VNNI_FLAGS   =
  AVXVNNI_FLAGS =
  AVX512_FLAGS =
  AVX2_FLAGS   =
endif

SRCS  := $(sort $(wildcard src/*/*.c))
OBJS  := $(patsubst src/%.c,$(BUILD)/obj/%.o,$(SRCS))
HDRS  := $(wildcard include/*.h include/dhsa/*.h src/*/*.h)
TESTS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(sort $(wildcard tests/test_*.c)))
# The CLI's support library build/libdhsa_cli.a (tools/lib/, docs/architecture.md):
# the JSON writer, number parsing, the model line, SVG plots, the measured
# peaks and the memory probe. The CLI and the tests link it (tests compile no
# file of tools/); libdhsa does not contain it.
CLI_LIB_SRCS := $(sort $(wildcard tools/lib/*.c))
CLI_LIB_HDRS := tools/cli.h $(wildcard tools/lib/*.h)
# The engine of dhsa serve (slots, queue, prompt cache, batcher; libdhsa and
# pthreads only, no HTTP or JSON) and its request parser (tools/serve/request.c,
# built with the server's flags) as build/libdhsa_serve.a, which the CLI,
# tests/test_serve_engine and tests/test_serve link.
SERVE_ENGINE_SRCS := tools/serve/engine.c
SERVE_LIB_SRCS := $(SERVE_ENGINE_SRCS) tools/serve/request.c
TOOLS_SRCS := $(filter-out $(CLI_LIB_SRCS) $(SERVE_LIB_SRCS),$(sort $(wildcard tools/*.c tools/serve/*.c)))
# Small programs the tests drive (memory-probe targets and the like).
PROGS := $(patsubst tests/progs/%.c,$(BUILD)/progs/%,$(sort $(wildcard tests/progs/*.c)))

# dhsa serve (tools/serve/) speaks HTTP through libmicrohttpd and JSON
# through jansson (docs/server.md), found by pkg-config; libdhsa never
# links them. Without them the CLI is built without the server (`dhsa
# serve` then names the packages to install and tests/test_serve skips);
# .ci/run installs them (Debian: libmicrohttpd-dev libjansson-dev
# pkg-config). `make HAVE_SERVE=` builds without them on purpose (the CLI
# is rebuilt when this changes: CLI_STAMP below).
SERVE_PKGS := libmicrohttpd jansson
HAVE_SERVE ?= $(shell pkg-config --exists $(SERVE_PKGS) 2>/dev/null && echo 1)
ifeq ($(HAVE_SERVE),1)
  SERVE_CFLAGS := -DDHSA_HAVE_SERVE $(shell pkg-config --cflags $(SERVE_PKGS))
  SERVE_LIBS := $(shell pkg-config --libs $(SERVE_PKGS))
endif

# Context parallelism over MPI (tools/dist_mpi.c, docs/dist.md): the CLI
# links Open MPI when pkg-config finds mpi-c (Debian: openmpi-bin
# libopenmpi-dev, which .ci/run installs); libdhsa never does. Without it
# the CLI refuses an mpirun launch of more than one rank and tests/test_dist
# skips. `make HAVE_MPI=` builds without it on purpose (the CLI is rebuilt).
HAVE_MPI ?= $(shell pkg-config --exists mpi-c 2>/dev/null && echo 1)
ifeq ($(HAVE_MPI),1)
  MPI_CFLAGS := -DDHSA_HAVE_MPI $(patsubst -I%,-isystem %,$(shell pkg-config --cflags mpi-c))
  MPI_LIBS := $(shell pkg-config --libs mpi-c)
endif

# dhsa chat (tools/chat.c) edits its input line with libedit (BSD
# licence; Debian: libedit-dev) or else GNU readline (GPL-3: a binary
# linked with it is distributed under the GPL; Debian: libreadline-dev),
# found by pkg-config; without either it reads plain lines. Only the CLI
# links it. `make LINE_EDIT=` builds without.
LINE_EDIT ?= $(shell pkg-config --exists libedit 2>/dev/null && echo libedit || \
               { pkg-config --exists readline 2>/dev/null && echo readline; })
ifeq ($(LINE_EDIT),libedit)
  LINE_CFLAGS := -DDHSA_HAVE_LIBEDIT $(filter-out -D%,$(shell pkg-config --cflags libedit))
  LINE_LIBS := $(shell pkg-config --libs libedit)
else ifeq ($(LINE_EDIT),readline)
  LINE_CFLAGS := -DDHSA_HAVE_READLINE $(filter-out -D%,$(shell pkg-config --cflags readline))
  LINE_LIBS := $(shell pkg-config --libs readline)
endif

# What the CLI is built with: when it changes (libmicrohttpd or Open MPI
# installed or removed, HAVE_SERVE= given, another compiler or flags), the
# stamp $(BUILD)/cli-config.txt is rewritten here and the CLI (and
# test_serve) are rebuilt by the next `make`, no `make clean` needed. The
# file is rewritten only when its text changes, so an unchanged setup
# rebuilds nothing. Tested by tests/test_cli_small.c.
CLI_CONFIG := cc=$(CC) cflags=$(CFLAGS_BASE) serve=$(HAVE_SERVE) $(SERVE_CFLAGS) $(SERVE_LIBS) \
              mpi=$(HAVE_MPI) $(MPI_CFLAGS) $(MPI_LIBS) line=$(LINE_EDIT) $(LINE_CFLAGS) $(LINE_LIBS) \
              ldlibs=$(LDLIBS)
CLI_STAMP := $(BUILD)/cli-config.txt
$(shell mkdir -p '$(BUILD)' && printf '%s\n' '$(CLI_CONFIG)' | cmp -s - '$(CLI_STAMP)' || \
  printf '%s\n' '$(CLI_CONFIG)' > '$(CLI_STAMP)')

.PHONY: all test test-torch asan ubsan clean fuzz
all: $(BUILD)/libdhsa.a $(BUILD)/libdhsa.so $(BUILD)/dhsa

$(BUILD)/obj/%_avx512.o: src/%_avx512.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(AVX512_FLAGS) -c $< -o $@

$(BUILD)/obj/%_vnni.o: src/%_vnni.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(VNNI_FLAGS) -c $< -o $@

$(BUILD)/obj/%_avx512bf16.o: src/%_avx512bf16.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(BF16_FLAGS) -c $< -o $@

$(BUILD)/obj/%_amx.o: src/%_amx.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(AMX_FLAGS) -c $< -o $@

$(BUILD)/obj/%_amxi8.o: src/%_amxi8.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(AMXI8_FLAGS) -c $< -o $@

$(BUILD)/obj/%_avxvnni.o: src/%_avxvnni.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(AVXVNNI_FLAGS) -c $< -o $@

$(BUILD)/obj/%_avx2.o: src/%_avx2.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(AVX2_FLAGS) -c $< -o $@

$(BUILD)/obj/%.o: src/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -c $< -o $@

$(BUILD)/libdhsa.a: $(OBJS)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libdhsa.so: $(OBJS)
	$(CC) -shared -o $@ $^ $(LDLIBS)

$(BUILD)/obj/tools/%_avx512.o: tools/%_avx512.c $(CLI_LIB_HDRS) $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(AVX512_FLAGS) -Itools -c $< -o $@

$(BUILD)/obj/tools/%_avx2.o: tools/%_avx2.c $(CLI_LIB_HDRS) $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(AVX2_FLAGS) -Itools -c $< -o $@

$(BUILD)/obj/tools/%.o: tools/%.c $(CLI_LIB_HDRS) $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -Itools -c $< -o $@

$(BUILD)/libdhsa_cli.a: $(patsubst tools/%.c,$(BUILD)/obj/tools/%.o,$(CLI_LIB_SRCS))
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/obj/tools/serve/engine.o: tools/serve/engine.h

# The request parser needs jansson: built with the server's flags.
$(BUILD)/obj/tools/serve/request.o: tools/serve/request.c tools/serve/serve.h $(CLI_LIB_HDRS) $(HDRS) $(CLI_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(SERVE_CFLAGS) -Itools -Itools/serve -c $< -o $@

$(BUILD)/libdhsa_serve.a: $(patsubst tools/%.c,$(BUILD)/obj/tools/%.o,$(SERVE_LIB_SRCS))
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/dhsa: $(TOOLS_SRCS) $(wildcard tools/*.h tools/serve/*.h) $(CLI_LIB_HDRS) $(BUILD)/libdhsa_cli.a $(BUILD)/libdhsa_serve.a $(BUILD)/libdhsa.a $(HDRS) $(CLI_STAMP)
	$(CC) $(CFLAGS_BASE) $(SERVE_CFLAGS) $(MPI_CFLAGS) $(LINE_CFLAGS) -Itools -o $@ $(TOOLS_SRCS) $(BUILD)/libdhsa_cli.a $(BUILD)/libdhsa_serve.a $(BUILD)/libdhsa.a $(SERVE_LIBS) $(MPI_LIBS) $(LINE_LIBS) $(LDLIBS)

$(BUILD)/progs/%: tests/progs/%.c $(BUILD)/libdhsa.a $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -o $@ $< $(BUILD)/libdhsa.a $(LDLIBS)

# Tests link the libraries, never a tools/ source: libdhsa.a (internals
# included) and the CLI's support library.
$(BUILD)/tests/%: tests/%.c $(wildcard tests/*.h) $(BUILD)/libdhsa_cli.a $(BUILD)/libdhsa.a $(CLI_LIB_HDRS) $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -Itools -o $@ $< $(BUILD)/libdhsa_cli.a $(BUILD)/libdhsa.a $(LDLIBS)

# test_serve (and test_serve_limits) also drive the request parser of dhsa serve (build/libdhsa_serve.a).
$(BUILD)/tests/test_serve $(BUILD)/tests/test_serve_limits: $(BUILD)/tests/%: tests/%.c tools/serve/serve.h $(wildcard tests/*.h) $(BUILD)/libdhsa_serve.a $(BUILD)/libdhsa.a $(HDRS) $(CLI_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(SERVE_CFLAGS) -Itools -Itools/serve -o $@ $< $(BUILD)/libdhsa_serve.a $(BUILD)/libdhsa.a $(SERVE_LIBS) $(LDLIBS)

# test_serve_engine drives the server's engine through its library, without a socket.
$(BUILD)/tests/test_serve_engine: tests/test_serve_engine.c tools/serve/engine.h $(wildcard tests/*.h) $(BUILD)/libdhsa_serve.a $(BUILD)/libdhsa.a $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -Itools/serve -o $@ tests/test_serve_engine.c $(BUILD)/libdhsa_serve.a $(BUILD)/libdhsa.a $(LDLIBS)

test: all $(TESTS) $(PROGS)
	@sh tests/run.sh $(BUILD) $(TESTS)

# The Python suite with PyTorch and transformers, so that the dhsa.torch tests
# (python/tests/test_torch*.py) run instead of skipping: python/torch-venv.sh
# makes the venv TORCH_VENV once (minutes, 5.6 GB), then pytest runs under it.
# `DHSA_PYTHON=$(TORCH_VENV)/bin/python make test` runs everything under it
# (.ci/run does).
TORCH_VENV ?= $(HOME)/.cache/dhsa-torch-venv
test-torch: all $(PROGS)
	sh python/torch-venv.sh $(TORCH_VENV)
	DHSA_LIB=$(BUILD)/libdhsa.so DHSA_CLI=$(BUILD)/dhsa PYTHONPATH=python \
	  $(TORCH_VENV)/bin/python -m pytest -q -rs python/tests

asan:
	DHSA_SANITIZED=1 $(MAKE) BUILD=build-asan OPT=-O1 \
	  EXTRA_CFLAGS="-fsanitize=address -fno-omit-frame-pointer" \
	  EXTRA_LDFLAGS="-fsanitize=address" test

ubsan:
	DHSA_SANITIZED=1 $(MAKE) BUILD=build-ubsan OPT=-O1 \
	  EXTRA_CFLAGS="-fsanitize=undefined -fno-sanitize-recover=all" \
	  EXTRA_LDFLAGS="-fsanitize=undefined" test

# Parsers under libFuzzer (clang): each harness in fuzz/ runs FUZZ_SECONDS
# (default 30) from a seed corpus in build-fuzz/corpus-NAME, then prints
# its executions (stat::number_of_executed_units). Not part of `make test`.
#   gguf       the GGUF container (every kv and tensor walked)
#   predictor  the boundary-predictor file (also with its CRC fixed up)
#   llama2c    llama.2c checkpoint + tokenizer import
#   model      a model from GGUF bytes, loaded and run for 3 tokens
#   tokenizer  any text through every vocabulary of ../shared/vocab, the
#              shipped model's and stories260K's (absent ones are skipped)
#   num        the CLI's number parsers (tools/lib/cli_num.c)
#   state      a saved session state (dhsa_session_load_memory, also with
#              its checksum fixed up) into a session of the shipped model
#   json       JSON Schema text and JSON text through structured output's
#              automaton (src/model/json_constraint.c)
#   serve      dhsa serve's request bodies (tools/serve/request.c; needs jansson,
#              skipped, saying so, without it)
# Seeds: ../shared/models and ../shared/vocab where present, tiny models
# from `build/dhsa gen-model`, models/dhsa-retrieval-8m-q8_0.gguf, random
# predictors from fuzz/predictor_seed.c.
# clang: Debian 12 `apt-get update && apt-get install -y clang
# libclang-rt-14-dev` (the second holds libFuzzer; clang only recommends
# it). FUZZ_CC=clang-N picks another version.
FUZZ_SECONDS ?= 30
FUZZ_CC ?= clang
FUZZ_SAN = -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_LINK = $(FUZZ_CC) -std=c11 -g -O1 -D_GNU_SOURCE -Iinclude -Isrc $(FUZZ_SAN) -fsanitize=fuzzer
FUZZ_RUN = -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1
FUZZ_HARNESSES = gguf predictor llama2c model tokenizer num state json
SHARED ?= ../shared
fuzz: $(BUILD)/dhsa
	@printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
	  | $(FUZZ_CC) -fsanitize=fuzzer -x c - -o /dev/null 2>/dev/null || { \
	  echo "make fuzz: $(FUZZ_CC) cannot link a libFuzzer harness. Install clang with libFuzzer:"; \
	  echo "  apt-get update && apt-get install -y clang libclang-rt-14-dev   (Debian 12)"; exit 1; }
	@# objects built with other sanitizer flags (make does not track flags) are rebuilt
	@mkdir -p build-fuzz; echo '$(FUZZ_CC) $(FUZZ_SAN)' | cmp -s - build-fuzz/flags || \
	  { rm -rf build-fuzz/obj build-fuzz/libdhsa.a; echo '$(FUZZ_CC) $(FUZZ_SAN)' > build-fuzz/flags; }
	$(MAKE) CC=$(FUZZ_CC) BUILD=build-fuzz OPT=-O1 WERROR= \
	  EXTRA_CFLAGS="$(FUZZ_SAN) -fsanitize=fuzzer-no-link" build-fuzz/libdhsa.a
	$(FUZZ_LINK) -o build-fuzz/gguf_fuzz fuzz/gguf_fuzz.c build-fuzz/libdhsa.a -lpthread -lm
	$(FUZZ_LINK) -o build-fuzz/predictor_fuzz fuzz/predictor_fuzz.c build-fuzz/libdhsa.a -lpthread -lm
	$(FUZZ_LINK) -o build-fuzz/llama2c_fuzz fuzz/llama2c_fuzz.c build-fuzz/libdhsa.a -lpthread -lm
	$(FUZZ_LINK) -o build-fuzz/model_fuzz fuzz/model_fuzz.c build-fuzz/libdhsa.a -lpthread -lm
	$(FUZZ_LINK) -o build-fuzz/tokenizer_fuzz fuzz/tokenizer_fuzz.c build-fuzz/libdhsa.a -lpthread -lm
	$(FUZZ_LINK) -Itools -o build-fuzz/num_fuzz fuzz/num_fuzz.c tools/lib/cli_num.c -lm
	$(FUZZ_LINK) -o build-fuzz/state_fuzz fuzz/state_fuzz.c build-fuzz/libdhsa.a -lpthread -lm
	$(FUZZ_LINK) -o build-fuzz/json_fuzz fuzz/json_fuzz.c build-fuzz/libdhsa.a -lpthread -lm
	@for h in $(FUZZ_HARNESSES); do mkdir -p build-fuzz/corpus-$$h; done
	@mkdir -p build-fuzz/seeds-model
	@if [ -f $(SHARED)/models/stories260K.gguf ]; then cp $(SHARED)/models/stories260K.gguf build-fuzz/corpus-gguf/; fi
	build-fuzz/gguf_fuzz $(FUZZ_RUN) -max_len=1300000 build-fuzz/corpus-gguf
	@# predictor seeds: small random predictors, written by fuzz/predictor_seed.c
	@mkdir -p build-fuzz/seeds-predictor
	$(CC) -std=c11 -Iinclude -o build-fuzz/predictor_seed fuzz/predictor_seed.c $(BUILD)/libdhsa.a $(LDLIBS)
	build-fuzz/predictor_seed build-fuzz/seeds-predictor
	build-fuzz/predictor_fuzz $(FUZZ_RUN) build-fuzz/corpus-predictor build-fuzz/seeds-predictor
	@# llama2.c seeds: a 212-byte checkpoint (dim 2, vocab 4) + its tokenizer, and stories260K.
	@{ printf '\002\000\000\000\002\000\000\000\001\000\000\000\001\000\000\000\001\000\000\000\004\000\000\000\002\000\000\000'; \
	   head -c 184 /dev/zero; printf '\010\000\000\000'; \
	   for t in a b c; do printf '\000\000\000\000\001\000\000\000%s' $$t; done; \
	   printf '\000\000\000\000\002\000\000\000 d'; } > build-fuzz/corpus-llama2c/tiny
	@if [ -f $(SHARED)/models/stories260K.bin ] && [ -f $(SHARED)/models/tok512.bin ]; then \
	  cat $(SHARED)/models/stories260K.bin $(SHARED)/models/tok512.bin > build-fuzz/corpus-llama2c/stories260K; fi
	build-fuzz/llama2c_fuzz $(FUZZ_RUN) -max_len=1100000 build-fuzz/corpus-llama2c
	@# model seeds: tiny models of each weight type (1 layer, vocab 260, a few KB), then the
	@# big ones in build-fuzz/seeds-model (read, never written to: libFuzzer adds to the first folder).
	@for s in "llama F32 8 16" "llama F16 8 16" "llama BF16 8 16" "qwen2 F32 8 16" "llama Q8_0 32 32" \
	          "qwen2 Q4_0 32 32" "llama Q4_K 256 256" "qwen2 Q6_K 256 256" "llama Q5_0 32 32" \
	          "qwen2 IQ4_NL 32 32" "llama Q3_K 256 256" "qwen2 Q5_K 256 256" "llama IQ4_XS 256 256"; do set -- $$s; \
	  f=build-fuzz/corpus-model/tiny-$$1-$$2.gguf; [ -f $$f ] || $(BUILD)/dhsa gen-model -o $$f --preset tiny \
	    --arch $$1 --type $$2 --n-embd $$3 --n-ff $$4 --n-layer 1 --n-head 2 --n-head-kv 1 --vocab 260 --ctx 64 \
	    >/dev/null || exit 1; done
	@# and one of each other architecture (q/k norms, sliding layers, fused gate/up, LongRoPE factors)
	@for s in "qwen3 F32 8 16" "gemma2 F16 8 16" "gemma3 F32 8 16 --window 2" "phi3 Q8_0 32 32 --longrope"; do \
	  set -- $$s; f=build-fuzz/corpus-model/tiny-$$1-$$2.gguf; a=$$1 t=$$2 e=$$3 ff=$$4; shift 4; \
	  [ -f $$f ] || $(BUILD)/dhsa gen-model -o $$f --preset tiny --arch $$a --type $$t --n-embd $$e --n-ff $$ff \
	    --n-layer 1 --n-head 2 --n-head-kv 1 --vocab 260 --ctx 64 $$@ >/dev/null || exit 1; done
	@cp models/dhsa-retrieval-8m-q8_0.gguf build-fuzz/seeds-model/
	@if [ -f $(SHARED)/models/stories260K.gguf ]; then cp $(SHARED)/models/stories260K.gguf build-fuzz/seeds-model/; \
	  else echo "model_fuzz: no $(SHARED)/models/stories260K.gguf: seeded without it"; fi
	build-fuzz/model_fuzz $(FUZZ_RUN) -max_len=8500000 build-fuzz/corpus-model build-fuzz/seeds-model
	@# tokenizer seeds: llama.cpp's test strings (one file per vocabulary) and a few texts.
	@if ls $(SHARED)/vocab/*.inp >/dev/null 2>&1; then cp $(SHARED)/vocab/*.inp build-fuzz/corpus-tokenizer/; \
	  else echo "tokenizer_fuzz: no $(SHARED)/vocab: seeded without llama.cpp's test strings"; fi
	@printf 'Once upon a time' > build-fuzz/corpus-tokenizer/once
	@printf ' \342\226\201 <s></s> \377\000\300\200 caf\303\251 123456\n\n\t' > build-fuzz/corpus-tokenizer/mixed
	DHSA_SHARED=$(SHARED) build-fuzz/tokenizer_fuzz $(FUZZ_RUN) -max_len=4096 build-fuzz/corpus-tokenizer
	@# num seeds: byte 0 the parser and bounds, byte 1 msg's size, then the argument.
	@printf '\000\120512K' > build-fuzz/corpus-num/int-suffix; printf '\001\1200.0625' > build-fuzz/corpus-num/real
	@printf '\020\120-9223372036854775808' > build-fuzz/corpus-num/int-min; printf '\001\1200x1.8p-3' > build-fuzz/corpus-num/hex
	build-fuzz/num_fuzz $(FUZZ_RUN) -max_len=64 build-fuzz/corpus-num
	@# state seeds: the states of two prompts, saved with the harness's options
	@$(BUILD)/dhsa run -p "Once upon a time" -n 1 --ctx 64 --ubatch 64 --kv f16 --temp 0 \
	  --prompt-cache build-fuzz/corpus-state/once >/dev/null 2>&1 || { echo "state seed failed"; exit 1; }
	@$(BUILD)/dhsa run -p "The pass key is 40913." -n 1 --ctx 64 --ubatch 64 --kv f16 --temp 0 \
	  --prompt-cache build-fuzz/corpus-state/key >/dev/null 2>&1 || { echo "state seed failed"; exit 1; }
	build-fuzz/state_fuzz $(FUZZ_RUN) -max_len=600000 build-fuzz/corpus-state
	@# json seeds: byte 0 even: a schema; odd: a text
	@printf '\000{"type":"object","properties":{"a":{"enum":[1,12,"x"]},"b":{"type":"array","items":{"anyOf":[{"type":"string","maxLength":3},{"type":"null"}]},"maxItems":2}},"required":["a"]}' > build-fuzz/corpus-json/schema
	@printf '\001{ "k\\u00e9": [1, -0.5e+3, "x\\n", {"": null}],\n    "t": true }' > build-fuzz/corpus-json/text
	build-fuzz/json_fuzz $(FUZZ_RUN) -max_len=4096 build-fuzz/corpus-json
ifeq ($(HAVE_SERVE),1)
	$(FUZZ_LINK) $(SERVE_CFLAGS) -Itools -Itools/serve -o build-fuzz/serve_fuzz fuzz/serve_fuzz.c tools/serve/request.c build-fuzz/libdhsa.a $(SERVE_LIBS) -lpthread -lm
	@mkdir -p build-fuzz/corpus-serve
	@printf '\000{"messages":[{"role":"user","content":"Hi"}],"stream":true,"stop":["a"],"max_tokens":5,"ignore_eos":true}' > build-fuzz/corpus-serve/chat
	@printf '\001{"prompt":[[1,2,3]],"temperature":0.5,"seed":7,"stream":true,"stream_options":{"include_usage":true}}' > build-fuzz/corpus-serve/ids
	@printf '\002{"content":"caf\303\251","with_pieces":true}' > build-fuzz/corpus-serve/tok
	@printf '\003{"tokens":[1,2,2047]}' > build-fuzz/corpus-serve/detok
	build-fuzz/serve_fuzz $(FUZZ_RUN) -max_len=4096 build-fuzz/corpus-serve
else
	@echo "serve_fuzz: skipped: no jansson (apt-get install libmicrohttpd-dev libjansson-dev pkg-config)"
endif

clean:
	rm -rf build build-asan build-ubsan build-fuzz
