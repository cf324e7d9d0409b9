# make demo: set up .venv and tune the bundled GPT example on CPU with 2 processes.
# make test: set up .venv with the test extras, check lint and format (ruff) and the layering
# (import-linter, contracts in pyproject.toml), build and check the package and the documentation
# site, then run the tests (unit tests, then real DeepSpeed trials on CPU). Only the test set-up installs anything outside .venv (the browser of the report test);
# set-up compiles DeepSpeed's CPU ops into torch's extension cache, where DeepSpeed would at first use.
VENV ?= .venv
PY := $(VENV)/bin/python
# As in an activated venv: DeepSpeed builds its CPU ops with the first `ninja` on PATH, and the
# set-up's build, the demo and the tests must use the same one (pip's ninja and a system one hash
# build commands differently, so switching between them rebuilds the ops, about a minute each).
export PATH := $(abspath $(VENV))/bin:$(PATH)
STAMP := $(VENV)/.zerotune-installed
TEST_STAMP := $(VENV)/.zerotune-test-installed

.PHONY: setup test-setup demo test package docs bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch where there is no NVIDIA GPU; never a multi-GB CUDA build there.
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		$(PY) -m pip install -q "torch>=2.4,<2.15"; \
	else \
		$(PY) -m pip install -q torch==2.13.0; \
	fi
	$(PY) -m pip install -q -e .
	# DeepSpeed compiles its CPU ops (shared-memory allreduce, CPU and fused Adam) on first use,
	# about 2 minutes: compile them here, once, not inside the first trial that needs them.
	if ! (command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1); then \
		DS_ACCELERATOR=cpu $(PY) -c "from deepspeed.accelerator import get_accelerator as a; \
			[a().create_op_builder(n).load(verbose=False) for n in ('ShareMemCommBuilder', 'CPUAdamBuilder', 'FusedAdamBuilder')]" \
			>/dev/null; \
	fi
	touch $(STAMP)

test-setup: $(TEST_STAMP)

$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[test,bench,lightning,tracking,hf,docs]'
	# A test prerequisite, not the demo's: Debian's chromium renders report.html in the browser
	# test, which is skipped (and says so) where it cannot be installed.
	command -v chromium >/dev/null 2>&1 || (apt-get install -y -q chromium >/dev/null 2>&1 || \
		echo "chromium not installed: tests/test_report_browser.py will be skipped")
	# Debian's Slurm and munge: tests/integration/test_slurm_cpu.py starts a two-node cluster on
	# this machine (skipped, and says so, where they cannot be installed).
	command -v slurmd >/dev/null 2>&1 || (DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge \
		>/dev/null 2>&1 || echo "slurm-wlm not installed: tests/integration/test_slurm_cpu.py will be skipped")
	touch $(TEST_STAMP)

demo: setup
	DS_ACCELERATOR=cpu $(VENV)/bin/zerotune tune --num-gpus 2 --results-dir demo_results \
		examples/gpt.py --deepspeed_config examples/ds_config.json

LINTED := src tests bench examples tools

test: test-setup
	$(PY) -m ruff check $(LINTED)
	$(PY) -m ruff format --check $(LINTED)
	$(VENV)/bin/lint-imports --no-cache
	$(MAKE) package docs
	$(PY) -m pytest -q -ra --durations=15

# The documentation site, in build/site: strict, so a broken link or an unreadable docstring fails.
docs: test-setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -q

# The sdist and wheel as PyPI would take them: built from this tree (with the venv's setuptools,
# no download), checked by twine, and the wheel installed into a fresh venv without its
# dependencies, where `zerotune --help` and `--version` must run: the CLI imports none of them
# until a tuning starts.
package: test-setup
	rm -rf dist build/wheel-venv
	$(PY) -m build --no-isolation --outdir dist . >/dev/null
	$(PY) -m twine check --strict dist/*
	python3 -m venv build/wheel-venv
	build/wheel-venv/bin/pip install -q --no-deps dist/*.whl
	build/wheel-venv/bin/zerotune --help >/dev/null
	test "$$(build/wheel-venv/bin/zerotune --version)" = "zerotune $$($(PY) -c 'import zerotune; print(zerotune.__version__)')"

bench: test-setup
	DS_ACCELERATOR=cpu $(PY) bench/vs_deepspeed.py

clean:
	rm -rf demo_results autotuning_results autotuning_exps dist build
