#!/bin/bash
# Puts OpenCV's example images (Debian package opencv-doc: photos and drawings from 29x29 to
# 1282x1110 pixels, JPEG and PNG, in many aspect ratios) in DEST, for tests that train on a real
# image folder. Uses the installed package when there is one, else downloads it with
# `apt-get download` (no root needed). The images are never committed.
# Usage: fetch_opencv_images.sh DEST
set -euo pipefail
dest=$1
[[ -f $dest/.complete ]] && exit 0
mkdir -p "$(dirname "$dest")"
work=$(mktemp -d "$dest.XXXXXX")
trap 'rm -rf "$work"' EXIT
src=/usr/share/doc/opencv-doc/examples/data
# Containers often drop /usr/share/doc: count what is there before trusting it.
if (( $(ls "$src"/*.jpg 2>/dev/null | wc -l) < 50 )); then
  if ! (cd "$work" && apt-get download opencv-doc > download.log 2>&1); then
    echo "cannot get the Debian package opencv-doc (apt-get download opencv-doc):" >&2
    cat "$work/download.log" >&2
    echo "(run apt-get update first, or install opencv-doc)" >&2
    exit 1
  fi
  dpkg-deb -x "$work"/opencv-doc_*.deb "$work/root"
  src=$work/root/usr/share/doc/opencv-doc/examples/data
fi
mkdir "$work/images"
cp "$src"/*.jpg "$src"/*.png "$work/images/"
touch "$work/images/.complete"
# Tests running at once may both fetch: the first rename wins, the others find DEST complete.
mv -T "$work/images" "$dest" 2> /dev/null || [[ -f $dest/.complete ]]
