#!/bin/sh
# Install what the browser tests need: Debian's Chromium (Playwright drives it; it never
# downloads a browser of its own). Idempotent: does nothing when /usr/bin/chromium exists.
set -eu
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
if [ "$(id -u)" != "0" ]; then
    echo "install-browser: /usr/bin/chromium is missing; run as root: apt-get install chromium chromium-driver" >&2
    exit 0
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
