# anvilproxy: a static binary in a distroless image, running as non-root.
#
#   docker build -t anvilproxy .
#   docker run --rm -p 8080:8080 -p 9464:9464 anvilproxy serve --upstream http://ENGINE:8000
#
# Multi-platform: docker buildx build --platform linux/amd64,linux/arm64 .
# (the build stage runs on the build machine and cross-compiles).
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETOS=linux TARGETARCH
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w" -o /out/anvilproxy ./cmd/anvilproxy

# static-debian12 has no shell and no libc; :nonroot runs as uid 65532.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/anvilproxy /anvilproxy
USER nonroot:nonroot
# 8080: agents (--listen); 9464: dashboard, /metrics, /snapshot (--admin-listen).
EXPOSE 8080 9464
ENTRYPOINT ["/anvilproxy"]
# Without --upstream, serve runs the embedded simulated engine.
CMD ["serve", "--listen", ":8080", "--admin-listen", ":9464"]
