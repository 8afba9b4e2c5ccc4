# Two commands on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP_FLAGS := -q --disable-pip-version-check

.PHONY: demo test base install install-test system-demo system-test toolchain clean

$(VENV)/bin/python:
	python3 -m venv $(VENV)
	$(PY) -m pip install $(PIP_FLAGS) --upgrade pip==25.3

$(VENV)/.installed: setup.py | $(VENV)/bin/python
	$(PY) -m pip install $(PIP_FLAGS) -e .
	touch $@

$(VENV)/.installed-test: setup.py $(VENV)/.installed
	$(PY) -m pip install $(PIP_FLAGS) -e '.[test]'
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# System packages (bubblewrap, tmux, docker, ...): installed as root, else the exact command is printed.
system-demo:
	bash scripts/setup_system.sh demo
system-test:
	bash scripts/setup_system.sh test

# The verifier's own interpreter, pytest and test libraries (~/.cache/trsi_jax/verifier, from PyPI once);
# also Python 3.13's (what Terminal-Bench 2 tests ask uv for) where docker has trsi/python:3.13.
toolchain: install
	$(PY) -c "from trsi_jax.sandbox import toolchain as t; print('verifier toolchain:', t.ensure())"
	! docker image inspect trsi/python:3.13 >/dev/null 2>&1 || \
		$(PY) -c "from trsi_jax.sandbox import toolchain as t; print('verifier toolchain:', t.ensure(python='3.13'))"

# CPU runs preload tcmalloc where it is installed (libtcmalloc-minimal4, see scripts/setup_system.sh):
# XLA frees and re-allocates tens of MB per call, which glibc hands back to the kernel and faults in
# again (benchmarks/bench_allocator.py). `=`, not `:=`: looked up after system-* installed it.
TCMALLOC = $(shell bash scripts/tcmalloc_path.sh)
CPU = JAX_PLATFORMS=cpu $(if $(TCMALLOC),LD_PRELOAD=$(TCMALLOC) TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD=1099511627776)

# The five-stage pipeline at tiny scale on CPU (see README "Demo").
demo: system-demo install toolchain
	$(CPU) $(PY) -m experiments.pipeline --preset=demo --init_hf=trsi_jax/assets/tiny_base --workdir=runs/demo

# Re-make the shipped base (trsi_jax/assets/tiny_base) from seed 0: ~15 min on 2 cores.
BASE_FLAGS := --model_cfg.full_attention_interval=2 --model_cfg.partial_rotary_factor=1.0 \
	--model_cfg.rope_theta=10000 --model_cfg.head_dim=32 --model_cfg.num_kv_heads=4 \
	--bootstrap.optim.total_steps=1500 --bootstrap.optim.warmup_steps=75 --bootstrap.batch_size=8 \
	--render_per_family=1000 --hint_fraction=0.1 --hint_only_templates=status_report,extract_emails,sort_by_extension
base: system-demo install toolchain
	$(CPU) $(PY) -m experiments.make_base --seed=0 --out=trsi_jax/assets/tiny_base \
		--workdir=runs/make_base --eval_per_family=20 $(BASE_FLAGS)

# The whole test suite, slow tests included.
test: system-test install-test toolchain
	$(CPU) $(PY) -m pytest tests; rc=$$?; [ $$rc -ne 5 ] || echo "make test: pytest collected no tests"; exit $$rc

clean:
	rm -rf runs .cache .pytest_cache
