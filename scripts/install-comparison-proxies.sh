#!/usr/bin/env bash
# Installs the reverse proxies "anvilproxy bench" compares itself with:
# nginx, Caddy and HAProxy, from the distribution's packages (Debian or
# Ubuntu, apt). Only the binaries are needed: the bench starts each one
# itself, from a config it writes to a temporary directory, on loopback.
# The packages' own system services are not started (a policy-rc.d that
# refuses them is put in place for the install when none exists), since
# nginx's and Caddy's default sites would both want port 80.
#
# Usage: sudo scripts/install-comparison-proxies.sh
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
	echo "install-comparison-proxies: run as root (apt-get install)" >&2
	exit 1
fi
if ! command -v apt-get >/dev/null; then
	echo "install-comparison-proxies: apt-get not found; install nginx, caddy and haproxy with your package manager" >&2
	exit 1
fi

apt-get update -q

# nginx-light is the small build (Debian 11/12); newer releases ship only
# nginx. Whichever has a candidate version is installed.
candidate() { apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ { print $2 }'; }
pkgs=()
for choice in "nginx-light nginx" "caddy" "haproxy"; do
	found=""
	for p in $choice; do
		c="$(candidate "$p")"
		if [ -n "$c" ] && [ "$c" != "(none)" ]; then
			found="$p"
			break
		fi
	done
	if [ -z "$found" ]; then
		echo "install-comparison-proxies: no package for: $choice (skipped; the bench notes it)" >&2
		continue
	fi
	pkgs+=("$found")
done
if [ ${#pkgs[@]} -eq 0 ]; then
	exit 1
fi

policy=/usr/sbin/policy-rc.d
added_policy=""
if [ ! -e "$policy" ]; then
	printf '#!/bin/sh\nexit 101\n' >"$policy"
	chmod 755 "$policy"
	added_policy=1
fi
cleanup() { if [ -n "$added_policy" ]; then rm -f "$policy"; fi; }
trap cleanup EXIT

DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}"

for bin in nginx caddy haproxy; do
	if path="$(command -v "$bin")"; then
		echo "$bin: $path"
	else
		echo "$bin: not installed"
	fi
done
