# syntax=docker/dockerfile:1
# Build: docker build -t costgate .
# Run:   docker run -p 8080:8080 -p 9090:9090 \
#          -v "$PWD/costgate.yaml:/etc/costgate/costgate.yaml:ro" \
#          -e COSTGATE_ADMIN_TOKEN=your-own-admin-token costgate
#
# The image runs your config, never the quickstart: it listens on every
# interface, where the quickstart's published demo keys and admin token
# have no place. Without a config at /etc/costgate/costgate.yaml (or
# COSTGATE_CONFIG), or without an admin token (admin_token in the config or
# COSTGATE_ADMIN_TOKEN), it exits with a message saying which is missing;
# it also refuses a config that uses the published demo keys or token.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
RUN CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w -X main.buildVersion=${VERSION} -X main.buildCommit=${COMMIT}" \
    -o /out/costgate ./cmd/costgate

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/costgate /usr/local/bin/costgate
# The embedded ledger lives in the non-root user's home; mount a volume
# there (or set DATABASE_URL) to keep it.
WORKDIR /home/nonroot
USER nonroot:nonroot
EXPOSE 8080 9090
ENV COSTGATE_CONFIG=/etc/costgate/costgate.yaml
ENTRYPOINT ["/usr/local/bin/costgate"]
# Both planes listen on all interfaces inside the container so that the
# published ports and health checks reach them; the admin routes other
# than health need the operator's token.
CMD ["serve", "--listen", ":8080", "--admin-listen", ":9090"]
