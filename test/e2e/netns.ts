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

export function createHosts(count: number): Hosts {
  // Names unique to this process, short enough for 15-character interface names.
  const tag = `mt${process.pid % 100_000}`;
  const net = 100 + (process.pid % 100);
  const bridge = `${tag}br`;
  const ns = (h: number) => `${tag}h${h}`;
  const hosts: Hosts = {
    bridgeAddress: `10.${net}.0.254`,
    address: (h) => `10.${net}.0.${h + 1}`,
    exec: (h) => ["ip", "netns", "exec", ns(h)],
    killAll() {
      for (let h = 0; h < count; h++) {
        const pids = spawnSync("ip", ["netns", "pids", ns(h)], { encoding: "utf8" }).stdout ?? "";
        for (const pid of pids.split(/\s+/).filter(Boolean)) {
          try {
            process.kill(Number(pid), "SIGKILL");
          } catch {
            // Already gone.
          }
        }
      }
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
