# Runs as the guest's first process inside the shared root: sets up what a host with an RDMA NIC
# has (the kernel's verbs stack, a RoCE device on eth0), runs the job, records its exit status.
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/shm /dev/pts && mount -t tmpfs shm /dev/shm && mount -t devpts pts /dev/pts
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    monkeytree.repo=*) repo="${arg#*=}" ;;
    monkeytree.cache=*) cache="${arg#*=}" ;;
    monkeytree.modules=*) modules="${arg#*=}" ;;
  esac
done
# The guest's own /tmp and /run; a checkout or cache that lives under them on the host stays
# visible through a bind mount of the shared root.
mount -t tmpfs run /run
mkdir -p /run/host && mount --bind / /run/host
mount -t tmpfs tmp /tmp
for dir in "$repo" "$cache"; do
  case "$dir" in /tmp/* | /run/*) mkdir -p "$dir" && mount --bind "/run/host$dir" "$dir" ;; esac
done
# The kernel asks for crc32 by name (request_module knows nothing of the unpacked tree).
for module in virtio_net crc32_generic rdma_rxe ib_uverbs; do
  modprobe -d "$modules" "$module" || echo "rdma-vm: cannot load $module"
done
ip link set lo up
# Jumbo frames let soft-RoCE use 4 KiB packets: a quarter of the per-packet work under emulation.
ip link set eth0 mtu 9000 up
ip addr add 10.0.2.15/24 dev eth0
rdma link add rxe0 type rxe netdev eth0 || echo "rdma-vm: cannot create the soft-RoCE device"
ulimit -l unlimited
echo "rdma-vm: RDMA devices: $(ls /sys/class/infiniband 2>/dev/null || echo none); running the job"
# Through a pipe, so that test runners see no terminal and print plain logs.
bash -c 'set -o pipefail; sh "$1" 2>&1 | cat' job "$cache/job.sh"
echo "$?" >"$cache/status"
sync
busybox poweroff -f
