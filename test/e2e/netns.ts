import { spawnSync } from "node:child_process";

/**
 * Emulated hosts for end-to-end tests: one network namespace per host, each joined to a bridge
 * in the test's own namespace by a veth pair whose inner end is `eth0`. Host h gets
 * `10.<net>.0.<h+1>`; the bridge (where the controller listens) `10.<net>.0.254`.
 */
export interface Hosts {
  readonly bridgeAddress: string;
  address(host: number): string;
  /** Prefix that runs a command inside host h's namespace. */
  exec(host: number): string[];
  /** Host h's namespace, as `ip netns` names it. */
  namespace(host: number): string;
  /** Takes host h's link to the bridge down (cut off from every other host) or up again. */
  link(host: number, state: "up" | "down"): void;
  /**
   * SIGKILLs every process inside the hosts' namespaces: the replacements their daemons started
   * run in process groups of their own and outlive the daemons, as they must on a real host.
   */
  killAll(): void;
  remove(): void;
}

function ip(...args: string[]): void {
  const run = spawnSync("ip", args, { encoding: "utf8" });
  if (run.status !== 0) throw new Error(`ip ${args.join(" ")}: ${run.stderr.trim() || run.error?.message}`);
}

function alive(pid: number): boolean {
  if (pid === process.pid) return false; // a leftover of an earlier process that had our pid
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

function killNamespace(ns: string): void {
  const pids = spawnSync("ip", ["netns", "pids", ns], { encoding: "utf8" }).stdout ?? "";
  for (const pid of pids.split(/\s+/).filter(Boolean)) {
    try {
      process.kill(Number(pid), "SIGKILL");
    } catch {
      // Already gone.
    }
  }
}

/**
 * Removes the hosts of test processes that were killed before their cleanup ran (tag `mt<pid>`
 * with the pid gone): their processes, namespaces and bridge. A leftover bridge still holds its
 * subnet, and a run that reused it would route to the dead run's namespaces.
 */
function removeStale(): void {
  const namespaces = spawnSync("ip", ["netns", "list"], { encoding: "utf8" }).stdout ?? "";
  for (const [, ns, pid] of namespaces.matchAll(/^(mt(\d+)h\d+)\b/gm) as IterableIterator<[string, string, string]>) {
    if (alive(Number(pid))) continue;
    killNamespace(ns);
    spawnSync("ip", ["netns", "del", ns]);
  }
  const links = spawnSync("ip", ["-o", "link", "show", "type", "bridge"], { encoding: "utf8" }).stdout ?? "";
  for (const [, bridge, pid] of links.matchAll(/^\d+: (mt(\d+)br)[:@]/gm) as IterableIterator<[string, string, string]>) {
    if (!alive(Number(pid))) spawnSync("ip", ["link", "del", bridge]);
  }
}

/** A 10.N.0.0/24 no interface of this namespace uses, starting from one derived from the pid. */
function freeNet(): number {
  const addresses = spawnSync("ip", ["-o", "-4", "addr", "show"], { encoding: "utf8" }).stdout ?? "";
  const used = new Set([...addresses.matchAll(/inet 10\.(\d+)\./g)].map((m) => Number(m[1])));
  for (let i = 0; i < 100; i++) {
    const net = 100 + ((process.pid + i) % 100);
    if (!used.has(net)) return net;
  }
  throw new Error("no free 10.N.0.0/24 between 10.100 and 10.199 for the emulated hosts' bridge");
}

export function createHosts(count: number): Hosts {
  removeStale();
  // Names unique to this process (the pid has at most 7 digits), within 15-character interface names.
  const tag = `mt${process.pid}`;
  const net = freeNet();
  const bridge = `${tag}br`;
  const ns = (h: number) => `${tag}h${h}`;
  const hosts: Hosts = {
    bridgeAddress: `10.${net}.0.254`,
    address: (h) => `10.${net}.0.${h + 1}`,
    exec: (h) => ["ip", "netns", "exec", ns(h)],
    namespace: ns,
    link: (h, state) => ip("link", "set", `${tag}v${h}`, state),
    killAll() {
      for (let h = 0; h < count; h++) killNamespace(ns(h));
    },
    remove() {
      hosts.killAll();
      for (let h = 0; h < count; h++) spawnSync("ip", ["netns", "del", ns(h)]);
      spawnSync("ip", ["link", "del", bridge]);
    },
  };
  try {
    ip("link", "add", bridge, "type", "bridge");
    ip("addr", "add", `${hosts.bridgeAddress}/24`, "dev", bridge);
    ip("link", "set", bridge, "up");
    for (let h = 0; h < count; h++) {
      ip("netns", "add", ns(h));
      ip("link", "add", `${tag}v${h}`, "type", "veth", "peer", "name", `${tag}p${h}`);
      ip("link", "set", `${tag}v${h}`, "master", bridge, "up");
      ip("link", "set", `${tag}p${h}`, "netns", ns(h));
      ip("-n", ns(h), "link", "set", `${tag}p${h}`, "name", "eth0");
      ip("-n", ns(h), "addr", "add", `${hosts.address(h)}/24`, "dev", "eth0");
      ip("-n", ns(h), "link", "set", "eth0", "up");
      ip("-n", ns(h), "link", "set", "lo", "up");
    }
  } catch (error) {
    hosts.remove();
    throw error;
  }
  return hosts;
}
