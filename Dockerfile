# Multi-stage build: a static binary in a distroless image, running as non-root.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/anvilproxy ./cmd/anvilproxy

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/anvilproxy /anvilproxy
USER nonroot:nonroot
EXPOSE 8080 9464
ENTRYPOINT ["/anvilproxy"]
CMD ["serve", "--listen", ":8080"]
