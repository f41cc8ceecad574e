#!/usr/bin/env bash
# A real engine for the conformance suite: ollama v0.17.4 built from the Go
# module proxy, serving tiny random-weight models that scripts/tinygguf
# generates. See docs/real-engine.md.
#
#   scripts/real-engine.sh build   install Debian deps, build ollama (cached), write the GGUF
#   scripts/real-engine.sh start   build if needed, start the servers, create the models
#   scripts/real-engine.sh stop    stop the servers started by `start` (by their PIDs)
#   scripts/real-engine.sh env     print the variables the suite reads (eval-able)
#   scripts/real-engine.sh test    start, run the suite (go test ./proxy/conformance/), stop
#                                  (it stops the servers even if an earlier `start` began them)
#
# `start` runs three `ollama serve` instances, each with its own port, HOME,
# models directory and log, all with OLLAMA_DEBUG=1 (the runner's slot log is
# the suite's truth): OLLAMA_NUM_PARALLEL=1 in $ANVIL_ENGINE_RUN, 2 in
# $ANVIL_ENGINE_RUN/p2 and 4 in $ANVIL_ENGINE_RUN/p4.
#
# Exit codes: 0 ok; 1 a failure of ours (fails CI); 75 (EX_TEMPFAIL) an outside
# reason: a package registry refused or was unreachable. `test` turns 75 into
# a loud SKIP line and exit 75 so .ci/run can tell the two apart.
#
# Environment:
#   ANVIL_ENGINE_CACHE  build cache, reused across runs (default ~/.cache/anvilproxy-engine)
#   ANVIL_ENGINE_RUN    server state: HOME, models, log, pid (default $ANVIL_ENGINE_CACHE/run)
#   ANVIL_ENGINE_PORT   the one-slot server's port on 127.0.0.1 (default: the
#                       first free from 11439; the others take the next free ones)
set -euo pipefail

OLLAMA_VERSION=0.17.4
EX_OUTSIDE=75
repo="$(cd "$(dirname "$0")/.." && pwd)"
cache="${ANVIL_ENGINE_CACHE:-$HOME/.cache/anvilproxy-engine}"
run="${ANVIL_ENGINE_RUN:-$cache/run}"
port="${ANVIL_ENGINE_PORT:-}"
bin="$cache/bin/ollama"
gguf="$cache/models/tiny.gguf"
export PATH="/usr/local/go/bin:$HOME/go/bin:$PATH"

log() { echo "real-engine: $*" >&2; }
die() { log "FAIL: $*"; exit 1; }
outside() { log "OUTSIDE REASON: $*"; exit "$EX_OUTSIDE"; }

# registry_refused FILE: does a log show a registry or network failure (not a
# compile error)? Matches what apt and the go command print when a mirror
# refuses, times out or cannot be resolved.
registry_refused() {
  grep -Eqi 'dial tcp|i/o timeout|no such host|connection refused|connection reset|TLS handshake|reading https?://[^ ]*: (403|404|410|429|5[0-9][0-9])|Temporary failure (in name resolution|resolving)|Could not resolve|Failed to fetch|Unable to connect|unexpected EOF|Hash Sum mismatch|Some index files failed' "$1"
}

# ensure_packages: the headers Go module zips leave out (they drop vendor/),
# and a C/C++ toolchain for cgo.
ensure_packages() {
  local need=()
  [ -f /usr/include/nlohmann/json.hpp ] || need+=(nlohmann-json3-dev)
  [ -f /usr/include/stb/stb_image.h ] || need+=(libstb-dev)
  command -v gcc >/dev/null || need+=(gcc)
  command -v g++ >/dev/null || need+=(g++)
  command -v curl >/dev/null || need+=(curl)
  [ ${#need[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null || die "need ${need[*]} and there is no apt-get"
  local alog="$cache/apt.log"
  log "installing ${need[*]} (log: $alog)"
  if ! { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}"; } >"$alog" 2>&1; then
    registry_refused "$alog" && outside "apt could not reach Debian: $(tail -1 "$alog")"
    die "apt-get install ${need[*]} failed: $(tail -3 "$alog")"
  fi
}

# write_miniaudio_stub DIR: miniaudio has no Debian package and only the
# multimodal audio helper (mtmd-helper.cpp) uses it, so declare the few
# types and functions it calls, each reporting failure: audio input is
# refused, text serving is unaffected. mtmd-helper.cpp defines MA_API as
# static before including this, so the definitions stay in that unit.
write_miniaudio_stub() {
  mkdir -p "$1/miniaudio"
  cat >"$1/miniaudio/miniaudio.h" <<'EOF'
/* Stub written by anvilproxy scripts/real-engine.sh: every call fails. */
#ifndef ANVIL_MINIAUDIO_STUB_H
#define ANVIL_MINIAUDIO_STUB_H
#include <stddef.h>
#include <stdint.h>
#ifndef MA_API
#define MA_API static
#endif
typedef int ma_result;
typedef uint32_t ma_uint32;
typedef uint64_t ma_uint64;
#define MA_SUCCESS 0
#define MA_ERROR (-1)
typedef enum { ma_format_unknown = 0, ma_format_f32 = 5 } ma_format;
typedef enum { ma_encoding_format_unknown = 0, ma_encoding_format_wav = 1 } ma_encoding_format;
typedef struct { ma_format format; ma_uint32 channels; ma_uint32 sampleRate; } ma_decoder_config;
typedef struct { int unused; } ma_decoder;
typedef struct { ma_encoding_format encodingFormat; ma_format format; ma_uint32 channels; ma_uint32 sampleRate; } ma_encoder_config;
typedef struct { int unused; } ma_encoder;
MA_API ma_decoder_config ma_decoder_config_init(ma_format f, ma_uint32 ch, ma_uint32 rate) {
  ma_decoder_config c; c.format = f; c.channels = ch; c.sampleRate = rate; return c;
}
MA_API ma_result ma_decoder_init_memory(const void *d, size_t n, const ma_decoder_config *c, ma_decoder *dec) {
  (void)d; (void)n; (void)c; (void)dec; return MA_ERROR;
}
MA_API ma_result ma_decoder_get_length_in_pcm_frames(ma_decoder *dec, ma_uint64 *n) {
  (void)dec; if (n) *n = 0; return MA_ERROR;
}
MA_API ma_result ma_decoder_read_pcm_frames(ma_decoder *dec, void *out, ma_uint64 n, ma_uint64 *read) {
  (void)dec; (void)out; (void)n; if (read) *read = 0; return MA_ERROR;
}
MA_API ma_result ma_decoder_uninit(ma_decoder *dec) { (void)dec; return MA_SUCCESS; }
MA_API ma_encoder_config ma_encoder_config_init(ma_encoding_format e, ma_format f, ma_uint32 ch, ma_uint32 rate) {
  ma_encoder_config c; c.encodingFormat = e; c.format = f; c.channels = ch; c.sampleRate = rate; return c;
}
MA_API ma_result ma_encoder_init_file(const char *p, const ma_encoder_config *c, ma_encoder *e) {
  (void)p; (void)c; (void)e; return MA_ERROR;
}
MA_API ma_result ma_encoder_write_pcm_frames(ma_encoder *e, const void *in, ma_uint64 n, ma_uint64 *w) {
  (void)e; (void)in; (void)n; if (w) *w = 0; return MA_ERROR;
}
MA_API void ma_encoder_uninit(ma_encoder *e) { (void)e; }
#endif
EOF
}

# build_ollama: go install with GOBIN=$cache/bin; the binary is reused while
# its stamp names the pinned version.
build_ollama() {
  # The stamp is written only after a whole build: a half-built cache is
  # rebuilt, and a version bump here rebuilds.
  if [ -x "$bin" ] && [ "$(cat "$bin.version" 2>/dev/null)" = "$OLLAMA_VERSION" ]; then
    log "reusing $bin"
    return 0
  fi
  ensure_packages
  command -v go >/dev/null || die "no go toolchain on PATH"
  mkdir -p "$cache/bin" "$cache/include"
  write_miniaudio_stub "$cache/include"
  local blog="$cache/build.log" t0=$SECONDS
  log "building ollama v$OLLAMA_VERSION (cold: 4-12 min on 2 cores; log: $blog)"
  if ! (
    export GOBIN="$cache/bin" CGO_ENABLED=1
    export CGO_CPPFLAGS="-I$cache/include"
    export GOCACHE="${ANVIL_ENGINE_GOCACHE:-$(go env GOCACHE)}"
    cd "$cache" && go install -trimpath \
      -ldflags "-s -w -X github.com/ollama/ollama/version.Version=$OLLAMA_VERSION" \
      "github.com/ollama/ollama@v$OLLAMA_VERSION"
  ) >"$blog" 2>&1; then
    registry_refused "$blog" && outside "the Go module proxy refused or was unreachable: $(grep -m1 -Ei 'dial tcp|timeout|no such host|refused|reset|403|404|410|429|EOF' "$blog")"
    die "go install ollama failed: $(tail -5 "$blog")"
  fi
  OLLAMA_HOST=127.0.0.1:1 "$bin" --version 2>&1 | grep -q "$OLLAMA_VERSION" || die "built $bin does not report version $OLLAMA_VERSION"
  echo "$OLLAMA_VERSION" >"$bin.version"
  log "built $bin in $((SECONDS - t0)) s"
}

build_gguf() {
  mkdir -p "$(dirname "$gguf")"
  (cd "$repo" && go run ./scripts/tinygguf -o "$gguf.tmp") || die "tinygguf failed"
  mv "$gguf.tmp" "$gguf"
}

# write_modelfiles: plain (seeded sampling, ends by itself), thinking (all
# output arrives as reasoning), greedy (the same weights; the suite sends
# "temperature":0 so a token repeats >30 times and ollama cuts the stream).
write_modelfiles() {
  local dir="$run/modelfiles" params
  mkdir -p "$dir"
  # num_thread 1 leaves the second core of a 2-core runner to the proxy and
  # the stamping client: the suite's 5 ms bar then measures the proxy, not
  # the scheduler.
  params=$'PARAMETER temperature 1\nPARAMETER top_k 0\nPARAMETER seed 42\nPARAMETER num_ctx 32768\nPARAMETER num_thread 1'
  cat >"$dir/plain" <<EOF
FROM $gguf
TEMPLATE """{{- if .System }}{{ .System }}
{{ end }}{{- if .Tools }}Tools: {{ range .Tools }}{{ .Function.Name }} {{ end }}
{{ end }}{{- range .Messages }}{{ .Role }}: {{ .Content }}
{{ end }}assistant: """
$params
EOF
  cat >"$dir/thinking" <<EOF
FROM $gguf
TEMPLATE """{{- if .System }}{{ .System }}
{{ end }}{{- if .Tools }}Tools: {{ range .Tools }}{{ .Function.Name }} {{ end }}
{{ end }}{{- range .Messages }}{{ .Role }}: {{ if .Thinking }}<think>{{ .Thinking }}</think>{{ end }}{{ .Content }}
{{ end }}assistant: {{ if \$.Think }}<think>{{ end }}"""
$params
EOF
  cat >"$dir/greedy" <<EOF
FROM $gguf
TEMPLATE """{{- if .Tools }}Tools: {{ range .Tools }}{{ .Function.Name }} {{ end }}
{{ end }}{{- range .Messages }}{{ .Role }}: {{ .Content }}
{{ end }}assistant: """
PARAMETER temperature 0
PARAMETER top_k 1
PARAMETER seed 42
PARAMETER num_ctx 32768
PARAMETER num_thread 1
EOF
}

# The instances `start` runs: slots:directory. The one-slot server keeps the
# run directory itself, as before there were several.
instances=("1:$run" "2:$run/p2" "4:$run/p4")

# instance_port DIR SLOTS: the running server's port, else (for the one-slot
# server) ANVIL_ENGINE_PORT, else the first free port from 11439 up (so a busy
# default is no failure; servers already started hold theirs).
instance_port() {
  local dir=$1 slots=$2 p
  if [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null && [ -f "$dir/port" ]; then
    cat "$dir/port"
    return
  fi
  if [ "$slots" = 1 ] && [ -n "$port" ]; then
    echo "$port"
    return
  fi
  for p in $(seq 11439 11499); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return
    fi
  done
  die "no free port in 11439-11499"
}

is_up() { curl -fsS -o /dev/null --max-time 1 "http://127.0.0.1:$1/api/version" 2>/dev/null; }

# start_instance DIR SLOTS: one `ollama serve` with OLLAMA_NUM_PARALLEL=SLOTS
# and its own HOME, models, log, pid and port under DIR, and the models.
start_instance() {
  local dir=$1 slots=$2 p i m
  mkdir -p "$dir"
  p="$(instance_port "$dir" "$slots")" || exit 1
  if [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
    log "already running (pid $(cat "$dir/pid"), $slots slots)"
  else
    is_up "$p" && die "port $p is taken by a server this script did not start"
    mkdir -p "$dir/home" "$dir/models"
    : >"$dir/ollama.log"
    # OLLAMA_DEBUG=1: the runner logs "loading cache slot ... used=N" when a
    # request takes a slot, the suite's truth for queue and reused prefix.
    HOME="$dir/home" OLLAMA_HOST="127.0.0.1:$p" OLLAMA_MODELS="$dir/models" \
      OLLAMA_NOPRUNE=1 OLLAMA_DEBUG=1 OLLAMA_NUM_PARALLEL="$slots" \
      setsid "$bin" serve >>"$dir/ollama.log" 2>&1 </dev/null &
    echo $! >"$dir/pid"
    echo "$p" >"$dir/port"
    for i in $(seq 1 100); do
      is_up "$p" && break
      kill -0 "$(cat "$dir/pid")" 2>/dev/null || die "ollama exited: $(tail -5 "$dir/ollama.log")"
      sleep 0.1
    done
    is_up "$p" || die "ollama not ready after 10 s: $(tail -5 "$dir/ollama.log")"
    log "ollama pid $(cat "$dir/pid") on 127.0.0.1:$p, $slots slots (log: $dir/ollama.log)"
  fi
  for m in plain thinking greedy; do
    HOME="$dir/home" OLLAMA_HOST="127.0.0.1:$p" "$bin" create "tiny-$m" -f "$run/modelfiles/$m" >>"$dir/create.log" 2>&1 ||
      die "ollama create tiny-$m failed: $(tail -3 "$dir/create.log")"
  done
}

start() {
  build_ollama
  build_gguf
  write_modelfiles
  local it
  for it in "${instances[@]}"; do
    start_instance "${it#*:}" "${it%%:*}"
  done
  log "models tiny-plain, tiny-thinking, tiny-greedy ready on each"
}

# stop_instance DIR: stop the server whose PID start wrote there.
stop_instance() {
  local dir=$1 pid i
  [ -f "$dir/pid" ] || return 0
  pid="$(cat "$dir/pid")"
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
  rm -f "$dir/pid"
  log "stopped pid $pid"
}

stop() {
  local it
  for it in "${instances[@]}"; do
    stop_instance "${it#*:}"
  done
}

# print_env: the one-slot server as ANVIL_REAL_ENGINE, the others as
# ANVIL_REAL_ENGINE_P<slots> (each with its _LOG).
print_env() {
  local it dir slots suffix
  for it in "${instances[@]}"; do
    dir="${it#*:}" slots="${it%%:*}" suffix=""
    [ "$slots" = 1 ] || suffix="_P$slots"
    [ -f "$dir/port" ] || continue
    echo "export ANVIL_REAL_ENGINE$suffix=http://127.0.0.1:$(cat "$dir/port")"
    echo "export ANVIL_REAL_ENGINE${suffix}_LOG=$dir/ollama.log"
  done
}

run_suite() {
  local rc=0
  (start) || rc=$? # a subshell: start exits on failure

  if [ "$rc" -eq "$EX_OUTSIDE" ]; then
    echo "SKIP real-engine conformance suite: a registry refused or was unreachable (see above); not a failure of the repo" >&2
    exit "$EX_OUTSIDE"
  fi
  trap stop EXIT
  [ "$rc" -eq 0 ] || exit "$rc"
  eval "$(print_env)"
  # A loaded host is several times slower than CI's quiet one: the
  # default 10-minute test timeout would cut a healthy run.
  (cd "$repo" && go test -count=1 -timeout 30m -v ${ANVIL_CONFORMANCE_RUN:+-run "$ANVIL_CONFORMANCE_RUN"} ./proxy/conformance/)
}

mkdir -p "$run"
case "${1:-}" in
  build) build_ollama; build_gguf ;;
  start) start ;;
  stop) stop ;;
  env) print_env ;;
  test) run_suite ;;
  *) echo "usage: $0 build|start|stop|env|test" >&2; exit 2 ;;
esac
