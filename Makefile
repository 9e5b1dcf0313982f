# dhsa build. `make` builds build/libdhsa.a, build/libdhsa.so and build/dhsa;
# `make test` builds and runs every tests/test_*.c and ends with
# "N passed, N failed"; `make asan` / `make ubsan` run the tests under
# sanitizers (in build-asan/ and build-ubsan/).
#
# Sources are found by wildcard: src/*/*.c. Files named *_avx512.c and
# *_avx2.c are per-ISA kernels compiled with their own flags (x86-64 only;
# on other machines they compile to nothing and the scalar path runs).

CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
WERROR  ?= -Werror
CFLAGS_BASE = -std=c11 -g $(OPT) -fPIC -Wall -Wextra -Wpedantic -Wshadow $(WERROR) \
              -D_GNU_SOURCE -Iinclude -Isrc $(EXTRA_CFLAGS)
LDLIBS  = -lpthread -lm $(EXTRA_LDFLAGS)

ARCH := $(shell uname -m)
ifeq ($(ARCH),x86_64)
  AVX512_FLAGS = -mavx512f -mavx512bw -mavx512dq -mavx512vl -mfma -mf16c
  AVX2_FLAGS   = -mavx2 -mfma -mf16c
else
  AVX512_FLAGS =
  AVX2_FLAGS   =
endif

SRCS  := $(sort $(wildcard src/*/*.c))
OBJS  := $(patsubst src/%.c,$(BUILD)/obj/%.o,$(SRCS))
HDRS  := $(wildcard include/*.h src/*/*.h)
TESTS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(sort $(wildcard tests/test_*.c)))
TOOLS_SRCS := $(sort $(wildcard tools/*.c))
# Small programs the tests drive (memory-probe targets and the like).
PROGS := $(patsubst tests/progs/%.c,$(BUILD)/progs/%,$(sort $(wildcard tests/progs/*.c)))

.PHONY: all test asan ubsan clean fuzz
all: $(BUILD)/libdhsa.a $(BUILD)/libdhsa.so $(BUILD)/dhsa

$(BUILD)/obj/%_avx512.o: src/%_avx512.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(AVX512_FLAGS) -c $< -o $@

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

$(BUILD)/dhsa: $(TOOLS_SRCS) $(BUILD)/libdhsa.a $(HDRS)
	$(CC) $(CFLAGS_BASE) -o $@ $(TOOLS_SRCS) $(BUILD)/libdhsa.a $(LDLIBS)

$(BUILD)/progs/%: tests/progs/%.c $(BUILD)/libdhsa.a $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -o $@ $< $(BUILD)/libdhsa.a $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(wildcard tests/*.h) $(BUILD)/libdhsa.a $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -o $@ $< $(BUILD)/libdhsa.a $(LDLIBS)

test: all $(TESTS) $(PROGS)
	@sh tests/run.sh $(BUILD) $(TESTS)

asan:
	DHSA_SANITIZED=1 $(MAKE) BUILD=build-asan OPT=-O1 \
	  EXTRA_CFLAGS="-fsanitize=address -fno-omit-frame-pointer" \
	  EXTRA_LDFLAGS="-fsanitize=address" test

ubsan:
	DHSA_SANITIZED=1 $(MAKE) BUILD=build-ubsan OPT=-O1 \
	  EXTRA_CFLAGS="-fsanitize=undefined -fno-sanitize-recover=all" \
	  EXTRA_LDFLAGS="-fsanitize=undefined" test

# Parsers under libFuzzer (clang): each harness in fuzz/ runs FUZZ_SECONDS
# (default 30) from a seed corpus in build-fuzz/corpus-NAME (seeded with
# ../shared/models where present). Not part of `make test`.
FUZZ_SECONDS ?= 30
FUZZ_CC ?= clang
FUZZ_SAN = -fsanitize=address,undefined -fno-omit-frame-pointer
fuzz:
	$(MAKE) CC=$(FUZZ_CC) BUILD=build-fuzz OPT=-O1 WERROR= \
	  EXTRA_CFLAGS="$(FUZZ_SAN) -fsanitize=fuzzer-no-link" build-fuzz/libdhsa.a
	$(FUZZ_CC) -std=c11 -g -O1 -Iinclude -Isrc $(FUZZ_SAN) -fsanitize=fuzzer \
	  -o build-fuzz/gguf_fuzz fuzz/gguf_fuzz.c build-fuzz/libdhsa.a -lpthread -lm
	$(FUZZ_CC) -std=c11 -g -O1 -Iinclude -Isrc $(FUZZ_SAN) -fsanitize=fuzzer \
	  -o build-fuzz/predictor_fuzz fuzz/predictor_fuzz.c build-fuzz/libdhsa.a -lpthread -lm
	$(FUZZ_CC) -std=c11 -g -O1 -Iinclude -Isrc $(FUZZ_SAN) -fsanitize=fuzzer \
	  -o build-fuzz/llama2c_fuzz fuzz/llama2c_fuzz.c build-fuzz/libdhsa.a -lpthread -lm
	@mkdir -p build-fuzz/corpus-gguf build-fuzz/corpus-predictor build-fuzz/corpus-llama2c
	@if [ -f ../shared/models/stories260K.gguf ]; then cp ../shared/models/stories260K.gguf build-fuzz/corpus-gguf/; fi
	build-fuzz/gguf_fuzz -max_total_time=$(FUZZ_SECONDS) -max_len=1300000 build-fuzz/corpus-gguf
	build-fuzz/predictor_fuzz -max_total_time=$(FUZZ_SECONDS) build-fuzz/corpus-predictor
	@# llama2.c seeds: a 212-byte checkpoint (dim 2, vocab 4) + its tokenizer, and stories260K.
	@{ printf '\002\000\000\000\002\000\000\000\001\000\000\000\001\000\000\000\001\000\000\000\004\000\000\000\002\000\000\000'; \
	   head -c 184 /dev/zero; printf '\010\000\000\000'; \
	   for t in a b c; do printf '\000\000\000\000\001\000\000\000%s' $$t; done; \
	   printf '\000\000\000\000\002\000\000\000 d'; } > build-fuzz/corpus-llama2c/tiny
	@if [ -f ../shared/models/stories260K.bin ] && [ -f ../shared/models/tok512.bin ]; then \
	  cat ../shared/models/stories260K.bin ../shared/models/tok512.bin > build-fuzz/corpus-llama2c/stories260K; fi
	build-fuzz/llama2c_fuzz -max_total_time=$(FUZZ_SECONDS) -max_len=1100000 build-fuzz/corpus-llama2c

clean:
	rm -rf build build-asan build-ubsan build-fuzz
