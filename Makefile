# make demo: set up .venv and tune the bundled GPT example on CPU with 2 processes.
# make test: set up .venv and run the tests (unit tests, then real DeepSpeed trials on CPU).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.zerotune-installed

.PHONY: setup demo test bench clean

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
	$(PY) -m pip install -q -e '.[test,bench,lightning,tracking]'
	# Debian's chromium renders report.html in the browser test (skipped where it cannot be installed).
	command -v chromium >/dev/null 2>&1 || (apt-get install -y -q chromium >/dev/null 2>&1 || \
		echo "chromium not installed: tests/test_report_browser.py will be skipped")
	touch $(STAMP)

demo: setup
	DS_ACCELERATOR=cpu $(VENV)/bin/zerotune tune --num-gpus 2 --results-dir demo_results \
		examples/gpt.py --deepspeed_config examples/ds_config.json

test: setup
	$(PY) -m pytest -q -ra

bench: setup
	DS_ACCELERATOR=cpu $(PY) bench/vs_deepspeed.py

clean:
	rm -rf demo_results autotuning_results autotuning_exps
