{{- /*
HAMi-core (libvgpu.so, the in-container limiter) on each GPU node: the node agent's initContainer copies
it from HAMi's own published image into <hookPath>/vgpu on the host. HAMi-core carries no license file,
so this chart ships no copy of it: the image named in nodeAgent.hamiCore.image is pulled by the user's
cluster at install time (docs/install.md, "In-container limits").
*/ -}}

{{- /* The initContainer runs at all: a hookPath to install into and the copy not turned off. */ -}}
{{- define "hami.hamiCore.install" -}}
{{- if and .Values.nodeAgent.hookPath .Values.nodeAgent.hamiCore.enabled }}true{{ end -}}
{{- end -}}

{{- /* registry/repository:tag, with @digest when one is pinned (then the digest is what is pulled). */ -}}
{{- define "hami.hamiCore.image" -}}
{{- $image := .Values.nodeAgent.hamiCore.image -}}
{{- $ref := printf "%s:%s" $image.repository (toString $image.tag) -}}
{{- with $image.registry }}{{ $ref = printf "%s/%s" . $ref }}{{ end -}}
{{- with $image.digest }}{{ $ref = printf "%s@%s" $ref . }}{{ end -}}
{{- $ref -}}
{{- end -}}

{{- /*
The install script, run as `sh -c SCRIPT hami-core-install SOURCE DEST`: SOURCE is a path (a glob) in
the image that must match exactly one file, DEST is <hookPath>/vgpu, mounted at its host path. Nothing
is written in place: each file is written under a temporary name in DEST itself (same filesystem),
flushed, then renamed over its target. rename(2) swaps the name in one step, so a reader sees the old
file or the new one, never a part; containers already running keep the inode kubelet bind-mounted into
them, untouched. Temporary files left by a run that was killed are removed first (one agent pod per
node, so no other run is writing them). The library goes first, so ld.so.preload never names a missing file; ld.so.preload
names the library at its path inside GPU containers, which is its host path (nodeagent/allocate_rules.py).
*/ -}}
{{- define "hami.hamiCore.script" -}}
set -eu
dest="${2%/}"
pattern="$1"
set -- $pattern
if [ "$#" -ne 1 ] || [ ! -f "$1" ]; then
  echo "hami-core: expected exactly one file matching $pattern in the image, found: $*" >&2
  exit 1
fi
for target in "$dest/libvgpu.so" "$dest/ld.so.preload"; do
  if [ -d "$target" ]; then
    echo "hami-core: $target is a directory; refusing to replace it" >&2
    exit 1
  fi
done
rm -f "$dest"/.libvgpu.so.tmp.* "$dest"/.ld.so.preload.tmp.*
lib_tmp="$dest/.libvgpu.so.tmp.$$"
preload_tmp="$dest/.ld.so.preload.tmp.$$"
trap 'rm -f "$lib_tmp" "$preload_tmp"' EXIT
cp "$1" "$lib_tmp"
chmod 0755 "$lib_tmp"
printf '%s/libvgpu.so\n' "$dest" > "$preload_tmp"
chmod 0644 "$preload_tmp"
sync "$lib_tmp" "$preload_tmp" 2>/dev/null || sync
mv -f "$lib_tmp" "$dest/libvgpu.so"
mv -f "$preload_tmp" "$dest/ld.so.preload"
sync "$dest" 2>/dev/null || sync
echo "hami-core: installed $1 as $dest/libvgpu.so"
{{- end -}}
