# prefixd container image (docs/deploy.md). Two stages on Debian 12:
#
#   build    the dependency script the README uses (deploy/install-deps.sh,
#            which includes the fleet index's libzmq3-dev, cppzmq-dev and
#            libmsgpack-cxx-dev), a Release build of prefixd and prefixctl,
#            and the Debian package (CPack, deploy/package)
#   runtime  debian:bookworm with that package installed: apt pulls in the
#            runtime libraries its Depends names (from dpkg-shlibdeps: gRPC,
#            protobuf, abseil, prometheus-cpp, civetweb, libmicrohttpd and
#            GnuTLS, OpenSSL, and libzmq5 and libcurl4 for the fleet index; msgpack-cxx is header-only) and nothing
#            else; a non-root user (uid 65532, as deploy/k8s runs it)
#
#   buildah bud --format docker -t prefixd .     (or docker build -t prefixd .)
#   deploy/test-image.sh                         (make image-test) builds and checks it
ARG BASE=debian:bookworm

FROM ${BASE} AS build
COPY deploy/install-deps.sh /src/deploy/install-deps.sh
RUN bash /src/deploy/install-deps.sh \
 && rm -rf /var/lib/apt/lists/*
COPY . /src
RUN cmake -S /src -B /build -DCMAKE_BUILD_TYPE=Release -DPREFIXD_BUILD_BENCH=OFF \
 && cmake --build /build -j"$(nproc)" --target prefixd prefixctl \
 && cd /build && cpack -B /out && ls -l /out/*.deb

FROM ${BASE}
# The package's postinst finds the user already there (no systemd here).
RUN groupadd --system --gid 65532 prefixd \
 && useradd --system --uid 65532 --gid prefixd --home-dir /var/lib/prefixd \
      --no-create-home --shell /usr/sbin/nologin prefixd
COPY --from=build /out/*.deb /tmp/deb/
RUN apt-get update \
 && apt-get install -y --no-install-recommends /tmp/deb/prefixd_*.deb \
 && rm -rf /var/lib/apt/lists/* /tmp/deb \
 && install -d -o prefixd -g prefixd -m 0750 /run/prefixd /var/lib/prefixd
COPY deploy/config/container.textproto /etc/prefixd/config.textproto

USER 65532:65532
VOLUME ["/run/prefixd", "/var/lib/prefixd"]
# gRPC (loopback unless the config enables auth and 0.0.0.0) and metrics.
# The fleet index connects out to engines' event sockets; its optional
# `index.listen` port (docs/index.md) is the deployment's to publish.
EXPOSE 50051 9464
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["/usr/bin/prefixctl", "--addr", "unix:///run/prefixd/prefixd.sock", "--timeout", "2s", "health"]
ENTRYPOINT ["/usr/bin/prefixd"]
CMD ["--config=/etc/prefixd/config.textproto"]
