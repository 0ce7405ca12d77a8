# Makefile: a thin wrapper over CMake for habits.
#   make              set up (scripts/setup.sh), configure and build everything into build/
#   make test         build, then run every CTest suite (GPU tests are reported as skipped without a GPU)
#   make quickstart   build, prepare the bundled KJV corpus, train the small GPT-2 of configs/gpt2_mini_bf16.json
#   make test-sanitize  build the CPU tests and train_gpt with AddressSanitizer + UndefinedBehaviorSanitizer into
#                     build-sanitize/ (host code: the .cpp files, and the host side of the .cu files through nvcc
#                     -Xcompiler; device code cannot be sanitized) and run the CPU tests and the integration tests
#                     (those that need a GPU skip themselves); any report fails the test that triggered it
#   make bench        run the benchmark driver (dev/bench/bench.py) on a GPU machine
#   make clean        remove build/ and build-sanitize/
# Variables: BUILD (build directory), SANITIZE_BUILD, CMAKE_ARGS (e.g. -DCMAKE_CUDA_ARCHITECTURES="80;90a"), JOBS.
BUILD ?= build
SANITIZE_BUILD ?= build-sanitize
JOBS ?= $(shell nproc)
CMAKE_ARGS ?=
PYTHON ?= python3

# The sanitizer build: every UB report is an error (no recovery), frames kept for readable stacks (no commas: nvcc
# -Xcompiler splits its argument at them). GCC 12 reports false -Wmaybe-uninitialized in libstdc++'s <regex> under
# -fsanitize=address, so the C++ files of this build leave that warning out.
SANITIZE_FLAGS := -fsanitize=address -fsanitize=undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
SANITIZE_ENV := \
  ASAN_OPTIONS=detect_leaks=1:protect_shadow_gap=0:strict_string_checks=1:detect_stack_use_after_return=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# What it builds: the CPU GoogleTest binaries (test/<layer>/test_*.cpp), the trainer the integration tests drive and
# the FP4 reference's command-line face that test/precision/test_fp4_numpy.py drives.
SANITIZE_TARGETS := train_gpt fp4_ref_dump group_ref_dump $(sort $(basename $(notdir $(wildcard test/*/test_*.cpp))))

.PHONY: all setup build test test-sanitize quickstart bench clean data

all: build

setup:
	@bash scripts/setup.sh

build: setup
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-sanitize: setup
	cmake -S . -B $(SANITIZE_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_ARGS) \
	  -DCMAKE_CXX_FLAGS="$(SANITIZE_FLAGS) -Wno-maybe-uninitialized" \
	  -DCMAKE_CUDA_FLAGS="$(foreach f,$(SANITIZE_FLAGS),-Xcompiler=$(f))" \
	  -DCMAKE_EXE_LINKER_FLAGS="$(SANITIZE_FLAGS)"
	cmake --build $(SANITIZE_BUILD) -j $(JOBS) --target $(SANITIZE_TARGETS)
	cd $(SANITIZE_BUILD) && $(SANITIZE_ENV) ctest -L 'cpu|integration' --output-on-failure -j $(JOBS)

data/kjv/kjv_train_000000.bin:
	$(PYTHON) dev/data/prepare.py --kjv

data: data/kjv/kjv_train_000000.bin

quickstart: build data
	./$(BUILD)/train_gpt --config configs/gpt2_mini_bf16.json

bench: build
	$(PYTHON) dev/bench/bench.py --build $(BUILD)

clean:
	rm -rf $(BUILD) $(SANITIZE_BUILD)
