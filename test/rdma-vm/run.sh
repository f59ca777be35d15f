#!/usr/bin/env bash
# Runs a command on a host with an RDMA device: a virtual machine with Debian's kernel and a
# soft-RoCE device (rdma_rxe) on its network interface, whose root file system is this machine's
# own (shared over virtio-9p), so the command sees this checkout, node and the built addon as
# they are here. Usage: test/rdma-vm/run.sh COMMAND [ARG...]   (exit status: the command's)
#
# Needs root, and (Debian) qemu-system-x86 busybox-static kmod cpio ibverbs-providers iproute2;
# the kernel package is downloaded once into $MONKEYTREE_VM_CACHE (default .cache/rdma-vm).
# The guest runs under single-threaded TCG (software emulation): nested KVM hangs in early boot on
# the machines this runs on, and multi-threaded TCG now and then runs code V8 has just compiled on
# another thread before it sees it (node then dies of SIGSEGV). Its two CPUs so take turns on one
# host thread, and `npm run test:rdma` runs test files one at a time: side by side they only
# slowed each other, and the controller's planner thread, at a low priority, waited minutes.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="${MONKEYTREE_VM_CACHE:-$repo/.cache/rdma-vm}"
memory="${MONKEYTREE_VM_MEMORY:-4G}"
say() { printf 'rdma-vm: %s\n' "$*" >&2; }

[ "$#" -gt 0 ] || { say "usage: test/rdma-vm/run.sh COMMAND [ARG...]"; exit 2; }
[ "$(id -u)" = 0 ] || { say "needs root (the guest shares / with passthrough permissions)"; exit 2; }
missing=()
for tool in qemu-system-x86_64 busybox depmod cpio apt-get dpkg-deb; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
[ -e /etc/libibverbs.d/rxe.driver ] || missing+=("librxe (ibverbs-providers)")
if [ "${#missing[@]}" -gt 0 ]; then
  say "missing: ${missing[*]}"
  say "install: apt-get install qemu-system-x86 busybox-static kmod cpio ibverbs-providers iproute2"
  exit 2
fi

# The kernel: Debian's current one, unpacked (not installed) into the cache.
mkdir -p "$cache"
if [ ! -e "$cache/kernel/ready" ]; then
  package="$(apt-cache depends linux-image-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)$/\1/p' | head -1)"
  [ -n "$package" ] || { say "apt-cache knows no linux-image-amd64 (run apt-get update)"; exit 2; }
  say "downloading $package"
  rm -rf "$cache/kernel" && mkdir -p "$cache/kernel"
  # apt warns that root downloads unsandboxed; that is expected here.
  (cd "$cache" && rm -f linux-image-*.deb && { apt-get download -q "$package" 2>&1 | grep -v unsandboxed >&2 || true; })
  deb="$(ls "$cache"/linux-image-*.deb 2>/dev/null | head -1)"
  [ -n "$deb" ] || { say "could not download $package"; exit 2; }
  dpkg-deb -x "$deb" "$cache/kernel" && rm -f "$deb"
  version="$(ls "$cache/kernel/lib/modules")"
  depmod -b "$cache/kernel" "$version"
  touch "$cache/kernel/ready"
fi
version="$(ls "$cache/kernel/lib/modules")"
modules="$cache/kernel/lib/modules/$version/kernel"

# The initramfs only mounts the shared root; everything else happens in guest.sh.
(
  staging="$(mktemp -d)"
  mkdir -p "$staging/bin" "$staging/modules"
  cp "$(command -v busybox)" "$staging/bin/busybox"
  install -m 0755 "$here/init" "$staging/init"
  for module in drivers/virtio/virtio_ring drivers/virtio/virtio drivers/virtio/virtio_pci_legacy_dev \
    drivers/virtio/virtio_pci_modern_dev drivers/virtio/virtio_pci fs/netfs/netfs fs/fscache/fscache \
    net/9p/9pnet net/9p/9pnet_virtio fs/9p/9p; do
    cp "$modules/$module.ko" "$staging/modules/"
  done
  (cd "$staging" && find . | cpio -o -H newc --quiet | gzip -1 >"$cache/initrd.gz")
  rm -rf "$staging"
)

# The job: the command, in this directory, with this environment's PATH.
job="$cache/job.sh"
{
  printf 'export PATH=%q HOME=%q MONKEYTREE_REQUIRE_RDMA=1 CI=%q\n' "$PATH" "${HOME:-/root}" "${CI:-}"
  printf 'cd %q\n' "$PWD"
  printf '%q ' "$@"
  printf '\n'
} >"$job"
rm -f "$cache/status"

say "booting $version (emulated, $memory) to run: $*"
# The guest's serial console is its only output; the firmware and network boot ROM say nothing.
# It is passed on line by line, so a log shows how far a slow run has come.
qemu-system-x86_64 -accel tcg,thread=single -cpu max -smp 2 -m "$memory" -display none -vga none -serial stdio -no-reboot \
  -kernel "$cache/kernel/boot/vmlinuz-$version" -initrd "$cache/initrd.gz" \
  -append "console=ttyS0 quiet loglevel=3 panic=-1 monkeytree.guest=$here/guest.sh monkeytree.repo=$repo monkeytree.cache=$cache monkeytree.modules=$cache/kernel" \
  -fsdev "local,id=root,path=/,security_model=passthrough,multidevs=remap" \
  -device virtio-9p-pci,fsdev=root,mount_tag=hostroot \
  -netdev user,id=net -device virtio-net-pci,netdev=net,romfile= </dev/null | sed -u 's/\r//g'

[ -e "$cache/status" ] || { say "the guest stopped before the command finished (see its console above)"; exit 1; }
exit "$(cat "$cache/status")"
