# Dev tasks. `make test` is the README's test command and what CI runs.
.PHONY: test cluster-up cluster-down bench simulate

test:
	scripts/test.sh

cluster-up:
	tests/cluster/cluster.sh up

cluster-down:
	tests/cluster/cluster.sh down

bench:
	cargo bench --workspace
