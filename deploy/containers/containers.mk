# The production topology in containers on this host (podman): included by the top-level Makefile, which
# defines setup and BIN. See deploy/README.md ("Containers on one host").
#
#   make containers-host    podman, runc, debootstrap (apt-get when missing, as root) and a probe
#   make containers-images  every image, built from Debian packages and cached by content hash
#   make deploy-up          deploy/docker-compose.yml + deploy/compose.local.yml, waiting on depends_on
#   make deploy-ps | deploy-down | deploy-clean (down, volumes too)
#   make test-deploy        the end-to-end container test (tests/deploy): ~4 minutes with images cached
CONTAINERS := deploy/containers

.PHONY: containers-host containers-images deploy-up deploy-ps deploy-down deploy-clean test-deploy

# Outside CI it never fails `make test`: where containers cannot run, it says why and tests/deploy skips with that
# reason. In CI (CI=true, as .ci/run sets) the container topology test must run, so a host that cannot run it fails here.
containers-host:
	@python3 $(CONTAINERS)/stack.py host || { \
	  case "$$(echo "$$CI" | tr A-Z a-z)" in 1|true|yes) \
	    echo "containers cannot run on this host (above): CI=true, and the container topology test may not be skipped" >&2; exit 1;; esac; \
	  echo "containers cannot run on this host (above): tests/deploy will skip" >&2; }

containers-images: setup containers-host
	$(BIN)/python $(CONTAINERS)/stack.py images

deploy-up: setup containers-host
	$(BIN)/python $(CONTAINERS)/stack.py up

deploy-ps:
	@$(BIN)/python $(CONTAINERS)/stack.py ps

deploy-down:
	$(BIN)/python $(CONTAINERS)/stack.py down

deploy-clean:
	$(BIN)/python $(CONTAINERS)/stack.py down -v

test-deploy: setup
	$(BIN)/python -m pytest -q -s tests/deploy $(PYTEST_ARGS)
