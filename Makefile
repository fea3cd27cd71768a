# The two commands a newcomer needs: `make book` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: install sandbox fonts generate check-generated book check test grade clean

$(INSTALLED): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	@# jsonschema's optional IRI checker (jupyter-events asks for it) compiles 38 grammars whenever
	@# nbformat is imported, 2-3 s in every grading process; nothing here checks IRIs.
	$(PY) -m pip uninstall --quiet --disable-pip-version-check --yes rfc3987-syntax lark
	touch $@

## The venv and the grader's sandbox: everything `python -m autograder` needs
install: $(INSTALLED) sandbox

## Regenerate learner notebooks, instructor notebooks, reference and hidden modules from course/
generate: $(INSTALLED)
	$(PY) -m coursegen

## Fail if a generated file differs from its source
check-generated: $(INSTALLED)
	$(PY) -m coursegen --check

## Build both editions of the book: English in _build/html, Chinese in _build/html/zh_CN
book: $(INSTALLED) fonts
	$(PY) -m coursegen.book

## The CJK font the Chinese edition's figures and pages are drawn with: installed when root on Debian
fonts:
	@fc-list :lang=zh 2>/dev/null | grep -q . || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fonts-noto-cjk >/dev/null; \
	  else \
	    echo "make: the Chinese edition needs a CJK font: install it (Debian/Ubuntu: apt-get install fonts-noto-cjk)" >&2; exit 1; \
	  fi; }

## The grader's OS sandbox (bubblewrap, and libseccomp for its system-call filter): installed when root on
## Debian, else one line says what is missing
sandbox:
	@command -v bwrap >/dev/null && { ldconfig -p 2>/dev/null || /sbin/ldconfig -p; } | grep -q 'libseccomp\.so\.2' || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq >/dev/null && apt-get install -y -qq bubblewrap libseccomp2 >/dev/null; \
	  else \
	    echo "make: the grader's sandbox needs bubblewrap and libseccomp: install them (Debian/Ubuntu: apt-get install bubblewrap libseccomp2)" >&2; exit 1; \
	  fi; }

## The fast tier: every test but those that grade through the real pipeline or build the book
## (catalogs judged in process by the kernel's own call routine and the grader's own judge)
check: $(INSTALLED)
	@echo "make check: load average $$(cut -d' ' -f1-3 /proc/loadavg) (pytest's last line gives the time)"
	$(PY) -m pytest tests -m "not pipeline" -n 2 --dist loadfile --no-loadscope-reorder

## Run every test, both tiers (CI runs this): two workers take whole modules in the order tests/conftest.py gives
test: $(INSTALLED) sandbox fonts
	@echo "make test: load average $$(cut -d' ' -f1-3 /proc/loadavg) (pytest's last line gives the time)"
	$(PY) -m pytest tests -n 2 --dist loadfile --no-loadscope-reorder --durations=25

## Grade one notebook: make grade NB=path/to/02_self_attention.ipynb
grade: install
	$(PY) -m autograder grade $(NB)

clean:
	rm -rf _build .cache
