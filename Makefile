# Makefile: a thin wrapper over CMake for habits.
#   make              set up (scripts/setup.sh), configure and build everything into build/
#   make test         build, then run every CTest suite (GPU tests are reported as skipped without a GPU)
#   make quickstart   build, prepare the bundled KJV corpus, train the small GPT-2 of configs/gpt2_mini_bf16.json
#   make bench        run the benchmark driver (dev/bench/bench.py) on a GPU machine
#   make clean        remove build/
# Variables: BUILD (build directory), CMAKE_ARGS (e.g. -DCMAKE_CUDA_ARCHITECTURES="80;90a"), JOBS.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_ARGS ?=
PYTHON ?= python3

.PHONY: all setup build test quickstart bench clean data

all: build

setup:
	@bash scripts/setup.sh

build: setup
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

data/kjv/kjv_train_000000.bin:
	$(PYTHON) dev/data/prepare.py --kjv

data: data/kjv/kjv_train_000000.bin

quickstart: build data
	./$(BUILD)/train_gpt --config configs/gpt2_mini_bf16.json

bench: build
	$(PYTHON) dev/bench/bench.py --build $(BUILD)

clean:
	rm -rf $(BUILD)
