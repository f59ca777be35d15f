import { randomInt, randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { createServer } from "node:net";

/** The first port of the kernel's ephemeral range, which binds to port 0 and outgoing connections take from. */
function ephemeralStart(): number {
  try {
    return Number(readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0]);
  } catch {
    return 32768;
  }
}

/** Whether a listener on every address can have `port` now. */
function bindable(port: number): Promise<boolean> {
  const server = createServer();
  return new Promise((resolve) => {
    server.once("error", () => resolve(false));
    server.listen(port, () => server.close(() => resolve(true)));
  });
}

/**
 * A TCP port nothing listens on right now, for a process that binds it later (a test's torchrun
 * or controller). It lies below the ephemeral range: a port from that range, once free, may
 * go to any connection this machine opens before the process binds it, which on a busy host
 * (several launchers, their training processes' connections) happens within the second torchrun
 * takes to start. Below it, only another explicit bind can take it.
 */
export async function freePort(): Promise<number> {
  const end = ephemeralStart();
  // Clear of well-known services; a machine whose ephemeral range starts lower gets any port.
  const [low, high] = end > 11_000 ? [10_000, end] : [1_024, 65_536];
  for (;;) {
    const port = randomInt(low, high);
    if (await bindable(port)) return port;
  }
}

/**
 * torchrun arguments for a one-node job whose rendezvous store listens on a port of its own.
 * `--standalone` picks a port of its own, which two runs on one machine (two test files, or a
 * test beside another user's job) may race for.
 */
export async function localRendezvous(): Promise<string[]> {
  return ["--nnodes=1", "--rdzv_backend=c10d", `--rdzv_endpoint=127.0.0.1:${await freePort()}`, `--rdzv_id=${randomUUID()}`];
}
