#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian machine: JDK 17 + Maven, redis-server, a headless Chromium,
# Python 3.11 venv with
# lakesink and its test tools, and the JVM jars declared in jvm/pom.xml.
# Re-running it is cheap: each step is skipped when its inputs did not change.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
say() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }

# --- JDK 17, Maven and redis-server (the tests' and the Redis demo's server) -------------
need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v pkill >/dev/null 2>&1 || need_apt+=(procps)  # the clean-up of a failed step

command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
command -v javac >/dev/null 2>&1 || need_apt+=(openjdk-17-jdk-headless)
if ((${#need_apt[@]})); then
  say "installing ${need_apt[*]} with apt-get"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
# a headless Chromium: the status page's test renders the page in it (best effort: without
# it that one test fails, saying so)
if ! command -v chromium-headless-shell >/dev/null 2>&1 && ! command -v chromium >/dev/null 2>&1; then
  say "installing chromium-headless-shell with apt-get"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  ($SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
      chromium-headless-shell >/dev/null) || say "chromium-headless-shell did not install"
fi
java_major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
if [ "${java_major:-0}" -lt 17 ]; then
  for j in /usr/lib/jvm/java-17-openjdk-*; do [ -x "$j/bin/java" ] && export JAVA_HOME="$j" && break; done
fi

# Node.js for Azurite, Java 21+ for Apicurio: also from apt, before the parallel steps
# below (apt holds one lock)
AZURITE_VERSION="3.37.0"
if { [ ! -x .tools/azurite/node_modules/.bin/azurite-blob ] \
     || [ "$(cat .tools/azurite.version 2>/dev/null)" != "$AZURITE_VERSION" ]; } \
    && ! command -v npm >/dev/null 2>&1; then
  say "installing Node.js and npm (Azurite runs on Node.js)"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  ($SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm >/dev/null) \
    || say "no Node.js: the Azure tests will fail to start Azurite"
fi
if ! ls /usr/lib/jvm/*/release 2>/dev/null | xargs -r grep -hE 'JAVA_VERSION="(2[1-9]|[3-9][0-9])' >/dev/null \
    && [ -z "${APICURIO_JAVA_HOME:-}" ]; then
  say "installing openjdk-21-jre-headless (Apicurio Registry needs Java 21+)"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  ($SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openjdk-21-jre-headless >/dev/null) \
    || say "no Java 21+: the schema registry tests will fail to start their registry"
fi

# --- the downloads and builds below need nothing of each other: they run side by side -----
# (a fresh clone with the apt packages in place: 147 s side by side with uv, the Go build
# the last to end; 278 s one after another with pip and an optimised Go build). Each
# writes to a log of its own, shown with the second it ended when it is waited for; a
# failure stops the set-up there, with its log.
LOGS="$(mktemp -d)"
declare -A PIDS=()
cleanup() {  # a failed step: stop the others (their children: mvn's JVM, go's compilers)
  for pid in "${PIDS[@]}"; do pkill -P "$pid" 2>/dev/null || true; kill "$pid" 2>/dev/null || true; done
  rm -rf "$LOGS"
}
trap cleanup EXIT
beside() {  # beside NAME: run the function NAME in the background, at a lower priority
  # (nice 10) than the Python install
  ( trap 'echo "$SECONDS" > "$LOGS/$1.done"' EXIT  # when it ended (as await says)
    renice -n 10 "$BASHPID" >/dev/null 2>&1 || true
    "$1" ) >"$LOGS/$1.log" 2>&1 &
  PIDS[$1]=$!
}
await() {  # await NAME: wait for it and show its log; the set-up stops if it failed
  local rc=0
  wait "${PIDS[$1]}" || rc=$?
  unset "PIDS[$1]"
  cat "$LOGS/$1.log" >&2
  if [ "$rc" != 0 ]; then say "$1 failed (exit $rc)"; exit "$rc"; fi
  say "$1: done $(cat "$LOGS/$1.done" 2>/dev/null || echo '?') s into the set-up"
}

# --- JVM jars ---------------------------------------------------------------------------
stamp_jvm="jvm/.jars-installed"
want_jvm="$(sha256sum jvm/pom.xml | cut -c1-16)"
jars() {
  if [ "$(cat "$stamp_jvm" 2>/dev/null)" != "$want_jvm" ] || [ ! -d jvm/jars ] \
      || [ ! -d jvm/kafka-jars ] || [ ! -d jvm/hdfs-jars ]; then
    say "fetching JVM jars with Maven (jvm/pom.xml)"
    rm -f "$stamp_jvm"  # an interrupted fetch is not taken for a finished one
    rm -rf jvm/jars jvm/kafka-jars jvm/hdfs-jars
    mvn -q -B -f jvm/pom.xml -P connectors dependency:copy-dependencies \
        -DoutputDirectory="$ROOT/jvm/jars" -DincludeScope=runtime -DexcludeGroupIds=org.scala-lang
    mvn -q -B -f jvm/pom.xml -P kafka-broker dependency:copy-dependencies \
        -DoutputDirectory="$ROOT/jvm/kafka-jars" -DincludeScope=runtime
    mvn -q -B -f jvm/pom.xml -P hdfs-test dependency:copy-dependencies \
        -DoutputDirectory="$ROOT/jvm/hdfs-jars" -DincludeScope=runtime
    echo "$want_jvm" > "$stamp_jvm"
  fi
}
# --- fake-gcs-server (the GCS emulator of the tests), built from the Go module proxy ----
FAKE_GCS_VERSION="v1.56.1"
fake_gcs() {
  if [ ! -x .tools/bin/fake-gcs-server ] \
      || [ "$(cat .tools/fake-gcs.version 2>/dev/null)" != "$FAKE_GCS_VERSION" ]; then
    if command -v go >/dev/null 2>&1 || [ -x /usr/local/go/bin/go ]; then
      say "building fake-gcs-server $FAKE_GCS_VERSION with go install"
      mkdir -p .tools/bin
      # a test double: built without optimisation and cgo (a fresh cache: 69 s, not 83 s)
      if CGO_ENABLED=0 GOBIN="$ROOT/.tools/bin" "$(command -v go || echo /usr/local/go/bin/go)" \
          install -gcflags='all=-N -l' -ldflags='-s -w' \
          "github.com/fsouza/fake-gcs-server@$FAKE_GCS_VERSION"; then
        echo "$FAKE_GCS_VERSION" > .tools/fake-gcs.version
      else
        say "fake-gcs-server did not build: the GCS emulator tests will be skipped"
      fi
    else
      say "no Go toolchain: the GCS emulator tests will be skipped"
    fi
  fi
}
# --- Azurite (the Azure Blob emulator of the tests), from the npm registry -------------
azurite() {  # (AZURITE_VERSION: above, beside the Node.js install)
  if [ ! -x .tools/azurite/node_modules/.bin/azurite-blob ] \
      || [ "$(cat .tools/azurite.version 2>/dev/null)" != "$AZURITE_VERSION" ]; then
    say "installing Azurite $AZURITE_VERSION with npm"
    rm -rf .tools/azurite && mkdir -p .tools/azurite
    npm install --prefix .tools/azurite --no-audit --no-fund --loglevel=error \
        "azurite@$AZURITE_VERSION" >/dev/null \
      && echo "$AZURITE_VERSION" > .tools/azurite.version \
      || say "Azurite did not install: the Azure tests will fail to start it"
  fi
}
# --- Apicurio Registry (the tests' Confluent-API schema registry; needs Java 21+) --------
APICURIO_VERSION="3.3.3"
APICURIO_HOME=".tools/apicurio-$APICURIO_VERSION"
apicurio() {
  if [ ! -f "$APICURIO_HOME/quarkus-run.jar" ]; then
    say "fetching Apicurio Registry $APICURIO_VERSION from Maven Central"
    rm -rf "$APICURIO_HOME.part" && mkdir -p "$APICURIO_HOME.part"
    curl -fsSL "https://repo1.maven.org/maven2/io/apicurio/apicurio-registry-app/$APICURIO_VERSION/apicurio-registry-app-$APICURIO_VERSION-all.tar.gz" \
      | tar xz -C "$APICURIO_HOME.part"
    rm -rf "$APICURIO_HOME" && mv "$APICURIO_HOME.part" "$APICURIO_HOME"
  fi
}
beside jars
beside fake_gcs  # the last to end (at nice 0, a fresh set-up took 158 s, not 147 s)
beside azurite
beside apicurio

# --- Python 3.11 venv (in the foreground, beside the above) ------------------------------
PY=""
for cand in python3.11 "$HOME/.pyenv/versions/3.11"*/bin/python3 python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
    PY="$(command -v "$cand")"; break
  fi
done
if [ -z "$PY" ]; then
  say "installing python3.11 with apt-get"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3.11 python3.11-venv >/dev/null
  PY="$(command -v python3.11)"
fi
stamp_py=".venv/.lakesink-installed"
uv_install() {  # the packages with uv: it downloads and builds side by side (a fresh
  # machine: 40 s, pip alone 117 s). uv does not read pip's settings: the certificate
  # bundle, time-out and find-links are passed on; a machine whose pip is given another
  # index or constraints (PIP_* or pip.conf) says no here and installs with pip, as
  # does one where uv fails
  local cert="${SSL_CERT_FILE:-${PIP_CERT:-}}"
  [ -z "${PIP_INDEX_URL:-}${PIP_EXTRA_INDEX_URL:-}${PIP_CONSTRAINT:-}" ] || return 1
  ! .venv/bin/pip config list 2>/dev/null | grep -qE 'index-url|constraint' || return 1
  .venv/bin/pip install -q uv==0.13.8 || return 1
  env ${cert:+SSL_CERT_FILE="$cert"} \
    UV_HTTP_TIMEOUT="${UV_HTTP_TIMEOUT:-${PIP_DEFAULT_TIMEOUT:-30}}" \
    .venv/bin/uv pip install -q --python .venv/bin/python \
      ${PIP_FIND_LINKS:+--find-links "$PIP_FIND_LINKS"} -e ".[$extras]"
}
extras="test,bench"
want_py="$( (cat pyproject.toml; echo "$extras") | sha256sum | cut -c1-16)"
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp_py" 2>/dev/null)" != "$want_py" ]; then
  say "creating .venv with $PY and installing lakesink[$extras] (pyspark builds once: ~1 min with uv, ~2 with pip)"
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip wheel setuptools
  if uv_install; then
    say "the Python packages: installed with uv"
  else
    say "the Python packages: pip installs them (pip settings uv does not read, or uv failed)"
    .venv/bin/pip install -q -e ".[$extras]"
  fi
  echo "$want_py" > "$stamp_py"
  say "the Python packages: done $SECONDS s into the set-up"
fi

# --- lakesink's own Java functions (jvm/udf), compiled against pyspark's jars ------------
await jars
stamp_udf="jvm/.udf-installed"
want_udf="$( (cat jvm/udf/dev/lakesink/udf/*.java; echo "$want_jvm") | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp_udf" 2>/dev/null)" != "$want_udf" ] || [ ! -f jvm/jars/lakesink-udf.jar ]; then
  say "compiling lakesink's Java functions (jvm/udf)"
  spark_jars="$(.venv/bin/python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')"
  rm -rf jvm/udf/classes
  javac --release 17 -nowarn -cp "$spark_jars/*" -d jvm/udf/classes jvm/udf/dev/lakesink/udf/*.java
  jar cf jvm/jars/lakesink-udf.jar -C jvm/udf/classes .
  rm -rf jvm/udf/classes
  echo "$want_udf" > "$stamp_udf"
fi
await fake_gcs
await azurite
await apicurio
say "ready: $(.venv/bin/python --version), java $(java -version 2>&1 | head -1 | cut -d'"' -f2), $(ls jvm/jars | wc -l) connector jars, $(ls jvm/kafka-jars | wc -l) broker jars"
