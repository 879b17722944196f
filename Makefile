# One-word verbs; `make check` runs what CI runs.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: setup web chromium data promtool demo test test-numpy lint lint-deploy check wrk bench bench-e2e bench-peer bench-load artifacts clean

# pip at -qq says only errors: at -q it repeats a warning per package for each index mirror
# that lacks it (hundreds of lines on a machine with file:// mirrors) before the demo's table.
$(VENV)/.installed: pyproject.toml setup.py kernels/_native.c kernels/_native_loops.h
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -qq --upgrade pip
	# torch is pinned to the CPU build on local disk; an unpinned torch pulls CUDA.
	$(PIP) install -qq torch==2.13.0
	$(PIP) install -qq -e '.[dev]'
	touch $@

setup: $(VENV)/.installed data web  ## create the virtualenv, install everything, fetch the dataset

ORT_DIST := web/node_modules/onnxruntime-web/dist
ORT_FILES := ort.wasm.min.mjs ort-wasm-simd-threaded.mjs ort-wasm-simd-threaded.wasm

web: server/web/vendor/.built  ## the browser device's runtime: onnxruntime-web (npm, pinned) into server/web/vendor/

server/web/vendor/.built: web/package.json web/package-lock.json
	@command -v npm >/dev/null || { if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq npm; \
	  else echo "install the Debian package npm (sudo apt-get install npm)"; exit 1; fi; }
	# The lock file pins every package and its integrity; no install scripts run.
	cd web && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	rm -rf server/web/vendor && mkdir -p server/web/vendor
	cp $(addprefix $(ORT_DIST)/,$(ORT_FILES)) server/web/vendor/
	touch $@

data:  ## install Fashion-MNIST from Debian when missing (needs root)
	@test -f /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz || \
	  { if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist; \
	    else echo "install the Debian package dataset-fashion-mnist (sudo apt-get install dataset-fashion-mnist)"; exit 1; fi; }

demo: setup  ## serve the committed artifacts, run devices at several rates, print the table
	$(VENV)/bin/qpart demo --artifacts artifacts

promtool:  ## Prometheus and promtool for the metrics tests (Debian package prometheus; needs root)
	@command -v promtool >/dev/null || { if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq prometheus; \
	  else echo "install the Debian package prometheus (sudo apt-get install prometheus)"; exit 1; fi; }

test: setup promtool chromium  ## the test suite (the README's test command)
	$(VENV)/bin/pytest

test-numpy: setup  ## the in-process test suite again with the numpy reference kernels forced
	QPART_KERNELS=numpy $(VENV)/bin/pytest -q -p no:cacheprovider -m "not integration"

lint: setup  ## ruff, mypy --strict, import-linter contracts
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

K8S_TARGETS := overlays/single-node overlays/production kserve kuberay

lint-deploy: setup  ## hadolint, promtool, and every rendered overlay through kubernetes-validate --strict
	$(VENV)/bin/hadolint docker/Dockerfile.server docker/Dockerfile.calibrate
	promtool check config docker/prometheus.yml
	promtool check rules docker/alerts.yml
	@set -e; out=$$(mktemp -d); trap 'rm -rf "$$out"' EXIT; for t in $(K8S_TARGETS); do \
	  f="$$out/$$(echo $$t | tr / -).yaml"; $(VENV)/bin/kubectl kustomize deploy/k8s/$$t > "$$f"; \
	  echo "rendered $$t"; $(VENV)/bin/kubernetes-validate --strict --quiet "$$f"; done
	# Custom resources (ServiceMonitor, PodMonitor, PrometheusRule, InferenceService, RayJob) and the
	# prometheus-adapter Helm values have no schema there:
	# tests/deploy checks their fields.
	$(VENV)/bin/pytest -q -p no:cacheprovider tests/deploy -m "not integration"

check: lint lint-deploy test test-numpy  ## everything CI runs

chromium:  ## the browser of the browser-device test (Debian package chromium; needs root)
	@command -v chromium >/dev/null || { if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium; \
	  else echo "install the Debian package chromium (sudo apt-get install chromium)"; exit 1; fi; }

wrk:  ## the load generator of the serving benchmarks (Debian package wrk; needs root)
	@command -v wrk >/dev/null || { if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq wrk; \
	  else echo "install the Debian package wrk (sudo apt-get install wrk)"; exit 1; fi; }

bench: setup wrk  ## kernel and serving benchmarks (JSON in bench/results/)
	DISABLE_CUDA=1 $(PIP) install -q --no-deps hqq==0.2.8.post1
	$(PY) -m bench.micro.kernels --json bench/results/kernels.json
	$(PY) -m bench.micro.serve --json bench/results/serve.json

bench-e2e: setup  ## QPART vs fixed strategies over a shaped private link, as issue 27's acceptance grid (root; about 85 min, more while the host steals CPU)
	OMP_NUM_THREADS=1 $(PY) -m bench.e2e --cell-seconds 10 --repetitions 5  # raw grid in bench/runs/ (ignored); commit only its bench.e2e.summary

bench-peer: setup wrk  ## /v2 infer vs Triton (Python backend, PyTriton), KServe and LitServe, each in its own venv, private namespace (root)
	$(PY) -m bench.micro.peer --json bench/results/peer.json

bench-load: setup  ## 64 simulated devices for 3 minutes: errors, RSS, segment cache
	$(PY) -m bench.micro.load --json bench/results/load.json

artifacts: setup  ## re-run the calibration of the three reference models (about 35 minutes on 2 cores)
	# --baseline: the QPART-as-published patterns the benchmarks compare with (bench.e2e's qpart-paper)
	$(VENV)/bin/qpart calibrate --model fmnist-cnn --baseline --out artifacts/fmnist-cnn
	# Direct tables for the resnet: the same guarantee (0 violations with either estimator) and a
	# smaller payload (whole model at 1%: 9.97% of fp32 vs 10.50% with the fast tables).
	$(VENV)/bin/qpart calibrate --model fmnist-resnet --estimator direct --baseline --out artifacts/fmnist-resnet
	$(VENV)/bin/qpart calibrate --model fmnist-mobilenet --baseline --out artifacts/fmnist-mobilenet

.PHONY: docs
docs: $(VENV)/.installed  ## regenerate docs/configuration.md from the settings classes (its test checks it)
	$(PY) -m qpart.config_docs

clean:
	rm -rf $(VENV) build *.egg-info kernels/*.so web/node_modules server/web/vendor
