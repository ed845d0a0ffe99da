# The container images of dra-scheduler and dra-node-agent, both described here:
#
#   docker build --target dra-scheduler  -t ghcr.io/dra-scheduler/dra-scheduler:0.1.0 .
#   docker build --target dra-node-agent -t ghcr.io/dra-scheduler/dra-node-agent:0.1.0 .
#
# Two stages make what the images are assembled from: `binaries` (cargo build, then
# images/stage-binaries.sh) and `rootfs` (glibc and libgcc from Debian bookworm's packages,
# images/rootfs.sh). The images themselves are FROM scratch: that root filesystem, one
# binary and its user; no shell, no package manager.
#
# images/build-local.sh builds the same two targets with buildah, without a registry or a
# Docker daemon: it hands in `binaries` and `rootfs` as folders made by the same two
# scripts on this machine (--build-context replaces a stage of that name), and the image
# stages below run unchanged.

ARG RUST_IMAGE=docker.io/library/rust:1.95-slim-bookworm
ARG DEBIAN_IMAGE=docker.io/library/debian:bookworm-slim

# Both binaries, built once for both images, at /out: the release profile, which strips
# debug info (Cargo.toml). The build context has no .git, so the commit that
# dra_scheduler_build_info and dra_node_agent_build_info name is passed in:
# --build-arg GIT_COMMIT=$(git rev-parse HEAD) (without it they say "unknown").
FROM ${RUST_IMAGE} AS binaries
ARG GIT_COMMIT=""
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    DRA_GIT_COMMIT="${GIT_COMMIT}" cargo build --release --locked \
      -p dra-scheduler --bin dra-scheduler -p dra-node-agent --bin dra-node-agent \
 && images/stage-binaries.sh target/release /out

# The runtime root filesystem, at /out.
FROM ${DEBIAN_IMAGE} AS rootfs
COPY images/rootfs.sh /usr/local/bin/rootfs.sh
RUN apt-get update -q && rootfs.sh /out && rm -rf /var/lib/apt/lists/*

# The scheduler: a numeric non-root user, so runAsNonRoot can check it; nothing in the
# image is written at run time (the chart sets readOnlyRootFilesystem).
FROM scratch AS dra-scheduler
COPY --from=rootfs /out/ /
COPY --from=binaries /out/dra-scheduler /usr/local/bin/dra-scheduler
LABEL org.opencontainers.image.title="dra-scheduler" \
      org.opencontainers.image.source="https://github.com/dra-scheduler/dra-scheduler" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/dra-scheduler"]

# The node agent runs as root: it opens /dev/nvidia*, and writes the kubelet's plugin
# directories and /var/run/cdi on the host (the chart mounts them). The fake backend's
# profiles come along for GPU-less nodes (nodeAgent.fakeProfile).
FROM scratch AS dra-node-agent
COPY --from=rootfs /out/ /
COPY --from=binaries /out/dra-node-agent /usr/local/bin/dra-node-agent
COPY --from=binaries /out/profiles/ /usr/share/dra-node-agent/profiles/
LABEL org.opencontainers.image.title="dra-node-agent" \
      org.opencontainers.image.source="https://github.com/dra-scheduler/dra-scheduler" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 0:0
ENTRYPOINT ["/usr/local/bin/dra-node-agent"]
