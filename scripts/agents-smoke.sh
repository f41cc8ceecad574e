#!/usr/bin/env bash
# agents-smoke.sh: run real coding agents through anvilproxy and check that
# the proxy measured their requests. Not part of `go test`.
#
# It builds anvilproxy, installs pinned versions of OpenAI Codex, opencode
# and Claude Code from npm into a temporary directory, starts
# `anvilproxy serve` on loopback ports with its default upstream (the
# embedded simulated engine, or `anvilproxy sim $SIM_ARGS`), points each agent at the proxy with a dummy
# key, runs one non-interactive prompt per agent under a timeout, and then
# reads the admin /requests JSON: each agent passes when it exited 0 within
# AGENT_MAX_SECONDS and the proxy recorded at least one of its requests on
# the agent's route (responses for Codex, chat for opencode, messages for
# Claude Code) with a non-null time_to_first_output_ms.
#
# The sim's replies are filler words, so what the agents answer is
# meaningless; only the proxy's recording matters. No real key and no
# internet beyond the npm registry are needed.
#
# Usage: scripts/agents-smoke.sh [codex] [opencode] [claude]   (default: all three)
#
# Environment:
#   CODEX_VERSION        @openai/codex version        (default 0.171.0)
#   OPENCODE_VERSION     opencode-ai version          (default 1.18.33)
#   CLAUDE_CODE_VERSION  @anthropic-ai/claude-code    (default 2.1.197, the
#                        last release whose engines allow Node 20)
#   AGENT_TIMEOUT        seconds per agent run        (default 180)
#   AGENT_MAX_SECONDS    an agent passes only when it exits 0 within this
#                        (default 30)
#   AGENT_PROMPT         the prompt                   (default "Say hello in one word.")
#   MAX_OUTPUT_TOKENS    output cap given to opencode and Claude Code (default
#                        8192, as in docs/agents.md; their own defaults are
#                        32000). The sim's answers stop by themselves after
#                        274-519 tokens, so the cap is rarely reached. Codex
#                        sends no cap.
#   SIM_ARGS             when set, run `anvilproxy sim $SIM_ARGS` as a separate
#                        upstream instead of the embedded sim, e.g.
#                        "--slots 1 --report-cached=false" (an ollama-like engine)
#   KEEP=1               keep the temporary directory (logs, agent homes)
#   AGENTS_NPM_DIR       reuse an npm install directory instead of a fresh one
#
# Exit status: 0 when every selected agent passed, 1 otherwise.
set -uo pipefail

CODEX_VERSION=${CODEX_VERSION:-0.171.0}
OPENCODE_VERSION=${OPENCODE_VERSION:-1.18.33}
CLAUDE_CODE_VERSION=${CLAUDE_CODE_VERSION:-2.1.197}
AGENT_TIMEOUT=${AGENT_TIMEOUT:-180}
AGENT_MAX_SECONDS=${AGENT_MAX_SECONDS:-30}
AGENT_PROMPT=${AGENT_PROMPT:-Say hello in one word.}
MAX_OUTPUT_TOKENS=${MAX_OUTPUT_TOKENS:-8192}
SIM_ARGS=${SIM_ARGS:-}

agents=("$@")
[ ${#agents[@]} -eq 0 ] && agents=(codex opencode claude)
for a in "${agents[@]}"; do
	case $a in codex | opencode | claude) ;; *)
		echo "unknown agent $a (want codex, opencode or claude)" >&2
		exit 2
		;;
	esac
done

for tool in go node npm curl timeout; do
	command -v "$tool" >/dev/null || {
		echo "agents-smoke: $tool is required" >&2
		exit 2
	}
done

repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/anvil-agents.XXXXXX")
logs=$work/logs
mkdir -p "$logs" "$work/project"
proxy_pid=
sim_pid=

cleanup() {
	for pid in $proxy_pid $sim_pid; do
		if kill -0 "$pid" 2>/dev/null; then
			kill "$pid" 2>/dev/null
			wait "$pid" 2>/dev/null
		fi
	done
	if [ "${KEEP:-0}" = 1 ]; then
		echo "kept $work"
	else
		rm -rf "$work"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { printf '\n== %s\n' "$*"; }

say "node $(node --version), npm $(npm --version), $(go version | cut -d' ' -f3)"

say "building anvilproxy"
(cd "$repo" && go build -o "$work/anvilproxy" ./cmd/anvilproxy) || exit 1

npm_dir=${AGENTS_NPM_DIR:-$work/npm}
pkgs=()
for a in "${agents[@]}"; do
	case $a in
	codex) pkgs+=("@openai/codex@$CODEX_VERSION") ;;
	opencode) pkgs+=("opencode-ai@$OPENCODE_VERSION") ;;
	claude) pkgs+=("@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION") ;;
	esac
done
say "installing ${pkgs[*]} into $npm_dir"
mkdir -p "$npm_dir"
[ -f "$npm_dir/package.json" ] || echo '{"private":true}' >"$npm_dir/package.json"
# The three packages ship native binaries as per-platform optional
# dependencies; their bin entries work without install scripts, which npm 11
# skips unless allowed.
if ! npm install --prefix "$npm_dir" --no-audit --no-fund --loglevel=error "${pkgs[@]}" >"$logs/npm.log" 2>&1; then
	cat "$logs/npm.log"
	exit 1
fi
bin=$npm_dir/node_modules/.bin

free_port() {
	node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'
}
port=$(free_port)
admin=$(free_port)
proxy=http://127.0.0.1:$port
adminurl=http://127.0.0.1:$admin

upstream=()
if [ -n "$SIM_ARGS" ]; then
	simport=$(free_port)
	say "starting anvilproxy sim $SIM_ARGS on 127.0.0.1:$simport"
	# shellcheck disable=SC2086 # SIM_ARGS is a list of flags
	"$work/anvilproxy" sim --listen "127.0.0.1:$simport" $SIM_ARGS >"$logs/sim.log" 2>&1 &
	sim_pid=$!
	upstream=(--upstream "http://127.0.0.1:$simport")
fi
say "starting anvilproxy serve on $proxy (admin $adminurl, upstream: ${upstream[1]:-embedded sim})"
"$work/anvilproxy" serve --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" "${upstream[@]}" >"$logs/proxy.log" 2>&1 &
proxy_pid=$!
for _ in $(seq 100); do
	curl -sf "$adminurl/healthz" >/dev/null 2>&1 && curl -sf "$proxy/v1/models" >/dev/null 2>&1 && break
	sleep 0.1
done
curl -sf "$proxy/v1/models" >/dev/null || {
	echo "the proxy did not come up:" >&2
	cat "$logs/proxy.log" >&2
	exit 1
}

# last_id prints the highest request id the proxy has recorded (0 if none).
last_id() {
	curl -sf "$adminurl/requests?limit=1" | node -e '
		let s = "";
		process.stdin.on("data", d => s += d).on("end", () => {
			const rs = JSON.parse(s).requests;
			console.log(rs.length ? rs[0].id : 0);
		});
	'
}

# check ROUTE AFTER: lists the requests the proxy recorded with an id above
# AFTER (those of the agent just run) and succeeds when one of them is on
# ROUTE with a time to first output.
check() {
	curl -sf "$adminurl/requests?limit=100000" | node -e '
		const [route, after] = [process.argv[1], Number(process.argv[2])];
		let s = "";
		process.stdin.on("data", d => s += d).on("end", () => {
			const all = JSON.parse(s).requests.filter(r => r.id > after).reverse();
			const rs = all.filter(r => r.route === route);
			const timed = rs.filter(r => r.time_to_first_output_ms !== null);
			const ms = v => v === null ? "null" : Math.round(v);
			console.log(`   proxy recorded ${all.length} request(s): ${rs.length} on route ${route}, ${timed.length} of them with time_to_first_output_ms, ${all.filter(r => r.failed).length} failed`);
			for (const r of all) {
				console.log(`   - ${r.method} ${r.route} model=${r.model || "-"} status=${r.status} stream=${r.stream} failed=${r.failed}` +
					(r.error_kind ? ` error=${r.error_side}/${r.error_kind}` : "") +
					` ttfo_ms=${ms(r.time_to_first_output_ms)} ttft_ms=${ms(r.ttft_ms)} e2e_ms=${ms(r.e2e_ms)}` +
					` prompt=${r.prompt_tokens} cached=${r.cached_tokens} output=${r.output_tokens}(${r.output_token_source || "-"})`);
			}
			process.exit(timed.length > 0 ? 0 : 1);
		});
	' "$1" "$2"
}

# run NAME ROUTE CMD...: runs an agent under the timeout in the project
# directory and checks the proxy's record of its requests.
declare -A result
run() {
	local name=$1 route=$2
	shift 2
	say "$name: $*"
	local start=$SECONDS rc before
	before=$(last_id)
	(cd "$work/project" && timeout --kill-after=10 "$AGENT_TIMEOUT" "$@") </dev/null >"$logs/$name.log" 2>&1
	rc=$?
	local took=$((SECONDS - start))
	echo "   exit $rc after ${took}s; last lines of its output:"
	tail -n 5 "$logs/$name.log" | cut -c1-200 | sed 's/^/   | /'
	if check "$route" "$before" && [ "$rc" = 0 ] && [ "$took" -lt "$AGENT_MAX_SECONDS" ]; then
		result[$name]="PASS (agent exit $rc in ${took}s)"
	else
		result[$name]="FAIL (agent exit $rc in ${took}s, limit ${AGENT_MAX_SECONDS}s; see $logs/$name.log)"
	fi
}

echo "# anvilproxy smoke project" >"$work/project/README.md"

for a in "${agents[@]}"; do
	home=$work/home/$a
	mkdir -p "$home/.codex"
	case $a in
	codex)
		# Codex ignores OPENAI_BASE_URL for its built-in provider: define a
		# provider speaking the Responses API with a base_url.
		run codex responses env HOME="$home" CODEX_HOME="$home/.codex" ANVIL_KEY=sk-anvil-dummy \
			"$bin/codex" exec --skip-git-repo-check --sandbox read-only \
			-c "model_providers.anvil={name=\"anvil\",base_url=\"$proxy/v1\",wire_api=\"responses\",env_key=\"ANVIL_KEY\"}" \
			-c model_provider=anvil -c model=anvil-sim \
			-c check_for_update_on_startup=false \
			"$AGENT_PROMPT"
		;;
	opencode)
		cat >"$home/opencode.json" <<EOF
{
  "\$schema": "https://opencode.ai/config.json",
  "provider": {
    "anvil": {
      "npm": "@ai-sdk/openai-compatible",
      "name": "anvilproxy",
      "options": { "baseURL": "$proxy/v1", "apiKey": "sk-anvil-dummy" },
      "models": { "anvil-sim": { "name": "anvil-sim", "limit": { "context": 262144, "output": $MAX_OUTPUT_TOKENS } } }
    }
  },
  "model": "anvil/anvil-sim",
  "small_model": "anvil/anvil-sim",
  "autoupdate": false,
  "share": "disabled"
}
EOF
		run opencode chat env HOME="$home" XDG_CONFIG_HOME="$home/.config" XDG_DATA_HOME="$home/.local/share" \
			XDG_CACHE_HOME="$home/.cache" XDG_STATE_HOME="$home/.local/state" \
			OPENCODE_CONFIG="$home/opencode.json" OPENCODE_DISABLE_AUTOUPDATE=1 OPENCODE_DISABLE_MODELS_FETCH=1 \
			OPENCODE_DISABLE_LSP_DOWNLOAD=1 OPENCODE_DISABLE_SHARE=1 OPENCODE_DISABLE_CLAUDE_CODE=1 \
			"$bin/opencode" run -m anvil/anvil-sim "$AGENT_PROMPT"
		;;
	claude)
		run claude messages env HOME="$home" ANTHROPIC_BASE_URL="$proxy" ANTHROPIC_API_KEY=sk-ant-anvil-dummy \
			CLAUDE_CODE_MAX_OUTPUT_TOKENS="$MAX_OUTPUT_TOKENS" DISABLE_AUTOUPDATER=1 \
			CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 \
			"$bin/claude" -p --model anvil-sim "$AGENT_PROMPT"
		;;
	esac
done

say "summary"
fail=0
for a in "${agents[@]}"; do
	case $a in
	codex) v="@openai/codex@$CODEX_VERSION ($("$bin/codex" --version 2>/dev/null))" ;;
	opencode) v="opencode-ai@$OPENCODE_VERSION" ;;
	claude) v="@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" ;;
	esac
	printf '   %-9s %-62s %s\n' "$a" "$v" "${result[$a]}"
	case ${result[$a]} in PASS*) ;; *) fail=1 ;; esac
done
exit $fail
