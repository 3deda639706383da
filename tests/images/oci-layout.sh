#!/bin/sh
# Make an OCI image layout of one gzip layer from a root filesystem directory:
#   oci-layout.sh ROOTFS OUT_DIR TAG
# (The tests' base image: a debootstrap'd Debian, no registry or Docker needed.)
set -eu
rootfs=$1 out=$2 tag=$3
mkdir -p "$out/blobs/sha256"
tmp=$(mktemp -d "$out/.tmp.XXXXXX")
tar -C "$rootfs" --numeric-owner --xattrs -cf - . | gzip -1 > "$tmp/layer"
diffid=$(gzip -dc "$tmp/layer" | sha256sum | cut -d' ' -f1)
layer=$(sha256sum "$tmp/layer" | cut -d' ' -f1)
lsize=$(stat -c %s "$tmp/layer")
mv "$tmp/layer" "$out/blobs/sha256/$layer"
printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' "$diffid" > "$tmp/config"
config=$(sha256sum "$tmp/config" | cut -d' ' -f1)
csize=$(stat -c %s "$tmp/config")
mv "$tmp/config" "$out/blobs/sha256/$config"
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' "$config" "$csize" "$layer" "$lsize" > "$tmp/manifest"
manifest=$(sha256sum "$tmp/manifest" | cut -d' ' -f1)
msize=$(stat -c %s "$tmp/manifest")
mv "$tmp/manifest" "$out/blobs/sha256/$manifest"
printf '{"imageLayoutVersion":"1.0.0"}' > "$out/oci-layout"
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"org.opencontainers.image.ref.name":"%s"}}]}' "$manifest" "$msize" "$tag" > "$out/index.json"
rmdir "$tmp"
echo "sha256:$manifest"
