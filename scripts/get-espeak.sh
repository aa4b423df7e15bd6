#!/usr/bin/env bash
# espeak-ng synthesises the embedded spoken-commands set (--dataset speech-synth): Debian's espeak-ng package.
set -u
command -v espeak-ng >/dev/null 2>&1 && exit 0
if command -v apt-get >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo="sudo"
  echo "installing espeak-ng (Debian package, for the embedded spoken-commands set)..."
  $sudo apt-get install -y -q espeak-ng >/dev/null 2>&1 \
    || { $sudo apt-get update -q >/dev/null 2>&1 && $sudo apt-get install -y -q espeak-ng >/dev/null 2>&1; }
  command -v espeak-ng >/dev/null 2>&1 && exit 0
fi
echo "espeak-ng not found: install it to use --dataset speech-synth (the speech tests that need it are skipped)." >&2
exit 1
