#!/usr/bin/env bash
# Install the headless browser the web view's e2e test drives: Debian's
# chromium and chromium-driver (WebDriver), nothing downloaded at test time.
# Idempotent: does nothing when both are installed. Prints the driver's path.
set -euo pipefail
driver=$(command -v chromedriver || true)
if [ -z "$driver" ] || ! command -v chromium >/dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >/dev/null
  $sudo apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
  driver=$(command -v chromedriver)
fi
echo "$driver"
