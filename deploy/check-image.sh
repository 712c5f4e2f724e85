#!/usr/bin/env bash
# Builds the container image (deploy/build-image.sh) in a buildah storage of its own and runs it
# without a container engine (`buildah run --isolation chroot`): `gpuprofd check-config` on the
# image's configuration, then gpuprofd with that configuration, its sockets in a host directory
# mounted at /run/gpuprof; `gpuprofctl status` from a second container of the image, a fake CUDA
# process (gpuprof-traced-agent, on the host) connecting through the same directory, a session
# started and stopped by gpuprofctl that must record its work, and gpuprofd stopped by SIGTERM,
# which it must survive cleanly. Then removes the containers, the image and the storage. Needs
# root and Debian's mirror (mmdebstrap); installs buildah and mmdebstrap when missing. Run from
# .ci/run after the release build (check-deb.sh) and the libcupti download.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "!!! not root: NOT CHECKING the container image (deploy/check-image.sh) !!!" >&2
  exit 0
fi
t0=$SECONDS
if ! command -v buildah >/dev/null 2>&1 || ! command -v mmdebstrap >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends buildah mmdebstrap >/dev/null
fi
agent="${GPUPROF_CHECK_AGENT:-target/debug/gpuprof-traced-agent}"
[ -x "$agent" ] || cargo build --locked -q -p gpuprof-testkit --bin gpuprof-traced-agent
t_tools=$SECONDS

work="$(mktemp -d "${TMPDIR:-/tmp}/gpuprof-check-image.XXXXXX")"
# vfs: works on any file system, and the image is small.
cat >"$work/storage.conf" <<EOF
[storage]
driver = "vfs"
graphroot = "$work/storage"
runroot = "$work/run"
EOF
export CONTAINERS_STORAGE_CONF="$work/storage.conf"
image=localhost/gpuprof:check
sock="$work/sock"
mkdir -p "$sock"
daemon_pid="" agent_pid=""
cleanup() {
  exec 7>&-
  [ -z "$agent_pid" ] || kill "$agent_pid" 2>/dev/null || true
  [ -z "$daemon_pid" ] || kill "$daemon_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  buildah rm --all >/dev/null 2>&1 || true
  buildah rmi --all --force >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "check-image: $*" >&2
  [ ! -f "$work/gpuprofd.log" ] || { echo "--- gpuprofd's log:" >&2; cat "$work/gpuprofd.log" >&2; }
  exit 1
}

deploy/build-image.sh "$image"
t_build=$SECONDS
buildah images "$image"
size="$(buildah images --format '{{.Size}}' "$image")"

run() { # CONTAINER COMMAND...: runs COMMAND in CONTAINER with the socket directory mounted
  local c="$1"
  shift
  buildah run --isolation chroot -v "$sock:/run/gpuprof" "$c" -- "$@"
}
daemon="$(buildah from --pull=never --quiet "$image")"
client="$(buildah from --pull=never --quiet "$image")"
run "$daemon" /usr/bin/gpuprofd check-config /etc/gpuprof/gpuprofd.toml
run "$daemon" /usr/bin/gpuprofd --config /etc/gpuprof/gpuprofd.toml >"$work/gpuprofd.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do
  [ -S "$sock/api.sock" ] && [ -S "$sock/agent.sock" ] && break
  kill -0 "$daemon_pid" 2>/dev/null || fail "gpuprofd exited"
  sleep 0.1
done
[ -S "$sock/api.sock" ] || fail "gpuprofd made no sockets in 10 s"
status="$(run "$client" /usr/bin/gpuprofctl status)"
echo "$status"
grep -q "^gpuprofd " <<<"$status" || fail "gpuprofctl status: $status"

# A CUDA process (fake) in another container would share the socket directory the same way.
mkfifo "$work/agent.in"
"$agent" --socket "$sock/agent.sock" --rate 5000 <"$work/agent.in" >"$work/agent.out" 2>&1 &
agent_pid=$!
exec 7>"$work/agent.in"
wait_for() { # PATTERN: a line of the agent's output
  for _ in $(seq 100); do
    grep -q "$1" "$work/agent.out" && return 0
    sleep 0.1
  done
  fail "the fake agent never printed '$1': $(cat "$work/agent.out")"
}
wait_for '^process_id '
json() { python3 -c 'import json, sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }
procs="$(run "$client" /usr/bin/gpuprofctl procs)"
grep -q "/usr/bin/python3" <<<"$procs" || fail "gpuprofctl procs lacks the agent: $procs"
id="$(run "$client" /usr/bin/gpuprofctl --json session start --exe python3 | json id)"
[ -n "$id" ] || fail "no session id"
wait_for "^started $id\$"
sleep 1
run "$client" /usr/bin/gpuprofctl session stop "$id"
wait_for "^stopped $id "
records="$(run "$client" /usr/bin/gpuprofctl --json session show "$id" | json records)"
sent="$(sed -n "s/^stopped $id //p" "$work/agent.out")"
[ "${records:-0}" -gt 0 ] && [ "$records" = "$sent" ] || fail "session $id: $records records stored, the agent sent $sent"
exec 7>&-
wait "$agent_pid" || fail "the fake agent failed: $(cat "$work/agent.out")"
agent_pid=""

# The DaemonSet's init container (deploy/k8s/gpuprofd.yaml): the injector copied out with the
# image's sh, cp and mv.
mkdir -p "$work/host-lib"
buildah run --isolation chroot -v "$work/host-lib:/host-lib" "$client" -- sh -c \
  'cp /usr/lib/gpuprof/libgpuprof_inject.so /host-lib/.libgpuprof_inject.so.new &&
   mv /host-lib/.libgpuprof_inject.so.new /host-lib/libgpuprof_inject.so'
mnt="$(buildah mount "$client")"
cmp "$mnt/usr/lib/gpuprof/libgpuprof_inject.so" "$work/host-lib/libgpuprof_inject.so" ||
  fail "the init container's command did not copy the injector"
buildah umount "$client" >/dev/null

# SIGTERM to gpuprofd itself (buildah run would kill it): found among buildah run's descendants.
descendants() {
  local c
  for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
    echo "$c"
    descendants "$c"
  done
}
gpuprofd=""
for p in $(descendants "$daemon_pid"); do
  [ "$(cat /proc/"$p"/comm 2>/dev/null)" = gpuprofd ] && gpuprofd=$p
done
[ -n "$gpuprofd" ] || fail "gpuprofd's process not found under buildah run ($daemon_pid)"
kill -TERM "$gpuprofd"
wait "$daemon_pid" || fail "gpuprofd exited with status $? on SIGTERM"
daemon_pid=""
grep -q " ready: API on " "$work/gpuprofd.log" || fail "gpuprofd never said it was ready"
echo "check-image: $image ($size) built in $((t_build - t_tools)) s; check-config, gpuprofd, gpuprofctl status and a session of $records records in it passed; $((SECONDS - t0)) s in all (tools $((t_tools - t0)) s)"
