#!/usr/bin/env bash
# Fashion-MNIST for the embedded benchmark: Debian's dataset-fashion-mnist package, or say how to provide it.
set -u
dir=/usr/share/datasets/fashion-mnist
[ -f "$dir/train-images-idx3-ubyte.gz" ] && exit 0
[ -n "${FEDL2P_DATA:-}" ] && exit 0
if command -v apt-get >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo="sudo"
  echo "installing Fashion-MNIST (Debian package dataset-fashion-mnist)..."
  $sudo apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 \
    || { $sudo apt-get update -q >/dev/null 2>&1 && $sudo apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1; }
  [ -f "$dir/train-images-idx3-ubyte.gz" ] && exit 0
fi
echo "Fashion-MNIST not found in $dir. Put the four IDX files (train/t10k images/labels, .gz or not) in a folder" >&2
echo "and export FEDL2P_DATA=that/folder (or pass --data-dir to fedl2p partition)." >&2
exit 1
