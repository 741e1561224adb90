#!/usr/bin/env bash
# Builds the two images the compose files run, from nothing, with no container registry:
#
#   copyless-base:bookworm   Debian bookworm made with debootstrap from the machine's apt mirror and loaded
#                            with `docker import`: python3, python3-venv, etcd-server, etcd-client. The etcd
#                            services run it as it is; the broker image starts from it.
#   copyless:local           the base plus a virtualenv with copyless installed from a wheelhouse (no package
#                            index inside the build), and the copyless-health probe (cluster/health.py).
#
# Both are cached by content: each is first tagged with a key (base: the recipe below; copyless: the base's
# image id, this script, the Dockerfile, the probe and every file the wheel is built from), and a run whose
# key already names an image builds nothing and only moves the two stable tags above onto it. A registry is
# never asked, so the same path works with or without one. Dependencies are not pinned: a build takes their
# newest releases, and a source change (or `docker rmi` of the keyed tag) picks up later ones.
#
#   copyless-prometheus:local  only with --prometheus: the base plus Debian's prometheus package
#                            (cluster/prometheus.Dockerfile), for the compose file's opt-in "metrics" profile.
#
# Usage: cluster/build-images.sh [--quiet]     prints the two stable image references on its last two lines
#        cluster/build-images.sh --prometheus  the same, and the Prometheus image's on a third, last line
#        cluster/build-images.sh --print-tags    builds nothing; prints the content-keyed tags a build would
#                                                use (the copyless one only once the base exists)
# Environment:
#   COPYLESS_DEBIAN_MIRROR   Debian mirror for debootstrap (default: the first bookworm URI in the machine's
#                            apt sources, else http://deb.debian.org/debian)
#   PYTHON                   the Python that builds the wheelhouse (default python3.11, else python3; any
#                            version with pip: dependencies are fetched for the image's Python, 3.11)
# Needs: docker, and for the first build of the base debootstrap run as root (directly, or through sudo -n).
set -euo pipefail
cd "$(dirname "$0")/.."

QUIET=0
PRINT_TAGS=0
PROMETHEUS=0
for arg in "$@"; do
    case "$arg" in
        --quiet) QUIET=1 ;;
        --prometheus) PROMETHEUS=1 ;;
        --print-tags) PRINT_TAGS=1 ;;
        *) echo "build-images: unknown argument $arg" >&2; exit 2 ;;
    esac
done
say() { [ "$QUIET" = 1 ] || echo "build-images: $*" >&2; }
die() { echo "build-images: error: $*" >&2; exit 1; }

# Bump RECIPE_VERSION when the way the base is made changes in a way the package list does not show.
SUITE=bookworm
BASE_PACKAGES=python3,python3-venv,etcd-server,etcd-client
RECIPE_VERSION=1
BASE_REPO=copyless-base
IMAGE_REPO=copyless

docker info >/dev/null 2>&1 || die "no Docker engine answers (docker info failed)"
ARCH=$(docker info --format '{{.Architecture}}')
case "$ARCH" in
    x86_64 | amd64) DEB_ARCH=amd64 WHEEL_ARCH=x86_64 ;;
    aarch64 | arm64) DEB_ARCH=arm64 WHEEL_ARCH=aarch64 ;;
    *) die "unsupported engine architecture $ARCH" ;;
esac

hash_text() { sha256sum | cut -c1-16; }

# ---- the base image --------------------------------------------------------------------------------------

# The mirror from the machine's apt sources: deb822 files (URIs:/Suites: stanzas) and one-line `deb URL SUITE`
# entries; the first one serving $SUITE itself (not -security or -updates) wins.
apt_mirror() {
    local file
    for file in /etc/apt/sources.list.d/*.sources; do
        [ -f "$file" ] || continue
        awk -v suite="$SUITE" '
            BEGIN { RS = ""; FS = "\n" }
            {
                uri = ""; serves = 0; enabled = 1
                for (i = 1; i <= NF; i++) {
                    split($i, words, /[ \t]+/)
                    if (words[1] == "URIs:") uri = words[2]
                    if (words[1] == "Enabled:" && words[2] == "no") enabled = 0
                    if (words[1] == "Suites:") for (w in words) if (words[w] == suite) serves = 1
                }
                if (uri != "" && serves && enabled) { print uri; exit }
            }' "$file"
    done
    for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$file" ] || continue
        # deb [options] URI SUITE COMPONENTS...
        sed -e 's/\[[^]]*\]//' "$file" | awk -v suite="$SUITE" '$1 == "deb" && $3 == suite { print $2; exit }'
    done
}

BASE_KEY=$(printf '%s\n' "$RECIPE_VERSION" "$SUITE" "$DEB_ARCH" "$BASE_PACKAGES" minbase | hash_text)
BASE_TAG=$BASE_REPO:$SUITE-$BASE_KEY

if [ "$PRINT_TAGS" = 1 ]; then
    echo "$BASE_TAG"
    docker image inspect "$BASE_TAG" >/dev/null 2>&1 || exit 0
elif docker image inspect "$BASE_TAG" >/dev/null 2>&1; then
    say "base image $BASE_TAG is up to date"
else
    MIRROR=${COPYLESS_DEBIAN_MIRROR:-$(apt_mirror | head -n 1)}
    MIRROR=${MIRROR:-http://deb.debian.org/debian}
    command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] \
        || die "debootstrap is not installed (Debian/Ubuntu: apt-get install debootstrap); it makes the base image"
    SUDO=()
    if [ "$(id -u)" != 0 ]; then
        sudo -n true 2>/dev/null || die "debootstrap must run as root: run this as root or with passwordless sudo"
        SUDO=(sudo -n)
    fi
    ROOTFS=$(mktemp -d "${TMPDIR:-/tmp}/copyless-rootfs.XXXXXX")
    # The root file system belongs to root; remove it whatever happens.
    trap '"${SUDO[@]}" rm -rf "$ROOTFS"; rm -f "$ROOTFS.log"' EXIT
    say "making $BASE_TAG with debootstrap from $MIRROR (about a minute)"
    started=$SECONDS
    "${SUDO[@]}" env PATH="/usr/sbin:/sbin:$PATH" debootstrap --variant=minbase --arch="$DEB_ARCH" \
        --include="$BASE_PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 \
        || { tail -n 30 "$ROOTFS.log" >&2; rm -f "$ROOTFS.log"; die "debootstrap failed (log tail above)"; }
    rm -f "$ROOTFS.log"
    # Downloaded packages and indexes are a third of the tree and are never used inside a container.
    "${SUDO[@]}" sh -c 'cd "$1" && rm -rf var/cache/apt/archives/*.deb var/cache/apt/*.bin var/lib/apt/lists/*' \
        sh "$ROOTFS"
    "${SUDO[@]}" tar -C "$ROOTFS" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["/bin/bash"]' \
        --message "debootstrap --variant=minbase --include=$BASE_PACKAGES $SUITE ($MIRROR)" \
        - "$BASE_TAG" >/dev/null
    "${SUDO[@]}" rm -rf "$ROOTFS"
    trap - EXIT
    say "made $BASE_TAG in $((SECONDS - started)) s"
fi
[ "$PRINT_TAGS" = 1 ] || docker tag "$BASE_TAG" "$BASE_REPO:$SUITE"
BASE_ID=$(docker image inspect --format '{{.Id}}' "$BASE_TAG")

# ---- the copyless image ----------------------------------------------------------------------------------

# Exactly what the wheel is built from (pyproject's package-dir folders, the README it names), plus what the
# image build reads. Bytecode caches are not content.
SOURCES=(pyproject.toml README.md copyless broker client protocol)
source_files() {
    find "${SOURCES[@]}" -type f ! -name '*.pyc' ! -path '*/__pycache__/*' ! -path '*.egg-info/*' | LC_ALL=C sort
}
IMAGE_KEY=$( {
    echo "$BASE_ID"
    sha256sum cluster/build-images.sh Dockerfile cluster/health.py
    source_files | xargs -d '\n' sha256sum
} | hash_text)
IMAGE_TAG=$IMAGE_REPO:$IMAGE_KEY

if [ "$PRINT_TAGS" = 1 ]; then
    echo "$IMAGE_TAG"
    exit 0
elif docker image inspect "$IMAGE_TAG" >/dev/null 2>&1; then
    say "copyless image $IMAGE_TAG is up to date"
else
    PY=${PYTHON:-python3.11}
    command -v "$PY" >/dev/null 2>&1 || PY=python3
    "$PY" -m pip --version >/dev/null 2>&1 || die "$PY has no pip; set PYTHON to a Python with pip"
    STAGE=$(mktemp -d "${TMPDIR:-/tmp}/copyless-image.XXXXXX")
    trap 'rm -rf "$STAGE"' EXIT
    started=$SECONDS
    # The wheel is built from a copy so the checkout gains no build/ or egg-info debris.
    mkdir -p "$STAGE/src" "$STAGE/context/wheelhouse"
    source_files | xargs -d '\n' cp --parents -t "$STAGE/src"
    say "building the copyless wheel"
    "$PY" -m pip wheel -q --no-deps --no-build-isolation "$STAGE/src" -w "$STAGE/context/wheelhouse" 2>/dev/null \
        || "$PY" -m pip wheel -q --no-deps "$STAGE/src" -w "$STAGE/context/wheelhouse" \
        || die "pip wheel failed"
    # Dependencies as binary wheels for the image (CPython 3.11, glibc 2.36), whatever Python builds them:
    # pip matches platform tags exactly, so every manylinux level a wheel may carry is listed.
    PLATFORMS=()
    for glibc_minor in $(seq 36 -1 5); do PLATFORMS+=(--platform "manylinux_2_${glibc_minor}_$WHEEL_ARCH"); done
    for legacy in manylinux2014 manylinux2010 manylinux1; do PLATFORMS+=(--platform "${legacy}_$WHEEL_ARCH"); done
    say "fetching the dependencies' wheels"
    "$PY" -m pip download -q --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 \
        "${PLATFORMS[@]}" -d "$STAGE/context/wheelhouse" "$STAGE"/context/wheelhouse/copyless-*.whl \
        || die "pip download of the dependencies failed (is a package index reachable?)"
    install -m 0755 cluster/health.py "$STAGE/context/copyless-health"
    say "building $IMAGE_TAG"
    docker build -f Dockerfile --build-arg "BASE_IMAGE=$BASE_TAG" --label "org.copyless.build-key=$IMAGE_KEY" \
        -t "$IMAGE_TAG" "$STAGE/context" >"$STAGE/build.log" 2>&1 \
        || { tail -n 30 "$STAGE/build.log" >&2; die "docker build failed (log tail above)"; }
    rm -rf "$STAGE"
    trap - EXIT
    say "built $IMAGE_TAG in $((SECONDS - started)) s"
    # Keyed images pile up as the sources change (~55 MB of layers each); keep the three newest, so switching
    # between a few branches still finds its image. One a container still uses is not removed.
    docker images "$IMAGE_REPO" --format '{{.Tag}}' | grep -E '^[0-9a-f]{16}$' | tail -n +4 \
        | while read -r stale; do docker rmi "$IMAGE_REPO:$stale" >/dev/null 2>&1 || true; done
fi
docker tag "$IMAGE_TAG" "$IMAGE_REPO:local"

# ---- the Prometheus image (only when asked) ----------------------------------------------------------------

PROMETHEUS_REPO=copyless-prometheus
if [ "$PROMETHEUS" = 1 ]; then
    PROMETHEUS_KEY=$( {
        echo "$BASE_ID"
        sha256sum cluster/build-images.sh cluster/prometheus.Dockerfile cluster/prometheus.yml
    } | hash_text)
    PROMETHEUS_TAG=$PROMETHEUS_REPO:$PROMETHEUS_KEY
    if docker image inspect "$PROMETHEUS_TAG" >/dev/null 2>&1; then
        say "prometheus image $PROMETHEUS_TAG is up to date"
    else
        STAGE=$(mktemp -d "${TMPDIR:-/tmp}/copyless-prometheus.XXXXXX")
        trap 'rm -rf "$STAGE"' EXIT
        started=$SECONDS
        cp cluster/prometheus.yml "$STAGE/"
        say "building $PROMETHEUS_TAG (Debian's prometheus package from the base's mirror; about a minute)"
        docker build -f cluster/prometheus.Dockerfile --build-arg "BASE_IMAGE=$BASE_TAG" \
            --label "org.copyless.build-key=$PROMETHEUS_KEY" -t "$PROMETHEUS_TAG" "$STAGE" >"$STAGE.log" 2>&1 \
            || { tail -n 30 "$STAGE.log" >&2; rm -f "$STAGE.log"; die "docker build of the prometheus image failed"; }
        rm -rf "$STAGE" "$STAGE.log"
        trap - EXIT
        say "built $PROMETHEUS_TAG in $((SECONDS - started)) s"
    fi
    docker tag "$PROMETHEUS_TAG" "$PROMETHEUS_REPO:local"
fi

echo "$BASE_REPO:$SUITE"
echo "$IMAGE_REPO:local"
[ "$PROMETHEUS" = 0 ] || echo "$PROMETHEUS_REPO:local"
