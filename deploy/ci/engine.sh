#!/usr/bin/env bash
# Brings up a Docker engine where none answers, for .ci/run:
#
#   deploy/ci/engine.sh start   installs Debian's docker.io if dockerd is
#                               missing, starts dockerd, waits until it
#                               answers; prints "started" when it started one,
#                               "running" when one already answered
#   deploy/ci/engine.sh stop    stops the dockerd that start started
#
# Exits non-zero, with a line that says why, when no engine can be had.
set -euo pipefail
PIDFILE=/run/outbox-ci-dockerd.pid
LOG=/var/tmp/outbox-ci-dockerd.log
say() { echo "engine: $*" >&2; }

case "${1:-}" in
start)
	if docker info >/dev/null 2>&1; then
		echo running
		exit 0
	fi
	if ! command -v dockerd >/dev/null 2>&1; then
		say "dockerd missing; installing Debian's docker.io"
		apt-get update -qq >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
		# A package that starts its own daemon (an init system here) leaves
		# nothing for this script to start, or stop.
		if docker info >/dev/null 2>&1; then
			echo running
			exit 0
		fi
	fi
	say "starting dockerd (log: $LOG)"
	dockerd >"$LOG" 2>&1 &
	echo $! >"$PIDFILE"
	for _ in $(seq 60); do
		if docker info >/dev/null 2>&1; then
			say "dockerd $(docker version -f '{{.Server.Version}}') answers, storage driver $(docker info -f '{{.Driver}}')"
			echo started
			exit 0
		fi
		if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
			say "dockerd exited; its log ends:"
			tail -15 "$LOG" >&2
			exit 1
		fi
		sleep 1
	done
	say "dockerd did not answer within 60s; stopping it; its log ends:"
	tail -15 "$LOG" >&2
	kill "$(cat "$PIDFILE")" 2>/dev/null || true
	rm -f "$PIDFILE"
	exit 1
	;;
stop)
	if [ -f "$PIDFILE" ]; then
		pid=$(cat "$PIDFILE")
		rm -f "$PIDFILE"
		# Only the dockerd this script started: the pid must still be one.
		if [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" != "$(command -v dockerd)" ] &&
			[ "$(basename "$(readlink "/proc/$pid/exe" 2>/dev/null)")" != dockerd ]; then
			say "pid $pid is no longer a dockerd; nothing to stop"
			exit 0
		fi
		kill "$pid"
		for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
		if kill -0 "$pid" 2>/dev/null; then
			say "dockerd $pid still running 30 s after SIGTERM; killing it"
			kill -KILL "$pid" 2>/dev/null || true
		fi
		say "dockerd stopped"
	fi
	;;
*)
	echo "usage: $0 start|stop" >&2
	exit 2
	;;
esac
