# syntax=docker/dockerfile:1
# Build: docker build -t costgate .
# Run:   docker run -p 8080:8080 -p 9090:9090 costgate
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
ENTRYPOINT ["/usr/local/bin/costgate"]
# The admin plane listens on all interfaces inside the container so that
# health checks reach it; its routes other than health need the token.
CMD ["serve", "--admin-listen", ":9090"]
