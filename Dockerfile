# One image for every hark role: `hark gateway`, `hark control`, `hark worker`, `hark dev`.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p hark && cp target/release/hark /hark

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home hark \
    && mkdir -p /var/lib/hark/spool && chown -R hark /var/lib/hark
COPY --from=build /hark /usr/local/bin/hark
USER hark
# The gateway's inbound spool; mount a volume here so that it survives the container.
ENV HARK_GATEWAY__SPOOL_DIR=/var/lib/hark/spool
# The gateway (OneBot and the HTTP adapter), the gRPC API, and metrics.listen as the manifests set it.
EXPOSE 8080 8081 50051 9464
# Checks the role the container runs (`hark health` reads it from PID 1's command line).
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 CMD ["hark", "health"]
ENTRYPOINT ["hark"]
CMD ["--help"]
